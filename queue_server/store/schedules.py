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

from queue_server.store.sql import fetch_all, fetch_one, load
from queue_server.store.types import Conn, Row

# Fire rows kept per schedule (the newest); older ones are pruned after each pass.
KEEP_FIRES = 100

_SQL = load("schedules")


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
    "traceparent",
    "tracestate",
)


async def put_schedule(
    conn: Conn,
    *,
    tenant: str,
    name: str,
    fields: dict[str, Any],
    next_tick: datetime,
    new: bool,
    at: datetime,
) -> Row:
    """Create the schedule (`new`), or replace its settings; `next_tick` is the cursor
    (an unchanged cursor keeps a pending retry's `due_at`), `at` the instant of the change
    (its `updated_at`, the instant the cursor was reckoned from)."""
    params = {name_: fields[name_] for name_ in _FIELDS}
    params.update(
        tenant=tenant, name=name, next_tick=next_tick, at=at, payload=Jsonb(fields["payload"])
    )
    row = await fetch_one(conn, _SQL["insert_schedule"] if new else _SQL["update_schedule"], params)
    assert row is not None
    return row


async def get_schedule(conn: Conn, *, tenant: str, name: str, lock: bool = False) -> Row | None:
    """The schedule with the database's `now`; `lock` holds its row until the transaction ends
    (waiting for a scheduler pass that holds it)."""
    return await fetch_one(
        conn,
        _SQL["lock_schedule"] if lock else _SQL["get_schedule"],
        {"tenant": tenant, "name": name},
    )


async def list_schedules(conn: Conn, *, tenant: str, after: str | None, limit: int) -> list[Row]:
    """The tenant's schedules in name order after `after`."""
    return await fetch_all(
        conn, _SQL["list_schedules"], {"tenant": tenant, "after": after, "limit": limit}
    )


async def delete_schedule(conn: Conn, *, tenant: str, name: str) -> bool:
    """Gone with its fire rows; the items it enqueued stay."""
    return (
        await fetch_one(conn, _SQL["delete_schedule"], {"tenant": tenant, "name": name}) is not None
    )


async def set_paused(
    conn: Conn, *, tenant: str, name: str, paused: bool, next_tick: datetime | None, at: datetime
) -> Row | None:
    """Pause, or resume from `next_tick` (the ticks of the pause are not due); `at` is the
    instant of the change, its `updated_at`."""
    params = {"tenant": tenant, "name": name, "paused": paused, "next_tick": next_tick, "at": at}
    return await fetch_one(conn, _SQL["set_paused"], params)


# -- the scheduler loops --------------------------------------------------------------


async def due_schedules(conn: Conn, *, limit: int, now: datetime | None = None) -> list[Row]:
    """The running schedules in due order with the seconds until each is due (<= 0: due)."""
    return await fetch_all(conn, _SQL["due_schedules"], {"limit": limit, "now": now})


async def claim(conn: Conn, *, tenant: str, name: str, now: datetime | None = None) -> Row | None:
    """The due schedule, locked for this transaction, with the pass's `now`; None when it
    is not due (any more), paused, gone, or another loop holds it."""
    return await fetch_one(
        conn, _SQL["claim_schedule"], {"tenant": tenant, "name": name, "now": now}
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
        _SQL["advance"],
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
        _SQL["record_fire"],
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


async def drop_refused(conn: Conn, *, tenant: str, schedule_id: str, before: datetime) -> None:
    """Refused ticks the cursor moved past without an item were dropped by the catch-up rule."""
    await conn.execute(
        _SQL["drop_refused"], {"tenant": tenant, "schedule_id": schedule_id, "before": before}
    )


async def prune_fires(conn: Conn, *, tenant: str, schedule_id: str) -> None:
    """Keep the newest KEEP_FIRES fire rows of the schedule."""
    await conn.execute(
        _SQL["prune_fires"], {"tenant": tenant, "schedule_id": schedule_id, "keep": KEEP_FIRES}
    )


async def recent_fires(conn: Conn, *, tenant: str, schedule_id: str, limit: int) -> list[Row]:
    """The schedule's newest fire rows, newest first."""
    return await fetch_all(
        conn, _SQL["recent_fires"], {"tenant": tenant, "schedule_id": schedule_id, "limit": limit}
    )


async def now(conn: Conn) -> datetime:
    """The database clock."""
    row = await fetch_one(conn, _SQL["now"], {})
    assert row is not None
    at: datetime = row["now"]
    return at


async def postpone(conn: Conn, *, tenant: str, name: str, seconds: float) -> None:
    """Look at the schedule again in `seconds` (after a pass that failed)."""
    await conn.execute(_SQL["postpone"], {"tenant": tenant, "name": name, "seconds": seconds})
