"""Dead letters: pages, one letter, and the locks that pin a letter before it is resolved.

The statements that change a dead letter (replay, discard) live in
`store/transitions.py` beside every other change to a work item. The reads here
that lock (`lock_for_resolution`, `open_for_queue`) only pin rows so that the
transition that follows sees exactly what was checked.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from queue_server.store.sql import Statements
from queue_server.store.types import Conn, Row

_SQL = Statements(__name__)

_COLUMNS = (
    "dead_letter_id, kind, item_id, delivery_id, queue, reason, last_failure,"
    " created_at, closed_at, resolution"
)

_STATUS_FILTER = {
    "open": "closed_at IS NULL",
    "closed": "closed_at IS NOT NULL",
    "all": "true",
}


def _list_page(status: str, status_filter: str) -> str:
    # Open dead letters read the partial index ix_dead_letters_open in this order.
    return _SQL(
        f"list_page_{status}",
        f"""
SELECT {_COLUMNS} FROM dead_letters
WHERE tenant_id = %(tenant)s AND {status_filter}
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s)
  AND (%(after_at)s::timestamptz IS NULL
       OR (created_at, dead_letter_id) > (%(after_at)s, %(after_id)s::uuid))
ORDER BY created_at, dead_letter_id
LIMIT %(limit)s
""",
    )


_LIST_PAGE = {status: _list_page(status, where) for status, where in _STATUS_FILTER.items()}


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


_LATEST_FOR_DELIVERY = _SQL(
    "latest_for_delivery",
    f"""
SELECT {_COLUMNS} FROM dead_letters WHERE tenant_id = %s AND delivery_id = %s
ORDER BY closed_at IS NULL DESC, created_at DESC LIMIT 1
""",
)


async def latest_for_delivery(conn: Conn, *, tenant: str, delivery_id: str) -> Row | None:
    """The dead letter of a webhook delivery: the open one, else the latest closed one."""
    cur = await conn.execute(_LATEST_FOR_DELIVERY, (tenant, delivery_id))
    return await cur.fetchone()


_GET = _SQL(
    "get",
    f"SELECT {_COLUMNS} FROM dead_letters WHERE tenant_id = %s AND dead_letter_id = %s",
)


async def get(conn: Conn, *, tenant: str, dead_letter_id: str) -> Row | None:
    cur = await conn.execute(_GET, (tenant, dead_letter_id))
    return await cur.fetchone()


_LOCK_FOR_RESOLUTION = _SQL(
    "lock_for_resolution",
    f"""
SELECT {", ".join("d." + c.strip() for c in _COLUMNS.split(","))},
       w.state::text AS item_state
FROM dead_letters d
LEFT JOIN work_items w ON w.tenant_id = d.tenant_id AND w.item_id = d.item_id
WHERE d.tenant_id = %(tenant)s AND d.dead_letter_id = %(dead_letter_id)s
FOR UPDATE OF d
""",
)

_LOCK_ITEM = _SQL(
    "lock_item",
    """
SELECT state::text AS state FROM work_items
WHERE tenant_id = %(tenant)s AND item_id = %(item_id)s
FOR UPDATE
""",
)


async def lock_for_resolution(conn: Conn, *, tenant: str, dead_letter_id: str) -> Row | None:
    """The dead letter and its item's state, both row-locked until the transaction ends.

    Replay and discard check these facts first, so a refusal changes nothing:
    their statements close the dead letter and change the item together.
    """
    params = {"tenant": tenant, "dead_letter_id": dead_letter_id}
    cur = await conn.execute(_LOCK_FOR_RESOLUTION, params)
    row = await cur.fetchone()
    if row is None or row["item_id"] is None:
        return row
    cur = await conn.execute(_LOCK_ITEM, {"tenant": tenant, "item_id": row["item_id"]})
    item = await cur.fetchone()
    row["item_state"] = item["state"] if item else None
    return row


_OPEN_FOR_QUEUE = _SQL(
    "open_for_queue",
    f"""
SELECT {_COLUMNS} FROM dead_letters
WHERE tenant_id = %(tenant)s AND queue = %(queue)s AND kind = 'item' AND closed_at IS NULL
ORDER BY created_at, dead_letter_id
LIMIT %(limit)s
-- SKIP LOCKED: a dead letter another operator is resolving right now is theirs.
FOR UPDATE SKIP LOCKED
""",
)


async def open_for_queue(conn: Conn, *, tenant: str, queue: str, limit: int) -> list[Row]:
    """The queue's oldest open item dead letters, locked, at most `limit`."""
    cur = await conn.execute(_OPEN_FOR_QUEUE, {"tenant": tenant, "queue": queue, "limit": limit})
    return await cur.fetchall()


_COUNT_OPEN = _SQL(
    "count_open",
    "SELECT count(*) AS n FROM dead_letters WHERE tenant_id = %s AND closed_at IS NULL"
    " AND (%s::text IS NULL OR queue = %s)",
)


async def count_open(conn: Conn, *, tenant: str, queue: str | None = None) -> int:
    cur = await conn.execute(_COUNT_OPEN, (tenant, queue, queue))
    row = await cur.fetchone()
    return int(row["n"]) if row else 0
