"""The receipt sweeper: drops idempotency receipts past their retention, now and then."""

from __future__ import annotations

import asyncio
import logging

from queue_server import errors
from queue_server.db import Database
from queue_server.store import idempotency_receipts

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
