"""Read-only queries: items, ledgers, counts, queue status, and pages of items with their ledgers."""

from __future__ import annotations

from queue_server.store.sql import Statements, fetch_all
from queue_server.store.types import Conn, Row

_SQL = Statements(__name__)

_GET_ITEM = _SQL("get_item", "SELECT * FROM work_items WHERE tenant_id = %s AND item_id = %s")
_LEDGER = _SQL(
    "ledger",
    """
SELECT seq, at, kind, fence, actor, data FROM item_events
WHERE tenant_id = %s AND item_id = %s ORDER BY seq
""",
)
# Unfinished states from their partial indexes (a branch each: an IN list would be one scan
# of the table); finished ones from the queue counters
# (completed - purged, cancelled - purged): no read of finished history.
_STATE_COUNTS = _SQL(
    "state_counts",
    """
SELECT 'ready' AS state, count(*) AS n FROM work_items
WHERE tenant_id = %(tenant)s AND state = 'ready'
UNION ALL
SELECT 'leased', count(*) FROM work_items WHERE tenant_id = %(tenant)s AND state = 'leased'
UNION ALL
SELECT 'quarantined', count(*) FROM work_items
WHERE tenant_id = %(tenant)s AND state = 'quarantined'
UNION ALL
SELECT 'completed', coalesce(sum(completed - purged_completed), 0) FROM queue_counters
WHERE tenant_id = %(tenant)s
UNION ALL
SELECT 'cancelled', coalesce(sum(cancelled - purged_cancelled), 0) FROM queue_counters
WHERE tenant_id = %(tenant)s
""",
)
_MAX_CONNECTIONS = _SQL("max_connections", "SELECT current_setting('max_connections')::int AS n")
_SCHEMA_REVISIONS = _SQL("schema_revisions", "SELECT version_num FROM alembic_version")


async def get_item(conn: Conn, *, tenant: str, item_id: str) -> Row | None:
    cur = await conn.execute(_GET_ITEM, (tenant, item_id))
    return await cur.fetchone()


_ITEMS_IN_ID_RANGE = _SQL(
    "items_in_id_range",
    "SELECT * FROM work_items WHERE tenant_id = %s AND item_id BETWEEN %s AND %s"
    " ORDER BY item_id LIMIT %s",
)


async def items_in_id_range(
    conn: Conn, *, tenant: str, span: tuple[str, str], limit: int
) -> list[Row]:
    """Items whose id lies in [low, high]: the ids sharing a prefix (the primary key's order)."""
    cur = await conn.execute(_ITEMS_IN_ID_RANGE, (tenant, span[0], span[1], limit))
    return await cur.fetchall()


async def ledger(conn: Conn, *, tenant: str, item_id: str) -> list[Row]:
    cur = await conn.execute(_LEDGER, (tenant, item_id))
    return await cur.fetchall()


async def state_counts(conn: Conn, *, tenant: str) -> dict[str, int]:
    """The tenant's items by state (a state without items is absent)."""
    cur = await conn.execute(_STATE_COUNTS, {"tenant": tenant})
    return {row["state"]: int(row["n"]) for row in await cur.fetchall()}


async def max_connections(conn: Conn) -> int:
    """The server's `max_connections`: the most statements that can run at once."""
    cur = await conn.execute(_MAX_CONNECTIONS)
    row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


async def schema_revisions(conn: Conn) -> set[str]:
    """The Alembic revisions the database's schema is at."""
    cur = await conn.execute(_SCHEMA_REVISIONS)
    return {row["version_num"] for row in await cur.fetchall()}


# The leased rows come from ix_work_items_leased; each one's acquisition time is its
# last `acquired` event (a heartbeat moves the expiry, not the start).
_LEASES = _SQL(
    "leases",
    """
SELECT w.queue, w.item_id, w.lease_holder, w.fence, w.lease_expires_at,
       (SELECT e.at FROM item_events e
        WHERE e.tenant_id = w.tenant_id AND e.item_id = w.item_id AND e.kind = 'acquired'
        ORDER BY e.seq DESC LIMIT 1) AS acquired_at
FROM work_items w
WHERE w.tenant_id = %(tenant)s AND w.state = 'leased'
ORDER BY w.queue, acquired_at, w.item_id
LIMIT %(limit)s
""",
)


async def leases(conn: Conn, *, tenant: str, limit: int) -> list[Row]:
    """The tenant's leased items: who holds each, since when, until when (oldest first)."""
    cur = await conn.execute(_LEASES, {"tenant": tenant, "limit": limit})
    return await cur.fetchall()


# One statement, so each item and its events are read from the same snapshot:
# a transition committing in between cannot make a consistent item look wrong.
_LEDGER_PAGE = _SQL(
    "ledger_page",
    """
WITH page AS (
    SELECT * FROM work_items
    WHERE (%(tenant)s::text IS NULL OR tenant_id = %(tenant)s)
      AND (tenant_id, item_id) > (%(after_tenant)s, %(after_item)s::uuid)
    ORDER BY tenant_id, item_id
    LIMIT %(limit)s
)
SELECT p.*,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'seq', e.seq, 'kind', e.kind, 'fence', e.fence, 'data', e.data)
                   ORDER BY e.seq), '[]'::jsonb)
        FROM item_events e
        WHERE e.tenant_id = p.tenant_id AND e.item_id = p.item_id) AS events
FROM page p
ORDER BY tenant_id, item_id
""",
)

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
    cur = await conn.execute(_LEDGER_PAGE, params)
    return await cur.fetchall()


# -- pages of items: keyset pagination in (created_at, item_id) order -----------------
#
# ix_work_items_list (tenant_id, state, queue, created_at, item_id) holds every state but
# leased. Each branch below reads one (state, queue) range of it from the cursor on, so a
# page of ready items never reads finished history. Without a queue, the queues of the
# state are found by a loose index scan (one probe per queue) and each is read up to a
# page; without a state, each state is a branch of its own. Leased items (the few the
# concurrency limit allows) come from ix_work_items_leased and are sorted.

_PAGE_FILTER = """
      AND w.created_at > %(created_after)s::timestamptz
      AND w.created_at < %(created_before)s::timestamptz
      AND (w.created_at, w.item_id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)
      AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb)
    ORDER BY w.created_at, w.item_id
    LIMIT %(limit)s"""

STATES_BUT_LEASED = ("ready", "quarantined", "completed", "cancelled")
OPEN_STATES_BUT_LEASED = ("ready", "quarantined")


def _in_state(state: str, queue: str) -> str:
    """One (state, queue) range of the list index, from the cursor on, at most a page."""
    return f"""SELECT w.* FROM work_items w
    WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = {state}
      AND w.queue = {queue}{_PAGE_FILTER}"""


def queues_of(name: str, state: str) -> str:
    """`name AS (...)`: the tenant's queues with items in `state`, one index probe each."""
    return f"""{name} AS (
    (SELECT w.queue FROM work_items w
     WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = {state}
     ORDER BY w.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT w.queue FROM work_items w
            WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = {state}
              AND w.queue > q.queue
            ORDER BY w.queue LIMIT 1)
    FROM {name} q WHERE q.queue IS NOT NULL
)"""


def _every_queue(name: str, state: str) -> str:
    return f"""SELECT p.* FROM {name} q CROSS JOIN LATERAL (
    {_in_state(state, "q.queue")}
) p"""


_LEASED = f"""SELECT w.* FROM work_items w
    WHERE w.tenant_id = %(tenant)s AND w.state = 'leased'
      AND (%(queue)s::text IS NULL OR w.queue = %(queue)s){_PAGE_FILTER}"""

_PAGE_ORDER = "ORDER BY u.created_at, u.item_id LIMIT %(limit)s"


def _union(branches: list[str], ctes: list[str] | None = None) -> str:
    with_ = f"WITH RECURSIVE {', '.join(ctes)}\n" if ctes else ""
    parts = "\nUNION ALL\n".join(f"({branch})" for branch in branches)
    return f"{with_}SELECT u.* FROM (\n{parts}\n) AS u\n{_PAGE_ORDER}"


def _of_states(states: tuple[str, ...], *, queue: bool, leased: bool) -> str:
    """A page over several states (literals), of one queue or of every queue."""
    ctes = [] if queue else [queues_of(f"q_{s}", f"'{s}'") for s in states]
    branches = [
        _in_state(f"'{s}'", "%(queue)s") if queue else _every_queue(f"q_{s}", f"'{s}'")
        for s in states
    ]
    if leased:
        branches.append(_LEASED)
    return _union(branches, ctes)


_LIST_ITEMS = {
    # (state, queue given): one state's page (the state a parameter, never 'leased')
    ("state", True): _SQL(
        "list_items_state_queue", _in_state("%(state)s::item_state", "%(queue)s")
    ),
    ("state", False): _SQL(
        "list_items_state",
        _union(
            [_every_queue("q_state", "%(state)s::item_state")],
            [queues_of("q_state", "%(state)s::item_state")],
        ),
    ),
    ("leased", True): _SQL("list_items_leased", _LEASED),
    ("leased", False): _SQL("list_items_leased", _LEASED),
    ("all", True): _SQL(
        "list_items_all_queue", _of_states(STATES_BUT_LEASED, queue=True, leased=True)
    ),
    ("all", False): _SQL("list_items_all", _of_states(STATES_BUT_LEASED, queue=False, leased=True)),
    ("open", True): _SQL(
        "list_items_open_queue", _of_states(OPEN_STATES_BUT_LEASED, queue=True, leased=True)
    ),
    ("open", False): _SQL(
        "list_items_open", _of_states(OPEN_STATES_BUT_LEASED, queue=False, leased=True)
    ),
}

NO_TIME_BOUND = ("-infinity", "infinity")


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
    after: tuple[str, str] | None,
    limit: int,
) -> list[Row]:
    """Up to `limit` items in (created_at, item_id) order after `after`, matching the filter.

    `state` None: every state (only ready, leased and quarantined with `open_only`).
    Times are RFC 3339 strings; `payload_json` is a JSON document the payload must contain.
    """
    if state == "leased":
        kind = "leased"
    elif state is not None:
        kind = "state"
    else:
        kind = "open" if open_only else "all"
    params = {
        "tenant": tenant,
        "queue": queue,
        "state": state,
        "created_after": created_after or NO_TIME_BOUND[0],
        "created_before": created_before or NO_TIME_BOUND[1],
        "after_at": after[0] if after else NO_TIME_BOUND[0],
        "after_id": after[1] if after else FIRST_ITEM,
        "payload": payload_json,
        "limit": limit,
    }
    return await fetch_all(conn, _LIST_ITEMS[(kind, queue is not None)], params)
