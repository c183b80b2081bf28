"""SQL of confirmed-mutation receipts: a one-shot claim (-> pending) and one settlement.

    (none) --claim--> pending --settle--> succeeded | failed
                         '--(past the class deadline) an operator settles, with a reason-->

The claim is the mutation's exclusive grant (docs/decisions/operation-class-policy.md,
Decision 5): a second claim of the same (idempotency key, outcome reference) finds the first
receipt. Each function takes the caller's connection and never commits.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from psycopg.types.json import Jsonb

from queue_server.store.sql import load
from queue_server.store.types import Conn, Row

_SQL = load("confirmation_receipts")


async def claim(conn: Conn, *, tenant: str, key: str, ref: str, token: str | None) -> Row | None:
    """(none) -> pending; None when the reference or the key is already claimed."""
    cur = await conn.execute(
        _SQL["claim"], {"tenant": tenant, "ref": ref, "key": key, "token": token}
    )
    return await cur.fetchone()


async def get(conn: Conn, *, tenant: str, ref: str) -> Row | None:
    cur = await conn.execute(_SQL["get"], (tenant, ref))
    return await cur.fetchone()


async def get_by_key(conn: Conn, *, tenant: str, key: str) -> Row | None:
    cur = await conn.execute(_SQL["get_by_key"], (tenant, key))
    return await cur.fetchone()


async def settle(conn: Conn, *, tenant: str, ref: str, status: str, outcome: Any) -> Row | None:
    """pending -> succeeded | failed; None when the receipt is missing or already settled."""
    cur = await conn.execute(
        _SQL["settle"], {"tenant": tenant, "ref": ref, "status": status, "outcome": Jsonb(outcome)}
    )
    return await cur.fetchone()


async def list_pending(
    conn: Conn,
    *,
    tenant: str,
    older_than: timedelta,
    stale_after: timedelta,
    after: tuple[datetime, str] | None,
    limit: int,
) -> list[Row]:
    """Pending receipts claimed at least `older_than` ago, oldest first, after the cursor;
    `stale` says whether each is past `stale_after`."""
    params = {
        "tenant": tenant,
        "older_than": older_than,
        "stale_after": stale_after,
        "after_at": after[0] if after else None,
        "after_ref": after[1] if after else None,
        "limit": limit,
    }
    cur = await conn.execute(_SQL["list_pending"], params)
    return await cur.fetchall()


async def resolve(
    conn: Conn,
    *,
    tenant: str,
    ref: str,
    status: str,
    outcome: Any,
    actor: str,
    reason: str,
    stale_after: timedelta,
) -> Row | None:
    """pending (stale) -> succeeded | failed by an operator; None when not pending or not stale."""
    params = {
        "tenant": tenant,
        "ref": ref,
        "status": status,
        "outcome": Jsonb(outcome),
        "actor": actor,
        "reason": reason,
        "stale_after": stale_after,
    }
    cur = await conn.execute(_SQL["resolve"], params)
    return await cur.fetchone()
