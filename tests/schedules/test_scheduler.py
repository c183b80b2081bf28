"""The scheduler pass on a real PostgreSQL with the clock pinned: catch-up rules, both DST
transitions of Europe/Berlin, the backlog cap's refusal path, and racing passes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import pytest

from tests.helpers.schedules import Db, Scheduler

T = TypeVar("T")
Run = Callable[[Callable[[Scheduler], Awaitable[T]]], T]


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def utc(*ticks: str) -> list[datetime]:
    return [at(t) for t in ticks]


T0 = at("2026-06-01T12:00:00")


def test_catch_up_rules_after_eleven_missed_minutes(with_scheduler: Run[Any]) -> None:
    """every: 60, cursor at T0, servers back at T0 + 10 min 30 s: ticks T0..T0+10m are due,
    all older than the 15 s grace."""
    now = T0 + timedelta(minutes=10, seconds=30)

    async def scenario(s: Scheduler) -> Scheduler:
        for rule in ("skip", "latest", "all-bounded"):
            await s.put(rule, queue="q", every=60, catch_up=rule, catch_up_limit=4)
            s.start_at(rule, T0)
        assert await s.run(now) is not None
        return s

    s = with_scheduler(scenario)
    assert s.ticks("skip") == []
    assert s.ticks("latest") == [T0 + timedelta(minutes=10)]
    assert s.ticks("all-bounded") == [T0 + timedelta(minutes=m) for m in (7, 8, 9, 10)]
    for rule, skipped in (("skip", 11), ("latest", 10), ("all-bounded", 7)):
        row = s.row(rule)
        assert (row["skipped"], row["fires"], row["refusals"]) == (skipped, 11 - skipped, 0), rule
        # The cursor is past every settled tick: the next one after now.
        assert row["next_tick_at"] == row["due_at"] == T0 + timedelta(minutes=11)


def test_on_time_ticks_fire_under_every_rule(with_scheduler: Run[Any]) -> None:
    """A pass a few seconds late (within the grace) fires every due tick, whatever the rule."""

    async def scenario(s: Scheduler) -> None:
        for rule in ("skip", "latest", "all-bounded"):
            await s.put(rule, queue="q", every=1, catch_up=rule)
            s.start_at(rule, T0)
        await s.run(T0 + timedelta(seconds=3.5))
        for rule in ("skip", "latest", "all-bounded"):
            assert s.ticks(rule) == [T0 + timedelta(seconds=n) for n in range(4)], rule

    with_scheduler(scenario)


def test_a_pass_before_the_next_tick_fires_nothing_and_says_how_long_to_wait(
    with_scheduler: Run[Any],
) -> None:
    """Half a second before its tick a schedule is not fired: the pass answers the half
    second the loop sleeps (not 0, which would have it look again at once, and again); nor
    by a claim of it (a pass that listed it as due as another pass moved it on)."""

    async def scenario(s: Scheduler) -> tuple[float | None, int, Scheduler]:
        await s.put("soon", queue="q", every=60)
        s.start_at("soon", T0)
        early = T0 - timedelta(seconds=0.5)
        return (
            await s.run(early),
            await s.services.schedules.fire_schedule("acme", "soon", now=early),
            s,
        )

    wait, claimed, s = with_scheduler(scenario)
    assert (wait, claimed) == (pytest.approx(0.5), 0)
    assert s.ticks("soon") == []
    assert s.row("soon")["fires"] == 0


def test_spring_forward_in_berlin_fires_the_missing_hour_once(with_scheduler: Run[Any]) -> None:
    """2026-03-29 02:00 CET -> 03:00 CEST: 02:30 does not exist that day."""

    async def scenario(s: Scheduler) -> Scheduler:
        await s.put("daily", queue="q", cron="30 2 * * *", timezone="Europe/Berlin")
        await s.put("half-hourly", queue="q", cron="*/30 * * * *", timezone="Europe/Berlin")
        s.start_at("daily", at("2026-03-27T12:00:00"))
        s.start_at("half-hourly", at("2026-03-29T00:00:00"))
        # A live loop: a pass every 5 minutes of the night, and the next days.
        now = at("2026-03-27T12:00:00")
        while now <= at("2026-03-31T03:00:00"):
            await s.run(now)
            now += timedelta(minutes=5)
        return s

    s = with_scheduler(scenario)
    # 02:30 CET on the 28th, 03:00 CEST on the 29th (the first instant after the gap),
    # then 02:30 CEST.
    assert s.ticks("daily") == utc(
        "2026-03-28T01:30:00", "2026-03-29T01:00:00", "2026-03-30T00:30:00", "2026-03-31T00:30:00"
    )
    night = [t for t in s.ticks("half-hourly") if t < at("2026-03-29T02:01:00")]
    # 01:00, 01:30 CET; 02:00 and 02:30 do not exist and fall on 03:00 CEST once; 03:30, 04:00.
    assert night == utc(
        "2026-03-29T00:00:00",
        "2026-03-29T00:30:00",
        "2026-03-29T01:00:00",
        "2026-03-29T01:30:00",
        "2026-03-29T02:00:00",
    )
    assert s.row("daily")["skipped"] == 0


def test_fall_back_in_berlin_fires_the_repeated_hour_once(with_scheduler: Run[Any]) -> None:
    """2026-10-25 03:00 CEST -> 02:00 CET: 02:00-02:59 happen twice, and fire once."""

    async def scenario(s: Scheduler) -> Scheduler:
        await s.put("daily", queue="q", cron="30 2 * * *", timezone="Europe/Berlin")
        await s.put("half-hourly", queue="q", cron="*/30 * * * *", timezone="Europe/Berlin")
        s.start_at("daily", at("2026-10-23T12:00:00"))
        s.start_at("half-hourly", at("2026-10-24T23:00:00"))
        now = at("2026-10-23T12:00:00")
        while now <= at("2026-10-26T03:00:00"):
            await s.run(now)
            now += timedelta(minutes=5)
        return s

    s = with_scheduler(scenario)
    assert s.ticks("daily") == utc(
        "2026-10-24T00:30:00", "2026-10-25T00:30:00", "2026-10-26T01:30:00"
    )
    night = [t for t in s.ticks("half-hourly") if t < at("2026-10-25T02:31:00")]
    # 01:00, 01:30, 02:00, 02:30 CEST; the second 02:00 and 02:30 (CET) do not fire; 03:00 CET.
    assert night == utc(
        "2026-10-24T23:00:00",
        "2026-10-24T23:30:00",
        "2026-10-25T00:00:00",
        "2026-10-25T00:30:00",
        "2026-10-25T02:00:00",
        "2026-10-25T02:30:00",
    )


def test_dst_ticks_missed_over_both_transitions_are_caught_up_once_each(
    with_scheduler: Run[Any],
) -> None:
    """all-bounded after a week down across each transition: one item per wall-clock tick."""

    async def scenario(s: Scheduler) -> Scheduler:
        await s.put(
            "spring", queue="q", cron="30 2 * * *", timezone="Europe/Berlin", catch_up="all-bounded"
        )
        await s.put(
            "fall", queue="q", cron="30 2 * * *", timezone="Europe/Berlin", catch_up="all-bounded"
        )
        s.start_at("spring", at("2026-03-28T12:00:00"))
        s.start_at("fall", at("2026-10-24T12:00:00"))
        fire = s.services.schedules.fire_schedule
        assert await fire("acme", "spring", now=at("2026-03-30T12:00:00")) == 2
        assert await fire("acme", "fall", now=at("2026-10-26T12:00:00")) == 2
        return s

    s = with_scheduler(scenario)
    assert s.ticks("spring") == utc("2026-03-29T01:00:00", "2026-03-30T00:30:00")
    assert s.ticks("fall") == utc("2026-10-25T00:30:00", "2026-10-26T01:30:00")


def _fill(db: Db, cap: int) -> None:
    """The tenant's backlog at its cap."""
    db.execute("UPDATE tenants SET backlog_cap = %s WHERE tenant_id = 'acme'", (cap,))


async def refused_at_t0(s: Scheduler, db: Db) -> None:
    """Schedule "s" (every minute from T0, all-bounded) with the backlog full (1 of 1, by a
    trigger), and a pass 2 s after T0: the T0 tick refused."""
    await s.put("s", queue="q", every=60, catch_up="all-bounded")
    s.start_at("s", T0)
    db.execute("UPDATE tenants SET backlog_cap = 1 WHERE tenant_id = 'acme'")
    assert await s.trigger("s") == 201  # the backlog is now full (1 of 1)
    await s.run(T0 + timedelta(seconds=2))


def test_a_tick_refused_at_the_cap_is_recorded_and_retried_under_all_bounded(
    with_scheduler: Run[Any], db: Db
) -> None:
    async def scenario(s: Scheduler) -> None:
        await refused_at_t0(s, db)
        assert s.ticks("s") == []
        [refused] = [f for f in s.fires("s") if f["kind"] == "tick"]
        assert (refused["tick_at"], refused["outcome"], refused["attempts"]) == (T0, "refused", 1)
        assert refused["detail"]["code"] == "backlog-cap-reached"
        assert (refused["detail"]["backlog"], refused["detail"]["backlog_cap"]) == (1, 1)
        row = s.row("s")
        assert (row["next_tick_at"], row["refusals"]) == (T0, 1)
        # Not again before the retry delay; then again, refused again.
        await s.run(T0 + timedelta(seconds=2.5))
        assert s.row("s")["refusals"] == 1
        await s.run(T0 + timedelta(seconds=3.5))
        assert s.row("s")["refusals"] == 2
        shown = await s.show("s")
        assert (shown["refusals"], shown["next_fires"][0]) == (2, "2026-06-01T12:00:00Z")
        # Newest first: the trigger ran at the real clock's now, after the pinned T0.
        assert [(f["kind"], f["outcome"], f["attempts"]) for f in shown["recent_fires"]] == [
            ("trigger", "enqueued", 1),
            ("tick", "refused", 2),
        ]
        # Room again, three minutes later: the refused tick and the two since, once each.
        db.execute("UPDATE tenants SET backlog_cap = 10 WHERE tenant_id = 'acme'")
        await s.run(T0 + timedelta(minutes=2, seconds=1))
        assert s.ticks("s") == [T0, T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)]
        first = next(f for f in s.fires("s") if f["tick_at"] == T0 and f["kind"] == "tick")
        assert (first["outcome"], first["attempts"]) == ("enqueued", 3)
        assert s.row("s")["skipped"] == 0

    with_scheduler(scenario)


def test_a_put_that_keeps_the_ticks_keeps_a_refused_ticks_retry_delay(
    with_scheduler: Run[Any], db: Db
) -> None:
    async def scenario(s: Scheduler) -> None:
        await refused_at_t0(s, db)
        refused = s.row("s")
        assert refused["next_tick_at"] == T0 < refused["due_at"]  # waits out its retry delay
        # Another payload, the same ticks: the refused tick keeps its place and its delay.
        await s.put("s", queue="q", every=60, catch_up="all-bounded", priority=3)
        row = s.row("s")
        assert (row["next_tick_at"], row["due_at"], row["priority"]) == (T0, refused["due_at"], 3)

    with_scheduler(scenario)


def test_a_refused_tick_is_dropped_once_missed_under_skip(with_scheduler: Run[Any], db: Db) -> None:
    async def scenario(s: Scheduler) -> None:
        await s.put("s", queue="q", every=60, catch_up="skip")
        s.start_at("s", T0)
        db.execute("UPDATE tenants SET backlog_cap = 1 WHERE tenant_id = 'acme'")
        assert await s.trigger("s") == 201
        await s.run(T0 + timedelta(seconds=1))
        await s.run(T0 + timedelta(seconds=10))  # still on time: tried again
        assert s.row("s")["refusals"] == 2
        db.execute("UPDATE tenants SET backlog_cap = 10 WHERE tenant_id = 'acme'")
        # Room again, but T0 is 40 s old (missed): skip drops it; T0 + 1 min fires on time.
        await s.run(T0 + timedelta(seconds=61))
        assert s.ticks("s") == [T0 + timedelta(minutes=1)]
        [dropped, fired] = [f for f in s.fires("s") if f["kind"] == "tick"]
        assert (dropped["tick_at"], dropped["outcome"], dropped["item_id"]) == (T0, "dropped", None)
        assert fired["outcome"] == "enqueued"
        assert s.row("s")["skipped"] == 1

    with_scheduler(scenario)


def test_a_paused_schedule_is_neither_due_nor_fired(with_scheduler: Run[Any]) -> None:
    """Paused with ticks behind its cursor: a pass finds no running schedule, and a pass
    that listed it as due just before the pause fires nothing."""

    async def scenario(s: Scheduler) -> None:
        await s.put("s", queue="q", every=60)
        s.start_at("s", T0)
        await s.put("s", queue="q", every=60, paused=True)
        now = T0 + timedelta(minutes=2, seconds=1)
        assert await s.run(now) is None
        assert await s.services.schedules.fire_schedule("acme", "s", now=now) == 0
        assert s.ticks("s") == []
        row = s.row("s")
        assert (row["next_tick_at"], row["fires"], row["skipped"]) == (T0, 0, 0)

    with_scheduler(scenario)


@pytest.mark.parametrize("by", ["put", "resume"])
def test_a_resume_starts_after_now_without_the_paused_ticks(
    with_scheduler: Run[Any], db: Db, by: str
) -> None:
    async def scenario(s: Scheduler) -> None:
        await s.put("s", queue="q", every=60, catch_up="all-bounded")
        found = db.execute("SELECT now() AS now").fetchone()
        assert found is not None
        clock = found["now"]
        assert isinstance(clock, datetime)
        s.start_at("s", clock - timedelta(minutes=10))
        # Resumed by a PUT with `paused: false`, or by the resume route (after the pause
        # route): the ticks of the pause are not missed ticks.
        if by == "put":
            await s.put("s", queue="q", every=60, catch_up="all-bounded", paused=True)
            await s.put("s", queue="q", every=60, catch_up="all-bounded", paused=False)
        else:
            assert (await s.pause("s"), await s.pause("s", False)) == (200, 200)
        row = s.row("s")
        assert row["next_tick_at"] == row["due_at"] > clock
        await s.run(clock)
        assert s.ticks("s") == []

    with_scheduler(scenario)


def test_a_schedule_keeps_its_newest_hundred_fire_rows(with_scheduler: Run[Any]) -> None:
    async def scenario(s: Scheduler) -> None:
        await s.put("s", queue="q", every=1, catch_up="all-bounded", catch_up_limit=105)
        s.start_at("s", T0)
        assert await s.run(T0 + timedelta(seconds=104)) is not None
        assert len(s.ticks("s")) == 105
        kept = [f["tick_at"] for f in s.fires("s")]
        assert kept == [T0 + timedelta(seconds=n) for n in range(5, 105)]

    with_scheduler(scenario)


def test_racing_passes_enqueue_each_tick_once(with_scheduler: Run[Any]) -> None:
    """Twelve passes at once on their own connections, again and again as time advances."""

    async def scenario(s: Scheduler) -> None:
        await s.put("s", queue="q", every=1, catch_up="all-bounded")
        s.start_at("s", T0)
        for second in range(10):
            now = T0 + timedelta(seconds=second, milliseconds=300)
            fired = await asyncio.gather(
                *(s.services.schedules.fire_schedule("acme", "s", now=now) for _ in range(12))
            )
            assert sum(fired) == 1, fired
        assert s.ticks("s") == [T0 + timedelta(seconds=n) for n in range(10)]
        assert s.row("s")["fires"] == 10

    with_scheduler(scenario)
