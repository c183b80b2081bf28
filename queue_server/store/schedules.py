"""Schedules and their fires: the rows, the scheduler loops' scan and claim, the cursor.

    schedules.next_tick_at   the cursor: every tick before it is settled
    schedules.due_at         when a loop looks next (the cursor, or a retry after a refusal)
    claim                    FOR UPDATE SKIP LOCKED: one loop at a time acts on a schedule;
                             the others skip it and find the cursor moved once it commits

A fire's item is enqueued by `transitions.enqueue` in the claiming transaction, so the
item, its fire row and the moved cursor commit together or not at all.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from queue_server.store.sql import Statements, fetch_all, fetch_one
from queue_server.store.types import Conn, Row

# Fire rows kept per schedule (the newest); older ones are pruned after each pass.
KEEP_FIRES = 100

_SQL = Statements(__name__)

# A pinned clock for tests (`now`), else the statement's own.
_CLOCK = "coalesce(%(now)s::timestamptz, statement_timestamp())"

_FIELDS = (
    "queue",
    "payload",
    "priority",
    "max_acquisitions",
    "cron",
    "every_seconds",
    "timezone",
    "catch_up",
    "catch_up_limit",
    "paused",
)

_INSERT = _SQL(
    "insert_schedule",
    """
INSERT INTO schedules (tenant_id, name, schedule_id, queue, payload, priority, max_acquisitions,
                       cron, every_seconds, timezone, catch_up, catch_up_limit, paused,
                       next_tick_at, due_at, created_at, updated_at)
VALUES (%(tenant)s, %(name)s, gen_random_uuid(), %(queue)s, %(payload)s, %(priority)s,
        %(max_acquisitions)s, %(cron)s, %(every_seconds)s, %(timezone)s, %(catch_up)s,
        %(catch_up_limit)s, %(paused)s, %(next_tick)s, %(next_tick)s,
        statement_timestamp(), statement_timestamp())
RETURNING *
""",
)

_UPDATE = _SQL(
    "update_schedule",
    """
UPDATE schedules
SET queue = %(queue)s, payload = %(payload)s, priority = %(priority)s,
    max_acquisitions = %(max_acquisitions)s, cron = %(cron)s, every_seconds = %(every_seconds)s,
    timezone = %(timezone)s, catch_up = %(catch_up)s, catch_up_limit = %(catch_up_limit)s,
    paused = %(paused)s, next_tick_at = %(next_tick)s,
    due_at = CASE WHEN next_tick_at = %(next_tick)s THEN due_at ELSE %(next_tick)s END,
    updated_at = statement_timestamp()
WHERE tenant_id = %(tenant)s AND name = %(name)s
RETURNING *
""",
)


async def put_schedule(
    conn: Conn, *, tenant: str, name: str, fields: dict[str, Any], next_tick: datetime, new: bool
) -> Row:
    """Create the schedule (`new`), or replace its settings; `next_tick` is the cursor
    (an unchanged cursor keeps a pending retry's `due_at`)."""
    params = {name_: fields[name_] for name_ in _FIELDS}
    params.update(tenant=tenant, name=name, next_tick=next_tick, payload=Jsonb(fields["payload"]))
    row = await fetch_one(conn, _INSERT if new else _UPDATE, params)
    assert row is not None
    return row


_GET = _SQL(
    "get_schedule",
    """
SELECT s.*, statement_timestamp() AS now FROM schedules s
WHERE tenant_id = %(tenant)s AND name = %(name)s
""",
)
_LOCK = _SQL(
    "lock_schedule",
    """
SELECT s.*, statement_timestamp() AS now FROM schedules s
WHERE tenant_id = %(tenant)s AND name = %(name)s
FOR NO KEY UPDATE
""",
)


async def get_schedule(conn: Conn, *, tenant: str, name: str, lock: bool = False) -> Row | None:
    """The schedule with the database's `now`; `lock` holds its row until the transaction ends
    (waiting for a scheduler pass that holds it)."""
    return await fetch_one(conn, _LOCK if lock else _GET, {"tenant": tenant, "name": name})


_LIST = _SQL(
    "list_schedules",
    """
SELECT s.*, statement_timestamp() AS now FROM schedules s
WHERE tenant_id = %(tenant)s AND (%(after)s::text IS NULL OR name > %(after)s)
ORDER BY name LIMIT %(limit)s
""",
)


async def list_schedules(conn: Conn, *, tenant: str, after: str | None, limit: int) -> list[Row]:
    """The tenant's schedules in name order after `after`."""
    return await fetch_all(conn, _LIST, {"tenant": tenant, "after": after, "limit": limit})


_DELETE = _SQL(
    "delete_schedule",
    "DELETE FROM schedules WHERE tenant_id = %(tenant)s AND name = %(name)s RETURNING schedule_id",
)


async def delete_schedule(conn: Conn, *, tenant: str, name: str) -> bool:
    """Gone with its fire rows; the items it enqueued stay."""
    return await fetch_one(conn, _DELETE, {"tenant": tenant, "name": name}) is not None


_SET_PAUSED = _SQL(
    "set_paused",
    """
UPDATE schedules
SET paused = %(paused)s,
    next_tick_at = coalesce(%(next_tick)s, next_tick_at),
    due_at = coalesce(%(next_tick)s, due_at),
    updated_at = statement_timestamp()
WHERE tenant_id = %(tenant)s AND name = %(name)s
RETURNING *, statement_timestamp() AS now
""",
)


async def set_paused(
    conn: Conn, *, tenant: str, name: str, paused: bool, next_tick: datetime | None
) -> Row | None:
    """Pause, or resume from `next_tick` (the ticks of the pause are not due)."""
    params = {"tenant": tenant, "name": name, "paused": paused, "next_tick": next_tick}
    return await fetch_one(conn, _SET_PAUSED, params)


# -- the scheduler loops --------------------------------------------------------------

_DUE = _SQL(
    "due_schedules",
    f"""
SELECT tenant_id, name, extract(epoch FROM due_at - {_CLOCK})::float8 AS wait
FROM schedules WHERE NOT paused
ORDER BY due_at LIMIT %(limit)s
""",
)


async def due_schedules(conn: Conn, *, limit: int, now: datetime | None = None) -> list[Row]:
    """The running schedules in due order with the seconds until each is due (<= 0: due)."""
    return await fetch_all(conn, _DUE, {"limit": limit, "now": now})


_CLAIM = _SQL(
    "claim_schedule",
    f"""
SELECT s.*, {_CLOCK} AS now FROM schedules s
WHERE tenant_id = %(tenant)s AND name = %(name)s AND NOT paused AND due_at <= {_CLOCK}
-- SKIP LOCKED: another loop is firing it; its commit moves the cursor past these ticks.
FOR NO KEY UPDATE SKIP LOCKED
""",
)


async def claim(conn: Conn, *, tenant: str, name: str, now: datetime | None = None) -> Row | None:
    """The due schedule, locked for this transaction, with the pass's `now`; None when it
    is not due (any more), paused, gone, or another loop holds it."""
    return await fetch_one(conn, _CLAIM, {"tenant": tenant, "name": name, "now": now})


_ADVANCE = _SQL(
    "advance",
    """
UPDATE schedules
SET next_tick_at = %(next_tick)s, due_at = %(due_at)s, fires = fires + %(fired)s,
    refusals = refusals + %(refused)s, skipped = skipped + %(dropped)s
WHERE tenant_id = %(tenant)s AND schedule_id = %(schedule_id)s
""",
)


async def advance(
    conn: Conn,
    *,
    tenant: str,
    schedule_id: str,
    next_tick: datetime,
    due_at: datetime,
    fired: int,
    refused: int,
    dropped: int,
) -> None:
    """Move the cursor (never back: the caller computed it from the locked row) and count."""
    await conn.execute(
        _ADVANCE,
        {
            "tenant": tenant,
            "schedule_id": schedule_id,
            "next_tick": next_tick,
            "due_at": due_at,
            "fired": fired,
            "refused": refused,
            "dropped": dropped,
        },
    )


_RECORD_FIRE = _SQL(
    "record_fire",
    """
INSERT INTO schedule_fires AS f (tenant_id, schedule_id, tick_at, kind, outcome, item_id,
                                 attempts, at, detail)
VALUES (%(tenant)s, %(schedule_id)s, %(tick_at)s, %(kind)s, %(outcome)s, %(item_id)s, 1,
        statement_timestamp(), %(detail)s)
ON CONFLICT (tenant_id, schedule_id, tick_at, kind) DO UPDATE
SET outcome = excluded.outcome, item_id = excluded.item_id, attempts = f.attempts + 1,
    at = excluded.at, detail = excluded.detail
""",
)


async def record_fire(
    conn: Conn,
    *,
    tenant: str,
    schedule_id: str,
    tick_at: datetime,
    kind: str,
    outcome: str,
    item_id: str | None = None,
    detail: dict[str, Any] | None = None,
) -> None:
    """What became of a tick (or a trigger): enqueued, or refused (attempts counted)."""
    await conn.execute(
        _RECORD_FIRE,
        {
            "tenant": tenant,
            "schedule_id": schedule_id,
            "tick_at": tick_at,
            "kind": kind,
            "outcome": outcome,
            "item_id": item_id,
            "detail": Jsonb(detail) if detail is not None else None,
        },
    )


_DROP_REFUSED = _SQL(
    "drop_refused",
    """
UPDATE schedule_fires SET outcome = 'dropped', at = statement_timestamp()
WHERE tenant_id = %(tenant)s AND schedule_id = %(schedule_id)s AND kind = 'tick'
  AND outcome = 'refused' AND tick_at < %(before)s
""",
)


async def drop_refused(conn: Conn, *, tenant: str, schedule_id: str, before: datetime) -> None:
    """Refused ticks the cursor moved past without an item were dropped by the catch-up rule."""
    await conn.execute(
        _DROP_REFUSED, {"tenant": tenant, "schedule_id": schedule_id, "before": before}
    )


_PRUNE_FIRES = _SQL(
    "prune_fires",
    """
DELETE FROM schedule_fires
WHERE tenant_id = %(tenant)s AND schedule_id = %(schedule_id)s
  AND tick_at <= (SELECT tick_at FROM schedule_fires
                  WHERE tenant_id = %(tenant)s AND schedule_id = %(schedule_id)s
                  ORDER BY tick_at DESC OFFSET %(keep)s LIMIT 1)
""",
)


async def prune_fires(conn: Conn, *, tenant: str, schedule_id: str) -> None:
    """Keep the newest KEEP_FIRES fire rows of the schedule."""
    await conn.execute(
        _PRUNE_FIRES, {"tenant": tenant, "schedule_id": schedule_id, "keep": KEEP_FIRES}
    )


_RECENT_FIRES = _SQL(
    "recent_fires",
    """
SELECT * FROM schedule_fires
WHERE tenant_id = %(tenant)s AND schedule_id = %(schedule_id)s
ORDER BY tick_at DESC, kind LIMIT %(limit)s
""",
)


async def recent_fires(conn: Conn, *, tenant: str, schedule_id: str, limit: int) -> list[Row]:
    """The schedule's newest fire rows, newest first."""
    return await fetch_all(
        conn, _RECENT_FIRES, {"tenant": tenant, "schedule_id": schedule_id, "limit": limit}
    )


_CLOCK_NOW = _SQL("now", "SELECT statement_timestamp() AS now")


async def now(conn: Conn) -> datetime:
    """The database clock."""
    row = await fetch_one(conn, _CLOCK_NOW, {})
    assert row is not None
    at: datetime = row["now"]
    return at


_POSTPONE = _SQL(
    "postpone",
    """
UPDATE schedules SET due_at = statement_timestamp() + make_interval(secs => %(seconds)s)
WHERE tenant_id = %(tenant)s AND name = %(name)s AND NOT paused
""",
)


async def postpone(conn: Conn, *, tenant: str, name: str, seconds: float) -> None:
    """Look at the schedule again in `seconds` (after a pass that failed)."""
    await conn.execute(_POSTPONE, {"tenant": tenant, "name": name, "seconds": seconds})
