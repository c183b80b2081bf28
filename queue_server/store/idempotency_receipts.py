"""Idempotency receipts: one per (tenant, key), claimed before the effect, filled with its answer."""

from __future__ import annotations

from datetime import timedelta

from psycopg import AsyncCursor

from queue_server.store.sql import Statements
from queue_server.store.types import Conn, Row

_SQL = Statements(__name__)

# ON CONFLICT waits while another transaction holds an uncommitted receipt with
# this key, then sees its outcome: concurrent same-key requests make one effect.
_CLAIM = _SQL(
    "claim",
    """
INSERT INTO idempotency_receipts
    (tenant_id, idempotency_key, fingerprint, response_status, response_body, expires_at)
VALUES (%(tenant)s, %(key)s, %(fingerprint)s, 0, '', statement_timestamp() + %(retention)s)
ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
RETURNING 1 AS claimed
""",
)


async def claim(
    conn: Conn, *, tenant: str, key: str, fingerprint: str, retention: timedelta
) -> bool:
    """True when this transaction now owns the key; False when a finished receipt exists."""
    cur = await conn.execute(
        _CLAIM, {"tenant": tenant, "key": key, "fingerprint": fingerprint, "retention": retention}
    )
    return await cur.fetchone() is not None


async def start_claim(
    conn: Conn, *, tenant: str, key: str, fingerprint: str, retention: timedelta
) -> AsyncCursor[Row]:
    """Send the claim without waiting for its answer (pipeline mode); see `was_claimed`."""
    return await conn.execute(
        _CLAIM, {"tenant": tenant, "key": key, "fingerprint": fingerprint, "retention": retention}
    )


async def was_claimed(cursor: AsyncCursor[Row]) -> bool:
    """The answer of a claim sent by `start_claim`."""
    return await cursor.fetchone() is not None


_GET = _SQL(
    "get",
    "SELECT * FROM idempotency_receipts WHERE tenant_id = %s AND idempotency_key = %s",
)


async def get(conn: Conn, *, tenant: str, key: str) -> Row | None:
    cur = await conn.execute(_GET, (tenant, key))
    return await cur.fetchone()


_FILL = _SQL(
    "fill",
    "UPDATE idempotency_receipts SET response_status = %s, response_body = %s"
    " WHERE tenant_id = %s AND idempotency_key = %s",
)


async def fill(conn: Conn, *, tenant: str, key: str, status: int, body: str) -> None:
    await conn.execute(_FILL, (status, body, tenant, key))


# Oldest first, a batch at a time (ix_idempotency_receipts_expires_at): short transactions.
_PURGE_EXPIRED = _SQL(
    "purge_expired",
    """
DELETE FROM idempotency_receipts r
USING (SELECT tenant_id, idempotency_key FROM idempotency_receipts
       WHERE expires_at < statement_timestamp()
       ORDER BY expires_at LIMIT %(limit)s) AS spent
WHERE r.tenant_id = spent.tenant_id AND r.idempotency_key = spent.idempotency_key
""",
)


async def purge_expired(conn: Conn, *, limit: int) -> int:
    """Delete up to `limit` receipts past their retention, oldest first; returns how many."""
    cur = await conn.execute(_PURGE_EXPIRED, {"limit": limit})
    return cur.rowcount
