"""Dead letters: pages, one letter, and the locks that pin a letter before it is resolved.

The statements that change a dead letter (replay, discard) live in
`store/transitions.py` beside every other change to a work item. The reads here
that lock (`lock_for_resolution`, `open_for_queue`) only pin rows so that the
transition that follows sees exactly what was checked.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from queue_server.store.sql import load
from queue_server.store.types import Conn, Row

_SQL = load("dead_letters")

# Open dead letters read the partial index ix_dead_letters_open in this order.
_LIST_PAGE = {
    "open": _SQL["list_page_open"],
    "closed": _SQL["list_page_closed"],
    "all": _SQL["list_page_all"],
}


async def list_page(
    conn: Conn,
    *,
    tenant: str,
    queue: str | None,
    kind: str | None,
    status: str,
    after: tuple[datetime, str] | None,
    limit: int,
) -> list[Row]:
    """One page in (created_at, dead_letter_id) order, starting after the cursor's position."""
    params: dict[str, Any] = {
        "tenant": tenant,
        "queue": queue,
        "kind": kind,
        "after_at": after[0] if after else None,
        "after_id": after[1] if after else None,
        "limit": limit,
    }
    cur = await conn.execute(_LIST_PAGE[status], params)
    return await cur.fetchall()


async def latest_for_delivery(conn: Conn, *, tenant: str, delivery_id: str) -> Row | None:
    """The dead letter of a webhook delivery: the open one, else the latest closed one."""
    cur = await conn.execute(_SQL["latest_for_delivery"], (tenant, delivery_id))
    return await cur.fetchone()


async def open_for_item(conn: Conn, *, tenant: str, item_id: str) -> Row | None:
    """The item's open dead letter, if it has one."""
    cur = await conn.execute(_SQL["open_for_item"], (tenant, item_id))
    return await cur.fetchone()


async def get(conn: Conn, *, tenant: str, dead_letter_id: str) -> Row | None:
    cur = await conn.execute(_SQL["get"], (tenant, dead_letter_id))
    return await cur.fetchone()


async def lock_for_resolution(conn: Conn, *, tenant: str, dead_letter_id: str) -> Row | None:
    """The dead letter and its item's state, both row-locked until the transaction ends.

    Replay and discard check these facts first, so a refusal changes nothing:
    their statements close the dead letter and change the item together.
    """
    params = {"tenant": tenant, "dead_letter_id": dead_letter_id}
    cur = await conn.execute(_SQL["lock_for_resolution"], params)
    row = await cur.fetchone()
    if row is None or row["item_id"] is None:
        return row
    cur = await conn.execute(_SQL["lock_item"], {"tenant": tenant, "item_id": row["item_id"]})
    item = await cur.fetchone()
    row["item_state"] = item["state"] if item else None
    return row


async def open_for_queue(conn: Conn, *, tenant: str, queue: str, limit: int) -> list[Row]:
    """The queue's oldest open item dead letters, locked, at most `limit`."""
    cur = await conn.execute(
        _SQL["open_for_queue"], {"tenant": tenant, "queue": queue, "limit": limit}
    )
    return await cur.fetchall()


async def count_open(conn: Conn, *, tenant: str, queue: str | None = None) -> int:
    cur = await conn.execute(_SQL["count_open"], (tenant, queue, queue))
    row = await cur.fetchone()
    return int(row["n"]) if row else 0
