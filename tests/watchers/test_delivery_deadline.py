"""The class deadline of a delivery: each attempt's broker run carries what is left of it as
its wall deadline; its expiry, a request timeout and a cancellation are three outcomes.
A paused watcher's deadlines do not run; a replay starts its deadline again. An attempt is
cut at the loaded policy's attempt timeout."""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import timedelta
from pathlib import Path

import pytest

from queue_server.background.deliverer import Deliverer, RunReport
from queue_server.policy.v2 import OPERATION_RELIABILITY_V2
from queue_server.settings import Settings
from queue_server.store.types import Row
from queue_server.transport import TransportBroker
from tests.helpers.api import Api, policy_file
from tests.helpers.watchers import (
    Db,
    ModeReceiver,
    complete_one,
    deliver,
    make_due,
    paused_after_one,
    register,
    rows,
)

# The document's deadline, as written: the deliverer reads it through the loaded policy.
DEADLINE = OPERATION_RELIABILITY_V2["classes"]["watcher-delivery"]["deadline"]["seconds"]


def _leave(db: Db, seconds: float) -> None:
    """As if the pending rows' events were so long ago that `seconds` of the deadline are left."""
    db.execute(
        "UPDATE outbox_deliveries SET deadline_from = now() - make_interval(secs => %s)"
        " WHERE state = 'pending'",
        (DEADLINE - seconds,),
    )


def _letters(api: Api) -> list[dict[str, object]]:
    response = api.operator.get("/v1/tenants/acme/dead-letters", params={"kind": "delivery"})
    letters: list[dict[str, object]] = response.json()["dead_letters"]
    return letters


def test_request_timeout_wall_deadline_and_cancellation_are_three_receipt_outcomes(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    receiver.mode = "slow"
    register(api, receiver.url("/hook"))

    # 1. The attempt's own timeout: a retryable failure, the row waits for its next attempt.
    complete_one(api)
    report = deliver(settings, database_url, delivery_attempt_timeout=0.3)
    [timed_out] = rows(db)
    assert (report.failed, timed_out["state"]) == (1, "pending")
    assert [r["outcome"] for r in timed_out["receipts"]] == ["timeout"]
    db.execute("UPDATE outbox_deliveries SET state = 'cancelled' WHERE state = 'pending'")

    # 2. The delivery's deadline, 0.4 s away, is the run's wall deadline and binds before
    #    the 3 s attempt timeout: its own outcome, and the delivery is dead.
    complete_one(api)
    _leave(db, 0.4)
    started = time.monotonic()
    report = deliver(settings, database_url, delivery_attempt_timeout=3.0)
    [run] = report.runs.values()
    assert [r.outcome.value for r in run.receipts] == ["wall_deadline"]
    assert time.monotonic() - started < 2.5
    expired = rows(db)[1]
    assert (report.dead, expired["state"]) == (1, "dead")
    assert expired["last_outcome"]["outcome"] == "deadline_exceeded"
    assert [r["outcome"] for r in expired["receipts"]] == ["wall_deadline"]
    [letter] = _letters(api)
    assert str(letter["reason"]).startswith("deadline-exceeded")

    # 3. The deliverer stopped mid-dispatch: `cancelled`, and the row is back in the outbox.
    complete_one(api)
    seen = len(receiver.hook_requests())

    async def stop_mid_dispatch() -> None:
        async with Deliverer(settings, database_url) as deliverer:
            running = asyncio.create_task(deliverer.run_forever())
            while len(receiver.hook_requests()) == seen:
                await asyncio.sleep(0.01)
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running

    asyncio.run(stop_mid_dispatch())
    returned = rows(db)[2]
    assert returned["state"] == "pending"
    assert returned["claim_token"] is None
    assert returned["attempts"] == 1
    assert [r["outcome"] for r in returned["receipts"]] == ["cancelled"]
    assert returned["last_outcome"]["outcome"] == "cancelled"
    # Due at once: the next deliverer sends it again under the same key.
    receiver.mode = "ok"
    assert deliver(settings, database_url).delivered == 1
    keys = [r.headers["webhook-id"] for r in receiver.hook_requests()[-2:]]
    assert keys == [returned["delivery_key"]] * 2


def test_an_attempt_is_cut_at_the_loaded_policy_attempt_timeout(
    api: Api,
    db: Db,
    receiver: ModeReceiver,
    settings: Settings,
    database_url: str,
    tmp_path: Path,
) -> None:
    receiver.mode = "hold?s=1.5"  # a 200 after 1.5 s
    register(api, receiver.url("/hook"))
    complete_one(api)
    quick = policy_file(
        tmp_path / "quick-deliveries.json",
        {"watcher-delivery": {"attempt-timeout": {"seconds": 0.3, "on-timeout": "fail-attempt"}}},
        version="test.quick-deliveries",
    )
    # No setting of its own: the attempt timeout is the loaded policy's, 0.3 s, not the
    # built-in 10 s: the attempt is cut before the answer comes.
    report = deliver(settings, database_url, policy=str(quick), delivery_attempt_timeout=None)
    [row] = rows(db)
    assert (report.failed, row["state"], row["attempts"]) == (1, "pending", 1)
    assert row["last_outcome"]["failure_class"] == "attempt-timeout"
    assert [r["outcome"] for r in row["receipts"]] == ["timeout"]


def test_every_attempt_run_carries_the_delivery_deadline_left(
    api: Api,
    db: Db,
    receiver: ModeReceiver,
    settings: Settings,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    register(api, receiver.url("/hook"))
    complete_one(api)
    _leave(db, 100.0)
    seen: list[float | None] = []
    original = Deliverer._broker

    def observed(self: Deliverer, row: Row) -> TransportBroker:
        broker = original(self, row)
        seen.append(broker.remaining())
        return broker

    monkeypatch.setattr(Deliverer, "_broker", observed)
    assert deliver(settings, database_url).delivered == 1
    [left] = seen
    assert left is not None
    assert 95.0 < left <= 100.0


def test_a_pending_delivery_past_its_deadline_is_dead_without_an_attempt(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    register(api, receiver.url("/hook"))
    complete_one(api)
    complete_one(api)
    _leave(db, -1.0)
    fresh_seq = rows(db)[1]["seq"]
    db.execute("UPDATE outbox_deliveries SET deadline_from = now() WHERE seq = %s", (fresh_seq,))
    report = deliver(settings, database_url)
    assert (report.expired, report.delivered) == (1, 1)
    overdue, fresh = rows(db)
    assert (overdue["state"], overdue["attempts"]) == ("dead", 0)
    assert overdue["last_outcome"]["outcome"] == "deadline_exceeded"
    assert fresh["state"] == "delivered"
    assert len(receiver.hook_requests()) == 1
    [letter] = _letters(api)
    assert letter["delivery_id"] == str(overdue["delivery_id"])
    assert str(letter["reason"]).startswith("deadline-exceeded")

    # A replay starts the deadline again: delivered, same key.
    replayed = api.operator.post(
        f"/v1/tenants/acme/dead-letters/{letter['dead_letter_id']}/replay",
        headers={"Idempotency-Key": "replay-overdue"},
    )
    assert replayed.status_code == 200, replayed.text
    assert deliver(settings, database_url).delivered == 1
    assert receiver.hook_requests()[-1].headers["webhook-id"] == overdue["delivery_key"]


def test_a_delivery_in_flight_past_its_deadline_ends_by_its_own_attempt(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    receiver.mode = "hold?s=0.5"  # a 200 after 0.5 s
    register(api, receiver.url("/hook"))
    complete_one(api)

    async def sweep_mid_attempt() -> tuple[RunReport, RunReport]:
        async with (
            Deliverer(settings, database_url) as sending,
            Deliverer(settings, database_url) as sweeping,
        ):
            attempt = asyncio.create_task(sending.run_once())
            while not receiver.hook_requests():
                await asyncio.sleep(0.01)
            # The deadline runs out while the request is in flight, and another deliverer
            # sweeps overdue rows: a claimed row is not its to expire.
            _leave(db, -1.0)
            swept = await sweeping.run_once()
            return await attempt, swept

    sent, swept = asyncio.run(sweep_mid_attempt())
    assert (swept.expired, sent.delivered, sent.lost) == (0, 1, 0)
    [row] = rows(db)
    assert row["state"] == "delivered"
    assert [r["outcome"] for r in row["receipts"]] == ["succeeded"]
    assert _letters(api) == []


def test_a_pause_does_not_count_toward_the_deadline(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    paused = register(api, receiver.url("/hook"))
    running = register(api, receiver.url("/hook"))
    complete_one(api)
    path = f"/v1/tenants/acme/watchers/{paused['watcher_id']}"
    assert api.operator.post(f"{path}/pause", headers={"Idempotency-Key": "p"}).status_code == 200
    # Both events are nearly a day old: 60 s of their deadline are left ...
    _leave(db, 60.0)
    # ... and the pause began two days ago: it held the row for longer than the deadline.
    db.execute(
        "UPDATE watchers SET paused_at = now() - interval '2 days' WHERE watcher_id = %s",
        (paused["watcher_id"],),
    )
    # While paused its deadline does not run out: nothing expires (the other watcher's
    # receiver fails meanwhile, so its row stays pending too).
    receiver.mode = "fail"
    report = deliver(settings, database_url)
    assert (report.expired, report.failed) == (0, 1)
    before = {str(r["watcher_id"]): r for r in rows(db)}
    # Pausing it again changes nothing: its pause still began two days ago.
    assert api.operator.post(f"{path}/pause", headers={"Idempotency-Key": "p2"}).status_code == 200
    resumed = api.operator.post(f"{path}/resume", headers={"Idempotency-Key": "r"})
    assert resumed.status_code == 200
    after = {str(r["watcher_id"]): r for r in rows(db)}
    held = after[paused["watcher_id"]]
    # The resume moved its deadline on by the two days it spent paused.
    moved = held["deadline_from"] - before[paused["watcher_id"]]["deadline_from"]
    assert timedelta(days=2) <= moved < timedelta(days=2, seconds=30)
    assert (
        after[running["watcher_id"]]["deadline_from"]
        == (before[running["watcher_id"]]["deadline_from"])
    )
    # Past the 60 s left, the row of the watcher that kept running is dead; the paused
    # one's still has two days.
    db.execute("UPDATE outbox_deliveries SET deadline_from = deadline_from - interval '61 s'")
    make_due(db)
    receiver.mode = "ok"
    report = deliver(settings, database_url)
    assert (report.expired, report.delivered) == (1, 1), report
    states = {str(r["watcher_id"]): r["state"] for r in rows(db)}
    assert states == {paused["watcher_id"]: "delivered", running["watcher_id"]: "dead"}


def test_a_paused_watchers_rows_past_their_deadline_wait_for_the_resume(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    watcher, path = paused_after_one(api, receiver.url("/hook"))
    # Paused for two days: its row's deadline would have run out a minute ago.
    _leave(db, -60.0)
    db.execute(
        "UPDATE watchers SET paused_at = now() - interval '2 days' WHERE watcher_id = %s",
        (watcher["watcher_id"],),
    )
    report = deliver(settings, database_url)
    assert (report.expired, report.claimed) == (0, 0)
    [held] = rows(db)
    assert held["state"] == "pending"
    assert _letters(api) == []
    # The resume gives the row back the two days it waited: it is delivered, not dead.
    assert api.operator.post(f"{path}/resume", headers={"Idempotency-Key": "r"}).status_code == 200
    report = deliver(settings, database_url)
    assert (report.expired, report.delivered) == (0, 1)
    assert rows(db)[0]["state"] == "delivered"


def test_a_running_deliverer_sweeps_overdue_rows_again_each_poll_interval(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    receiver.mode = "fail"
    register(api, receiver.url("/hook"))
    complete_one(api)

    async def two_runs() -> tuple[RunReport, RunReport]:
        async with Deliverer(settings, database_url) as deliverer:
            first = await deliverer.run_once()
            # The failed row's deadline runs out while it waits for its next attempt.
            _leave(db, -1.0)
            await asyncio.sleep(2 * settings.delivery_poll_interval)
            return first, await deliverer.run_once()

    first, second = asyncio.run(two_runs())
    assert (first.failed, first.expired) == (1, 0)
    assert second.expired == 1
    [row] = rows(db)
    assert (row["state"], row["last_outcome"]["outcome"]) == ("dead", "deadline_exceeded")
    [letter] = _letters(api)
    assert str(letter["reason"]).startswith("deadline-exceeded")


def test_a_row_past_its_deadline_is_not_sent_by_a_run_between_two_sweeps(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    # Overdue rows are moved to dead once per poll interval, not by every run; a run in
    # between still sends none of them: past its deadline an attempt could only be late.
    register(api, receiver.url("/hook"))
    slow_sweeps = settings.model_copy(update={"delivery_poll_interval": 600.0})

    async def runs() -> tuple[RunReport, RunReport]:
        async with Deliverer(slow_sweeps, database_url) as deliverer:
            swept = await deliverer.run_once()  # the sweep of this interval: nothing overdue
            complete_one(api)
            _leave(db, -1.0)  # its deadline passed a second ago
            return swept, await deliverer.run_once()

    swept, between = asyncio.run(runs())
    assert (swept.claimed, between.claimed) == (0, 0)
    assert receiver.hook_requests() == []
    [row] = rows(db)
    assert row["state"] == "pending"
    report = deliver(settings, database_url)  # the next interval's sweep
    assert (report.expired, report.claimed) == (1, 0)
    assert rows(db)[0]["state"] == "dead"
    assert receiver.hook_requests() == []
