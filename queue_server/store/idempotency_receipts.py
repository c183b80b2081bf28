"""Idempotency receipts: one per (tenant, key), claimed before the effect, filled with its answer."""

from __future__ import annotations

from datetime import timedelta

from psycopg import AsyncCursor

from queue_server.store.sql import load
from queue_server.store.types import Conn, Row

_SQL = load("idempotency_receipts")


async def claim(
    conn: Conn, *, tenant: str, key: str, fingerprint: str, retention: timedelta
) -> bool:
    """True when this transaction now owns the key; False when a finished receipt exists."""
    cur = await conn.execute(
        _SQL["claim"],
        {"tenant": tenant, "key": key, "fingerprint": fingerprint, "retention": retention},
    )
    return await cur.fetchone() is not None


async def start_claim(
    conn: Conn, *, tenant: str, key: str, fingerprint: str, retention: timedelta
) -> AsyncCursor[Row]:
    """Send the claim without waiting for its answer (pipeline mode); see `was_claimed`."""
    return await conn.execute(
        _SQL["claim"],
        {"tenant": tenant, "key": key, "fingerprint": fingerprint, "retention": retention},
    )


async def was_claimed(cursor: AsyncCursor[Row]) -> bool:
    """The answer of a claim sent by `start_claim`."""
    return await cursor.fetchone() is not None


async def get(conn: Conn, *, tenant: str, key: str) -> Row | None:
    cur = await conn.execute(_SQL["get"], (tenant, key))
    return await cur.fetchone()


async def fill(conn: Conn, *, tenant: str, key: str, status: int, body: str) -> None:
    await conn.execute(_SQL["fill"], (status, body, tenant, key))


async def purge_expired(conn: Conn, *, limit: int) -> int:
    """Delete up to `limit` receipts past their retention, oldest first; returns how many."""
    cur = await conn.execute(_SQL["purge_expired"], {"limit": limit})
    return cur.rowcount
