"""Sweepers: idempotency receipts past their retention, verification runs past their deadline."""

from __future__ import annotations

import asyncio
import logging

from queue_server import errors
from queue_server.db import Database
from queue_server.store import idempotency_receipts, verification_runs

log = logging.getLogger(__name__)

RECEIPT_PURGE_INTERVAL = 600.0


async def purge_receipts(db: Database) -> int:
    """Delete every expired receipt; returns how many."""
    async with db.tx() as conn:
        return await idempotency_receipts.purge_expired(conn)


async def sweep_receipts_forever(db: Database, interval: float = RECEIPT_PURGE_INTERVAL) -> None:
    """Purge expired receipts every `interval` seconds until cancelled."""
    while True:
        await asyncio.sleep(interval)
        try:
            await purge_receipts(db)
        except errors.QueueServerError as exc:
            log.warning("could not purge expired receipts: %s", exc.detail)


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
