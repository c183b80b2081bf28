"""Read-only queries: items, ledgers, counts, queue status, and pages of items with their ledgers."""

from __future__ import annotations

from queue_server.store import queues
from queue_server.store.sql import fetch_all, load
from queue_server.store.types import Conn, Row

_SQL = load("reads")


async def get_item(conn: Conn, *, tenant: str, item_id: str) -> Row | None:
    cur = await conn.execute(_SQL["get_item"], (tenant, item_id))
    return await cur.fetchone()


async def items_in_id_range(
    conn: Conn, *, tenant: str, span: tuple[str, str], limit: int
) -> list[Row]:
    """Items whose id lies in [low, high]: the ids sharing a prefix (the primary key's order)."""
    cur = await conn.execute(_SQL["items_in_id_range"], (tenant, span[0], span[1], limit))
    return await cur.fetchall()


async def count_items(
    conn: Conn,
    *,
    tenant: str,
    state: str,
    queue: str | None,
    created_after: str | None,
    created_before: str | None,
    payload_json: str | None,
) -> int:
    """How many items of `state` match the filter (times as RFC 3339 strings)."""
    params = {
        "tenant": tenant,
        "state": state,
        "queue": queue,
        "created_after": created_after or NO_TIME_BOUND[0],
        "created_before": created_before or NO_TIME_BOUND[1],
        "payload": payload_json,
    }
    cur = await conn.execute(_SQL["count_items"], params)
    row = await cur.fetchone()
    return int(row["n"]) if row else 0


async def items_with_id_ending(conn: Conn, *, tenant: str, digits: str, limit: int) -> list[Row]:
    """Items whose id ends with the hex `digits` (dashes left out)."""
    params = {"tenant": tenant, "digits": digits, "limit": limit}
    cur = await conn.execute(_SQL["items_with_id_ending"], params)
    return await cur.fetchall()


async def ledger(conn: Conn, *, tenant: str, item_id: str) -> list[Row]:
    cur = await conn.execute(_SQL["ledger"], (tenant, item_id))
    return await cur.fetchall()


async def dependencies(
    conn: Conn, *, tenant: str, item_id: str, after: str | None, limit: int
) -> list[Row]:
    """The items `item_id` depends on, in id order after `after` (the first page: None)."""
    params = {"tenant": tenant, "item_id": item_id, "after": after or FIRST_ITEM, "limit": limit}
    cur = await conn.execute(_SQL["dependencies"], params)
    return await cur.fetchall()


async def dependency_count(conn: Conn, *, tenant: str, item_id: str) -> tuple[int, int]:
    """How many items `item_id` depends on, and how many of them it still waits for."""
    cur = await conn.execute(_SQL["dependency_count"], {"tenant": tenant, "item_id": item_id})
    row = await cur.fetchone()
    return (0, 0) if row is None else (int(row["total"]), int(row["waiting_for"]))


async def descendants(conn: Conn, *, tenant: str, item_id: str) -> list[str]:
    """The ids of every item that depends on `item_id`, directly or not."""
    cur = await conn.execute(_SQL["descendants"], {"tenant": tenant, "item_id": item_id})
    return [str(row["item_id"]) for row in await cur.fetchall()]


async def workflow(conn: Conn, *, tenant: str, item_id: str, limit: int) -> list[Row]:
    """The items of the graph `item_id` is part of (its ancestors and descendants, itself
    included, at most `limit`), each with its state and its dependencies among them."""
    params = {"tenant": tenant, "item_id": item_id, "limit": limit}
    cur = await conn.execute(_SQL["workflow"], params)
    return await cur.fetchall()


async def cancelled_by_dependency(conn: Conn, *, tenant: str, item_ids: list[str]) -> list[str]:
    """Those of `item_ids` that a dependency's failure cancelled (not an operator)."""
    cur = await conn.execute(
        _SQL["cancelled_by_dependency"], {"tenant": tenant, "item_ids": item_ids}
    )
    return [str(row["item_id"]) for row in await cur.fetchall()]


async def state_counts(conn: Conn, *, tenant: str) -> dict[str, int]:
    """The tenant's items by state: the finished ones from the counters, the others from
    each queue's cursor (`queues.open_figures`)."""
    cur = await conn.execute(_SQL["state_counts"], {"tenant": tenant})
    finished = await cur.fetchall()
    counts = {state: 0 for state in ("ready", "leased", "quarantined", "completed", "cancelled")}
    for row in finished:
        counts["completed"] += int(row["completed"])
        counts["cancelled"] += int(row["cancelled"])
    for row in await queues.open_figures(conn, [(tenant, r["queue"]) for r in finished]):
        for state in ("ready", "leased", "quarantined"):
            counts[state] += int(row[state])
    return counts


async def schema_revisions(conn: Conn) -> set[str]:
    """The Alembic revisions the database's schema is at."""
    cur = await conn.execute(_SQL["schema_revisions"])
    return {row["version_num"] for row in await cur.fetchall()}


async def leases(conn: Conn, *, tenant: str, limit: int, key_id: str | None = None) -> list[Row]:
    """The tenant's leased items: who holds each, since when, until when (oldest first);
    with `key_id`, only the leases that key took."""
    params = {"tenant": tenant, "limit": limit, "key_id": key_id}
    cur = await conn.execute(_SQL["leases"], params)
    return await cur.fetchall()


FIRST_ITEM = "00000000-0000-0000-0000-000000000000"


async def ledger_page(
    conn: Conn, *, tenant: str | None, after: tuple[str, str] | None, limit: int
) -> list[Row]:
    """Items in (tenant, item_id) order after `after`, each with its whole ledger as `events`."""
    after_tenant, after_item = after or ("", FIRST_ITEM)
    params = {
        "tenant": tenant,
        "after_tenant": after_tenant,
        "after_item": after_item,
        "limit": limit,
    }
    cur = await conn.execute(_SQL["ledger_page"], params)
    return await cur.fetchall()


# -- pages of items: keyset pagination in one of six orders --------------------------
#
# The statement of each order (reads.sql explains how each reads its index): the sort key
# (None: created_at alone), then created_at and item_id, all in one direction.
SORTS = ("created", "-created", "priority", "-priority", "attempts", "-attempts")
_LIST_ITEMS = {
    "created": _SQL["list_items_created"],
    "-created": _SQL["list_items_created_desc"],
    "priority": _SQL["list_items_priority"],
    "-priority": _SQL["list_items_priority_desc"],
    "attempts": _SQL["list_items_attempts"],
    "-attempts": _SQL["list_items_attempts_desc"],
}
# The column of each sort key, as a page's last row gives it to its cursor.
SORT_COLUMN = {"created": None, "priority": "priority", "attempts": "acquisition_count"}

NO_TIME_BOUND = ("-infinity", "infinity")
# Where a page without a cursor starts, ascending and descending: before every position.
_START = {
    False: (-(2**31), NO_TIME_BOUND[0], "00000000-0000-0000-0000-000000000000"),
    True: (2**31 - 1, NO_TIME_BOUND[1], "ffffffff-ffff-ffff-ffff-ffffffffffff"),
}
# The states each branch of a page covers: the list index's, then whether leased ones too.
LISTED = ("ready", "quarantined", "completed", "cancelled")
OPEN = ("ready", "quarantined")


async def list_items(
    conn: Conn,
    *,
    tenant: str,
    queue: str | None,
    state: str | None,
    open_only: bool = False,
    created_after: str | None,
    created_before: str | None,
    payload_json: str | None,
    after: tuple[int | None, str, str] | None,
    limit: int,
    sort: str = "created",
) -> list[Row]:
    """Up to `limit` items in `sort`'s order (one of SORTS: its key, then created_at and
    item_id, "-" descending) after the position `after` (key, created_at, item_id; the key
    None for the created order), matching the filter.

    `state` None: every state (only ready, leased and quarantined with `open_only`).
    Times are RFC 3339 strings; `payload_json` is a JSON document the payload must contain.
    """
    descending = sort.startswith("-")
    start = _START[descending]
    if state == "leased":
        states: tuple[str, ...] = ()
    elif state is not None:
        states = (state,)
    else:
        states = OPEN if open_only else LISTED
    params = {
        "tenant": tenant,
        "queue": queue,
        "states": list(states),
        "leased": state in (None, "leased"),
        "created_after": created_after or NO_TIME_BOUND[0],
        "created_before": created_before or NO_TIME_BOUND[1],
        "after_key": start[0] if after is None or after[0] is None else after[0],
        "after_at": after[1] if after else start[1],
        "after_id": after[2] if after else start[2],
        "payload": payload_json,
        "limit": limit,
    }
    return await fetch_all(conn, _LIST_ITEMS[sort], params)


async def items_with_ids(
    conn: Conn,
    *,
    tenant: str,
    item_ids: list[str],
    state: str,
    queue: str | None,
    created_after: str | None,
    created_before: str | None,
    payload_json: str | None,
    after: tuple[int | None, str, str] | None,
    limit: int,
) -> list[Row]:
    """Up to `limit` of the named items of `state` that match the rest of the filter, in
    (created_at, item_id) order after `after`: a bulk action's selection."""
    params = {
        "tenant": tenant,
        "item_ids": item_ids,
        "state": state,
        "queue": queue,
        "created_after": created_after or NO_TIME_BOUND[0],
        "created_before": created_before or NO_TIME_BOUND[1],
        "after_at": after[1] if after else NO_TIME_BOUND[0],
        "after_id": after[2] if after else FIRST_ITEM,
        "payload": payload_json,
        "limit": limit,
    }
    return await fetch_all(conn, _SQL["items_with_ids"], params)
