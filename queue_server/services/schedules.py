"""Schedules: a tenant's periodic enqueues (operator), and the scheduler pass that fires
them exactly once per tick however many API processes run it.

One pass over a due schedule is one transaction:

    claim the schedule row (FOR NO KEY UPDATE SKIP LOCKED: another loop holding it is
      firing it, so this one moves on) with the database's `now`
    plan the due ticks since the cursor by the catch-up rule (`services.ticks`)
    each tick to fire, oldest first: `Items.admit` (the admission shards and backlog cap of
      every enqueue) with the item id derived from (schedule, tick), its `scheduled`
      ledger event, its fire row
      '--refused at the cap: recorded, the cursor stays on that tick, retried in a second
    move the cursor past every settled tick; commit

The item, its ledger events, its fire row and the moved cursor commit together, so a
crash anywhere leaves the tick due with no item, and a second loop can only find it
settled. The deterministic item id is a second wall: the same tick cannot be inserted
twice even if the cursor were wrong.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from queue_server import auth, errors, tracecontext, views
from queue_server.db import Database
from queue_server.idempotency import Answer, Effects, Idempotency
from queue_server.infra.metrics import Metrics
from queue_server.models import NAME_RE, Role, uuid7_at
from queue_server.services.common import foreign_cursor, require_tenant
from queue_server.services.envelope import refuse_above
from queue_server.services.item_specs import NewItem
from queue_server.services.items import Items
from queue_server.services.ticks import CatchUp, Timing, plan
from queue_server.settings import Settings
from queue_server.store import schedules, transitions
from queue_server.store.types import Conn, Row
from queue_server.tracecontext import TraceContext

log = logging.getLogger(__name__)

# Fire times each answer shows, and fire rows one schedule's page shows.
NEXT_FIRES = 5
RECENT_FIRES = 20
MAX_PAGE = 500
# Schedules one pass looks at before it asks again.
DUE_BATCH = 100
# A tick refused at the backlog cap is tried again after this long.
REFUSAL_RETRY = timedelta(seconds=1)
# A schedule whose pass failed (not a refusal) is looked at again after this long.
FAILED_PASS_RETRY = 5.0


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """What a PUT asks for."""

    queue: str
    payload: Any = None
    priority: int = 0
    max_acquisitions: int | None = None
    cron: str | None = None
    every: int | None = None
    timezone: str = "UTC"
    catch_up: CatchUp = CatchUp.SKIP
    catch_up_limit: int = 100
    paused: bool = False
    # The W3C trace context of the request (already validated): each fire's item carries it.
    trace: TraceContext | None = None


def timing_of(row: Row) -> Timing:
    return Timing(cron=row["cron"], every=row["every_seconds"], timezone=row["timezone"])


def schedule_view(row: Row) -> dict[str, Any]:
    """The schedule as the API shows it, with its next fire times (none while paused)."""
    upcoming = [] if row["paused"] else timing_of(row).upcoming(row["next_tick_at"], NEXT_FIRES)
    return views.schedule(row, upcoming)


class Schedules:
    """Put, read, pause, resume, trigger and delete schedules; fire the due ones."""

    def __init__(
        self, db: Database, effects: Effects, items: Items, settings: Settings, metrics: Metrics
    ) -> None:
        self.db = db
        self.effects = effects
        self.items = items
        self.metrics = metrics
        self.grace = timedelta(seconds=settings.schedule_grace)

    async def _schedule(self, conn: Conn, tenant: str, name: str, *, lock: bool = False) -> Row:
        row = await schedules.get_schedule(conn, tenant=tenant, name=name, lock=lock)
        if row is None:
            raise errors.ScheduleNotFoundError(schedule=name)
        return row

    # -- the resource ------------------------------------------------------------------

    async def put(
        self,
        principal: auth.Principal,
        tenant: str,
        name: str,
        spec: ScheduleSpec,
        idem: Idempotency,
        *,
        instance: str,
    ) -> Answer:
        """Create (201) or replace (200). A change of timing, or a resume, starts from the
        first tick after now; any other change keeps the cursor (no tick fired twice or lost)."""
        principal.require(tenant, Role.OPERATOR)
        refuse_above(
            [self.items.envelope.budget(spec.max_acquisitions, "body", "max_acquisitions")]
        )
        timing = Timing.checked(cron=spec.cron, every=spec.every, timezone=spec.timezone)
        fields = {
            "queue": spec.queue,
            "payload": spec.payload,
            "priority": spec.priority,
            "max_acquisitions": spec.max_acquisitions,
            "cron": timing.cron,
            "every_seconds": timing.every,
            "timezone": timing.timezone,
            "catch_up": str(spec.catch_up),
            "catch_up_limit": spec.catch_up_limit,
            "paused": spec.paused,
            "traceparent": spec.trace and spec.trace.traceparent,
            "tracestate": spec.trace and spec.trace.tracestate,
        }

        async def operation(conn: Conn) -> Answer:
            await require_tenant(conn, tenant)
            current = await schedules.get_schedule(conn, tenant=tenant, name=name, lock=True)
            # The change's instant, read once the row is held: the cursor restarts after it
            # and it is the schedule's `updated_at`, so no next fire shown is before the change.
            now = await schedules.now(conn)
            restart = (
                current is None
                or timing_of(current) != timing
                or (current["paused"] and not spec.paused)
            )
            next_tick = timing.after(now) if restart or current is None else current["next_tick_at"]
            row = await schedules.put_schedule(
                conn,
                tenant=tenant,
                name=name,
                fields=fields,
                next_tick=next_tick,
                new=not current,
                at=now,
            )
            if current is not None and restart:
                await schedules.drop_refused(
                    conn, tenant=tenant, schedule_id=row["schedule_id"], before=next_tick
                )
            return Answer.of(201 if current is None else 200, schedule_view(row))

        return await self.effects.run(tenant, idem, instance, operation)

    async def get(self, principal: auth.Principal, tenant: str, name: str) -> Answer:
        """One schedule with its next fire times and its newest fires."""
        principal.require(tenant, Role.OPERATOR)
        async with self.db.conn() as conn:
            row = await self._schedule(conn, tenant, name)
            fires = await schedules.recent_fires(
                conn, tenant=tenant, schedule_id=row["schedule_id"], limit=RECENT_FIRES
            )
        body = schedule_view(row)
        body["recent_fires"] = [views.schedule_fire(f) for f in fires]
        return Answer.of(200, body)

    async def list(
        self, principal: auth.Principal, tenant: str, *, limit: int, cursor: str | None
    ) -> Answer:
        """The tenant's schedules by name, each with its next fire times."""
        principal.require(tenant, Role.OPERATOR)
        # The cursor is the last name of a page: anything else was not handed out here.
        if cursor and NAME_RE.fullmatch(cursor) is None:
            raise foreign_cursor()
        async with self.db.conn() as conn:
            await require_tenant(conn, tenant)
            rows = await schedules.list_schedules(
                conn, tenant=tenant, after=cursor or None, limit=limit + 1
            )
        next_cursor = None
        if len(rows) > limit:
            rows = rows[:limit]
            next_cursor = rows[-1]["name"]
        return Answer.of(
            200, {"schedules": [schedule_view(r) for r in rows], "next_cursor": next_cursor}
        )

    async def delete(
        self, principal: auth.Principal, tenant: str, name: str, idem: Idempotency, *, instance: str
    ) -> Answer:
        """Gone, with its fire rows (waiting for a pass in progress); its items stay."""
        principal.require(tenant, Role.OPERATOR)

        async def operation(conn: Conn) -> Answer:
            if not await schedules.delete_schedule(conn, tenant=tenant, name=name):
                raise errors.ScheduleNotFoundError(schedule=name)
            return Answer(status=204, body=b"")

        return await self.effects.run(tenant, idem, instance, operation)

    async def change(
        self,
        principal: auth.Principal,
        tenant: str,
        name: str,
        idem: Idempotency,
        *,
        instance: str,
        pause: bool,
    ) -> Answer:
        """pause: no tick is due until resumed. resume: from the first tick after now (the
        ticks of the pause are not missed ticks). Either on a schedule already so: no change."""
        principal.require(tenant, Role.OPERATOR)

        async def operation(conn: Conn) -> Answer:
            current = await self._schedule(conn, tenant, name, lock=True)
            if current["paused"] == pause:
                return Answer.of(200, schedule_view(current))
            # The change's instant, read once the row is held (a pass holding it has
            # committed): the first tick after it, and the schedule's `updated_at`.
            now = await schedules.now(conn)
            next_tick = None if pause else timing_of(current).after(now)
            row = await schedules.set_paused(
                conn, tenant=tenant, name=name, paused=pause, next_tick=next_tick, at=now
            )
            assert row is not None
            if next_tick is not None:
                await schedules.drop_refused(
                    conn, tenant=tenant, schedule_id=row["schedule_id"], before=next_tick
                )
            return Answer.of(200, schedule_view(row))

        return await self.effects.run(tenant, idem, instance, operation)

    async def trigger(
        self,
        principal: auth.Principal,
        tenant: str,
        name: str,
        idem: Idempotency,
        *,
        instance: str,
        trace: TraceContext | None = None,
    ) -> Answer:
        """One fire now (paused or not), under the backlog cap like any enqueue: 201 with the
        item, or 429 `backlog-cap-reached`. The schedule's ticks are not affected. The item
        carries the trigger's trace context, else the schedule's."""
        principal.require(tenant, Role.OPERATOR)

        async def operation(conn: Conn) -> Answer:
            row = await self._schedule(conn, tenant, name, lock=True)
            item = await self._fire(
                conn, row, row["now"], trigger=True, actor=principal.actor, trace=trace
            )
            return Answer.of(
                201, {"schedule": name, "tick_at": row["now"], "item": views.item(item)}
            )

        try:
            answer = await self.effects.run(tenant, idem, instance, operation)
        except errors.BacklogCapReachedError:
            self.metrics.schedule_refusals.labels(tenant, name).inc()
            raise
        if not answer.replayed and answer.status == 201:
            self.metrics.schedule_fires.labels(tenant, name).inc()
        return answer

    # -- firing ------------------------------------------------------------------------

    async def _fire(
        self,
        conn: Conn,
        row: Row,
        tick: datetime,
        *,
        trigger: bool,
        actor: str,
        trace: TraceContext | None = None,
    ) -> Row:
        """Enqueue the schedule's item for `tick` through the one admission path; its id is
        derived from (schedule, kind, tick), its ledger says which schedule and tick. Its
        trace context: `trace`, else the one the schedule was put with."""
        kind = "trigger" if trigger else "tick"
        tenant, schedule_id = row["tenant_id"], str(row["schedule_id"])
        new = NewItem(
            payload=row["payload"],
            priority=row["priority"],
            max_acquisitions=row["max_acquisitions"],
            item_id=uuid7_at(tick, f"schedule:{schedule_id}/{kind}"),
            trace=trace or tracecontext.parse(row["traceparent"], row["tracestate"]),
        )
        # A savepoint: a refusal at the cap aborts only the admission, and the pass goes on
        # in its transaction to record it.
        async with conn.transaction():
            [item] = await self.items.admit(conn, tenant, row["queue"], [new], actor=actor)
        item_id = str(item["item_id"])
        await transitions.record_scheduled(
            conn,
            tenant=tenant,
            item_id=item_id,
            actor=actor,
            schedule=row["name"],
            schedule_id=schedule_id,
            tick_at=tick,
            trigger=trigger,
        )
        await schedules.record_fire(
            conn,
            tenant=tenant,
            schedule_id=schedule_id,
            tick_at=tick,
            kind=kind,
            outcome="enqueued",
            item_id=item_id,
        )
        return item

    async def fire_due(self, *, now: datetime | None = None) -> float | None:
        """One pass over every due schedule; the seconds until the next one is due (None:
        there is no running schedule). `now` pins the clock (tests)."""
        async with self.db.conn() as conn:
            rows = await schedules.due_schedules(conn, limit=DUE_BATCH, now=now)
        for row in rows:
            if row["wait"] > 0:
                return float(row["wait"])
            await self.fire_schedule(row["tenant_id"], row["name"], now=now)
        return 0.0 if rows else None

    async def fire_schedule(self, tenant: str, name: str, *, now: datetime | None = None) -> int:
        """Fire the schedule's due ticks, if it is due and no other loop holds it; returns
        how many items were enqueued. A failed pass is logged and looked at again later."""
        try:
            return await self._pass(tenant, name, now)
        except Exception:
            log.exception("schedule %s/%s: the pass failed", tenant, name)
            try:
                async with self.db.tx() as conn:
                    await schedules.postpone(
                        conn, tenant=tenant, name=name, seconds=FAILED_PASS_RETRY
                    )
            except Exception as exc:  # the database may be what failed
                log.warning("schedule %s/%s: could not postpone: %s", tenant, name, exc)
            return 0

    async def _pass(self, tenant: str, name: str, now: datetime | None) -> int:
        fired: list[tuple[datetime, Row]] = []
        refused: tuple[datetime, errors.BacklogCapReachedError] | None = None
        async with self.db.tx() as conn:
            row = await schedules.claim(conn, tenant=tenant, name=name, now=now)
            if row is None:
                return 0
            clock: datetime = row["now"]
            schedule_id = str(row["schedule_id"])
            todo = plan(
                timing_of(row),
                cursor=row["next_tick_at"],
                now=clock,
                catch_up=CatchUp(row["catch_up"]),
                limit=row["catch_up_limit"],
                grace=self.grace,
            )
            for tick in todo.fire:
                try:
                    item = await self._fire(
                        conn, row, tick, trigger=False, actor=f"schedule:{name}"
                    )
                except errors.BacklogCapReachedError as exc:
                    refused = (tick, exc)
                    break
                fired.append((tick, item))
            next_tick, due_at = todo.next_tick, todo.next_tick
            if refused is not None:
                refused_tick, refusal = refused
                await schedules.record_fire(
                    conn,
                    tenant=tenant,
                    schedule_id=schedule_id,
                    tick_at=refused_tick,
                    kind="tick",
                    outcome="refused",
                    detail={"code": refusal.code, "detail": refusal.detail, **refusal.extensions},
                )
                next_tick, due_at = refused_tick, clock + REFUSAL_RETRY
            await schedules.drop_refused(
                conn, tenant=tenant, schedule_id=schedule_id, before=next_tick
            )
            await schedules.advance(
                conn,
                tenant=tenant,
                schedule_id=schedule_id,
                next_tick=next_tick,
                due_at=due_at,
                fired=len(fired),
                refused=int(refused is not None),
                dropped=todo.dropped,
            )
            if fired or refused is not None:
                await schedules.prune_fires(conn, tenant=tenant, schedule_id=schedule_id)
        for tick, item in fired:
            self.metrics.schedule_fires.labels(tenant, name).inc()
            self.metrics.schedule_lag_seconds.observe((item["created_at"] - tick).total_seconds())
        if refused is not None:
            self.metrics.schedule_refusals.labels(tenant, name).inc()
        if todo.dropped:
            self.metrics.schedule_skipped.labels(tenant, name).inc(todo.dropped)
        return len(fired)
