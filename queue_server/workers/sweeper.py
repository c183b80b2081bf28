"""The sweeper: background upkeep that every API process runs, one process at a time.

    every SAMPLE_INTERVAL   sample the queue counters (the last minute's and hour's rates)
    every PRUNE_INTERVAL    drop samples older than the hour, in batches
    every RECEIPT_PURGE_INTERVAL   drop idempotency receipts past their retention

and, in a loop of its own (`sweep_runs_forever`), verification runs past their deadline end
failed.

Each sweep runs in a transaction that first tries the sweep's advisory lock
(`store.sweeps`): when another process holds it, this one skips the round. Nothing
is kept in memory between rounds, so a restart resumes where the data stands.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta

from queue_server import errors
from queue_server.db import Database
from queue_server.store import idempotency_receipts, queues, sweeps, verification_runs
from queue_server.store.types import Conn

log = logging.getLogger(__name__)

SAMPLE_INTERVAL = 5.0
PRUNE_INTERVAL = 60.0
RECEIPT_PURGE_INTERVAL = 600.0
# Rows one sweep transaction deletes at most: short transactions, short row locks.
BATCH = 1000

# The second key of each sweep's advisory lock.
SAMPLE_LOCK = 1
PRUNE_LOCK = 2
RECEIPT_LOCK = 3


async def locked_round(
    db: Database, lock: int, work: Callable[[Conn], Awaitable[int]]
) -> int | None:
    """Run `work` in one transaction holding sweep lock `lock`; None when another process
    holds it. Returns what `work` returned (rows handled)."""
    async with db.tx() as conn:
        if not await sweeps.try_lock(conn, lock):
            return None
        return await work(conn)


async def sample_counters(db: Database, *, min_gap: float = SAMPLE_INTERVAL - 1) -> int | None:
    """Sample the totals of every queue whose counters moved since its last sample."""
    gap = timedelta(seconds=max(min_gap, 0))
    return await locked_round(db, SAMPLE_LOCK, lambda conn: queues.sample(conn, min_gap=gap))


async def prune_samples(db: Database) -> int:
    """Drop samples no rate needs any more, a batch per transaction, until none is left."""
    total = 0
    while True:
        done = await locked_round(db, PRUNE_LOCK, lambda c: queues.prune_samples(c, limit=BATCH))
        total += done or 0
        if not done or done < BATCH:
            return total


async def purge_receipts(db: Database) -> int:
    """Delete every expired receipt; returns how many."""
    async with db.tx() as conn:
        return await idempotency_receipts.purge_expired(conn)


@dataclass
class _Job:
    name: str
    interval: float
    run: Callable[[], Awaitable[object]]
    due: float = 0.0


async def sweep_forever(db: Database, *, sample_interval: float = SAMPLE_INTERVAL) -> None:
    """Run every sweep at its interval until cancelled; a failed round is logged and retried
    at the next interval."""
    now = time.monotonic()
    jobs = [
        _Job("sample queue counters", sample_interval, lambda: sample_counters(db), now),
        _Job("prune counter samples", PRUNE_INTERVAL, lambda: prune_samples(db), now),
        _Job(
            "purge expired receipts",
            RECEIPT_PURGE_INTERVAL,
            lambda: purge_receipts(db),
            now + RECEIPT_PURGE_INTERVAL,
        ),
    ]
    while True:
        job = min(jobs, key=lambda j: j.due)
        await asyncio.sleep(max(0.0, job.due - time.monotonic()))
        try:
            await job.run()
        except errors.QueueServerError as exc:
            log.warning("sweeper: could not %s: %s", job.name, exc.detail)
        job.due = time.monotonic() + job.interval


RUN_SWEEP_INTERVAL = 10.0


async def fail_overdue_runs(db: Database) -> int:
    """Every verification run still running past its deadline ends failed; returns how many."""
    async with db.tx() as conn:
        return len(await verification_runs.fail_every_overdue(conn))


async def sweep_runs_forever(db: Database, interval: float = RUN_SWEEP_INTERVAL) -> None:
    """Apply the verification-run deadline every `interval` seconds until cancelled (a run
    nobody touches again still ends at its deadline)."""
    while True:
        await asyncio.sleep(interval)
        try:
            failed = await fail_overdue_runs(db)
        except errors.QueueServerError as exc:
            log.warning("could not end overdue verification runs: %s", exc.detail)
        else:
            if failed:
                log.info("%d verification run(s) failed: deadline exceeded", failed)
