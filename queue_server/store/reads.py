"""Read-only queries: items, ledgers, counts, queue status, and pages of items with their ledgers."""

from __future__ import annotations

from queue_server.store.sql import Statements
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
_STATE_COUNTS = _SQL(
    "state_counts",
    "SELECT state::text AS state, count(*) AS n FROM work_items WHERE tenant_id = %s GROUP BY state",
)
_ALL_STATE_COUNTS = _SQL(
    "all_state_counts",
    """
SELECT tenant_id, state::text AS state, count(*) AS n FROM work_items
GROUP BY tenant_id, state
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
    cur = await conn.execute(_STATE_COUNTS, (tenant,))
    return {row["state"]: int(row["n"]) for row in await cur.fetchall()}


async def all_state_counts(conn: Conn) -> list[Row]:
    cur = await conn.execute(_ALL_STATE_COUNTS)
    return await cur.fetchall()


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


# Every state, so a queue whose items all completed is still listed: this reads the
# tenant's finished history too (a status call, not a hot path).
_QUEUE_STATUS = _SQL(
    "queue_status",
    """
SELECT queue,
       count(*) FILTER (WHERE state = 'ready') AS ready,
       count(*) FILTER (WHERE state = 'ready' AND available_at <= statement_timestamp()) AS due,
       count(*) FILTER (WHERE state = 'leased') AS leased,
       count(*) FILTER (WHERE state = 'quarantined') AS quarantined,
       count(*) FILTER (WHERE state = 'completed') AS completed,
       count(*) FILTER (WHERE state = 'cancelled') AS cancelled,
       extract(epoch FROM statement_timestamp()
               - min(available_at) FILTER (WHERE state = 'ready'
                                           AND available_at <= statement_timestamp()))
           AS oldest_ready_age
FROM work_items
WHERE tenant_id = %(tenant)s
GROUP BY queue
ORDER BY queue
""",
)


async def queue_status(conn: Conn, *, tenant: str) -> list[Row]:
    """Per queue that ever held an item: its items by state, and the age of the oldest due one."""
    cur = await conn.execute(_QUEUE_STATUS, {"tenant": tenant})
    return await cur.fetchall()


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
