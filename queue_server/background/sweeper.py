"""The sweeper: background upkeep that every API process runs, one process at a time.

    every SAMPLE_INTERVAL      sample the queue counters, ready items and oldest ready item
                               (the last minute's and hour's rates, the console's charts)
    every PRUNE_INTERVAL       keep each queue's last sample of each 15 minutes for the day's
                               charts; drop samples older than the hour and those older
                               than the day
    every retention_interval   delete finished items past their tenant's retention, with
                               their ledgers, and idempotency receipts past theirs
    every APPROVAL_INTERVAL    write an `approval-expired` event in its queue's ledger for
                               each spend approval whose expiry has passed, with the limit
                               the queue falls to, and log it
    every GRANT_INTERVAL       delete the rate grants older than their queue's interval

and, in loops of their own, every FOLD_INTERVAL the counters' deltas of every ended
transaction are folded into a new base (`fold_forever`, store/counters.py: a reader's cost
is the deltas since the last fold), and verification runs past their deadline end failed
(`sweep_runs_forever`).

Each sweep's first round comes one interval after the process starts (at most a minute
later than a round at the start would), so that processes started together (a deploy, a
failover) do not all sweep at the same moment.

Each batch runs in a transaction that first tries its sweep's advisory lock
(`store.sweeps`): when another process holds it, this one leaves the round to it.
Batches are bounded (`retention_batch` rows), so no transaction holds many locks for
long. Nothing is kept in memory between rounds: after a restart the next round
starts from what the data says.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TypeVar

from queue_server import errors
from queue_server.db import Database
from queue_server.settings import Settings
from queue_server.store import (
    counters,
    idempotency_receipts,
    queues,
    sweeps,
    tenants,
    transitions,
    verification_runs,
)
from queue_server.store.types import Conn

log = logging.getLogger(__name__)

SAMPLE_INTERVAL = 5.0
PRUNE_INTERVAL = 60.0
PRUNE_BATCH = 1000
TENANT_PAGE = 100

# The second key of each sweep's advisory lock.
SAMPLE_LOCK = 1
PRUNE_LOCK = 2
RECEIPT_LOCK = 3
RETENTION_LOCK = 4
FOLD_LOCK = 5
APPROVAL_LOCK = 6
GRANT_LOCK = 7

# How often expired spend approvals are looked for, and at most how many a round ledgers.
APPROVAL_INTERVAL = 5.0
APPROVAL_BATCH = 100
GRANT_INTERVAL = 10.0

# How often the counters' deltas are folded: a reader of the figures or of a backlog reads
# the deltas written since the last fold.
FOLD_INTERVAL = 1.0

T = TypeVar("T")


async def locked_round(db: Database, lock: int, work: Callable[[Conn], Awaitable[T]]) -> T | None:
    """Run `work` in one transaction holding sweep lock `lock`; None when another process
    holds it."""
    async with db.tx() as conn:
        if not await sweeps.try_lock(conn, lock):
            return None
        return await work(conn)


async def sample_counters(db: Database, *, min_gap: float = SAMPLE_INTERVAL - 1) -> int | None:
    """Sample every queue whose totals, ready items or oldest ready item changed since its
    last sample."""
    gap = timedelta(seconds=max(min_gap, 0))
    return await locked_round(db, SAMPLE_LOCK, lambda conn: queues.sample(conn, min_gap=gap))


async def fold_counters(db: Database) -> counters.Fold | None:
    """Fold the counters' deltas into a new base; None when another process is at it."""
    return await locked_round(db, FOLD_LOCK, counters.fold)


async def fold_forever(db: Database, interval: float = FOLD_INTERVAL) -> None:
    """Fold the counters every `interval` seconds until cancelled, apart from the other
    sweeps (a long retention round does not hold the fold back)."""
    while True:
        await asyncio.sleep(interval)
        try:
            await fold_counters(db)
        except errors.QueueServerError as exc:
            log.warning("sweeper: could not fold the counters: %s", exc.detail)


async def prune_samples(db: Database) -> int:
    """Drop samples no rate needs any more, a batch per transaction, until none is left."""
    total = 0
    while True:
        done = await locked_round(
            db, PRUNE_LOCK, lambda c: queues.prune_samples(c, limit=PRUNE_BATCH)
        )
        total += done or 0
        if not done or done < PRUNE_BATCH:
            return total


async def roll_up_samples(db: Database) -> int | None:
    """Keep each queue's last sample of each ended 15-minute bucket for the day's charts;
    None when another process is at it."""
    return await locked_round(db, PRUNE_LOCK, queues.roll_up)


async def prune_day_samples(db: Database) -> int:
    """Drop day samples no chart needs any more, a batch per transaction."""
    total = 0
    while True:
        done = await locked_round(
            db, PRUNE_LOCK, lambda c: queues.prune_day_samples(c, limit=PRUNE_BATCH)
        )
        total += done or 0
        if not done or done < PRUNE_BATCH:
            return total


async def tend_samples(db: Database) -> None:
    """The day's samples first (from samples still kept), then both prunes."""
    await roll_up_samples(db)
    await prune_samples(db)
    await prune_day_samples(db)


async def purge_receipts(db: Database, *, batch: int) -> int | None:
    """Delete the receipts past their retention, a batch per transaction; None when another
    process is at it."""
    total = 0
    while True:
        done = await locked_round(
            db, RECEIPT_LOCK, lambda c: idempotency_receipts.purge_expired(c, limit=batch)
        )
        if done is None:
            return None if total == 0 else total
        total += done
        if done < batch:
            return total


async def _purge_range(db: Database, tenant: str, state: str, queue: str, batch: int) -> int | None:
    """Walk one (state, queue) range of the tenant from its start, a batch per transaction;
    how many items went, or None as soon as another process holds the round."""
    deleted = 0
    position: tuple[str, str] | None = None
    while True:
        done = await locked_round(
            db,
            RETENTION_LOCK,
            functools.partial(
                transitions.purge_finished,
                tenant=tenant,
                state=state,
                queue=queue,
                after=position,
                limit=batch,
            ),
        )
        if done is None:
            return None
        deleted += done.deleted
        if done.scanned < batch or done.last is None:
            return deleted
        position = done.last


async def purge_finished(db: Database, *, batch: int) -> int | None:
    """One retention round over every tenant: delete its completed and cancelled items
    past its retention with their ledgers, at most `batch` index entries per transaction.
    Returns how many items went; None when another process held the round from the start
    (a process that finds it taken over midway leaves the rest to that one)."""
    total = 0
    after_tenant: str | None = None
    while True:
        async with db.conn() as conn:
            page = await tenants.list_tenants(conn, after=after_tenant, limit=TENANT_PAGE)
        for row in page:
            tenant = row["tenant_id"]
            async with db.conn() as conn:
                ranges = await transitions.finished_queues(conn, tenant=tenant)
            for state, queue in ranges:
                deleted = await _purge_range(db, tenant, state, queue, batch)
                if deleted is None:
                    return total or None
                total += deleted
        if len(page) < TENANT_PAGE:
            return total
        after_tenant = page[-1]["tenant_id"]


async def ledger_expired_approvals(
    db: Database, limits: Callable[[], tuple[int, int | None]]
) -> int | None:
    """One round: each spend approval expired since the last, in its queue's ledger and the
    log (`limits`: the policy's base concurrency and max-approved, as the acquire holds
    them now). None when another process has the round."""

    async def work(conn: Conn) -> int:
        base_limit, max_approved = limits()
        rows = await queues.ledger_expired_approvals(
            conn, base_limit=base_limit, max_approved=max_approved, limit=APPROVAL_BATCH
        )
        for row in rows:
            log.warning(
                "spend approval %s of queue %s/%s expired: the queue now leases at most %s"
                " at a time",
                row["approval_id"],
                row["tenant_id"],
                row["queue"],
                row["limit"],
            )
        return len(rows)

    return await locked_round(db, APPROVAL_LOCK, work)


async def purge_rate_grants(db: Database, batch: int) -> int | None:
    """One round: the rate grants no window reads any more, a batch at a time. None when
    another process has the round."""

    async def work(conn: Conn) -> int:
        return await queues.purge_rate_grants(conn, limit=batch)

    total = 0
    while True:
        deleted = await locked_round(db, GRANT_LOCK, work)
        if deleted is None:
            return total or None
        total += deleted
        if deleted < batch:
            return total


@dataclass
class _Job:
    """A sweep and its interval; its first round comes one interval after the start."""

    name: str
    interval: float
    run: Callable[[], Awaitable[object]]
    due: float = field(init=False)

    def __post_init__(self) -> None:
        self.due = time.monotonic() + self.interval


async def sweep_forever(
    db: Database, settings: Settings, limits: Callable[[], tuple[int, int | None]]
) -> None:
    """Run every sweep at its interval until cancelled; a failed round is logged and tried
    again at the next interval. `limits`: the loaded policy's base concurrency and
    max-approved, read at each round (a published policy may change them)."""
    batch = settings.retention_batch
    jobs = [
        _Job(
            "ledger expired spend approvals",
            APPROVAL_INTERVAL,
            lambda: ledger_expired_approvals(db, limits),
        ),
        _Job("sample queue counters", SAMPLE_INTERVAL, lambda: sample_counters(db)),
        _Job(
            "delete rate grants past their interval",
            GRANT_INTERVAL,
            lambda: purge_rate_grants(db, batch),
        ),
        _Job("roll up and prune counter samples", PRUNE_INTERVAL, lambda: tend_samples(db)),
        _Job(
            "delete finished items past their retention",
            settings.retention_interval,
            lambda: purge_finished(db, batch=batch),
        ),
        _Job(
            "delete receipts past their retention",
            settings.retention_interval,
            lambda: purge_receipts(db, batch=batch),
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
