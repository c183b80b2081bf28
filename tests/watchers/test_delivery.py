"""The deliverer against real local receivers: signatures, outcomes, the persisted schedule,
410, budgets, pause order and concurrent deliverers."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import pytest
from standardwebhooks.webhooks import Webhook

from queue_server.background.deliverer import Deliverer, RunReport
from queue_server.settings import Settings
from queue_server.store.types import Row
from queue_server.transport import Budget
from tests.helpers.api import Api
from tests.helpers.watchers import (
    SCALE,
    Db,
    ModeReceiver,
    complete_one,
    deliver,
    make_due,
    register,
    rows,
    wait_until,
)


def test_delivery_arrives_signed_with_the_delivery_key(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    watcher = register(api, receiver.url("/hook"))
    item_id = complete_one(api, payload={"to": "a@example.com"})
    report = deliver(settings, database_url)
    assert report.delivered == 1
    [seen] = receiver.hook_requests()
    [row] = rows(db)
    assert seen.headers["webhook-id"] == row["delivery_key"]
    # The receiver verifies with the reference Standard Webhooks library.
    payload = Webhook(watcher["secret"]).verify(seen.body, seen.headers)
    assert payload["event"] == "item.completed"
    assert payload["item"]["item_id"] == item_id
    assert payload["item"]["state"] == "completed"
    assert payload["item"]["payload"] == {"to": "a@example.com"}
    assert row["state"] == "delivered"
    assert row["attempts"] == 1
    assert row["next_attempt_at"] is None
    [receipt] = row["receipts"]
    assert receipt["outcome"] == "succeeded"
    assert receipt["status"] == 200
    assert receipt["attempt"] == 1
    # Receipts name the host and a hash, never the path.
    assert "/hook" not in json.dumps(row["receipts"])
    assert watcher["secret"] not in json.dumps(row["receipts"])


def test_failing_receiver_is_retried_on_the_persisted_schedule_then_dead_lettered(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    receiver.mode = "fail"
    register(api, receiver.url("/hook"))
    complete_one(api)
    # The policy's schedule (30 s, times 4 each attempt), scaled.
    delays = [30 * SCALE, 120 * SCALE, 480 * SCALE, 1920 * SCALE]
    for attempt in range(1, 6):
        make_due(db)
        report = deliver(settings, database_url)
        assert report.claimed == 1
        [row] = rows(db)
        assert row["attempts"] == attempt
        if attempt < 5:
            assert row["state"] == "pending"
            # The next instant is the policy's delay after this attempt, exactly.
            gap = row["next_attempt_at"] - row["last_attempt_at"]
            assert gap == timedelta(seconds=delays[attempt - 1])
            assert row["due_at"] == max(row["next_attempt_at"], row["due_at"])
        assert row["last_outcome"]["status"] == 500
    assert row["state"] == "dead"
    assert row["next_attempt_at"] is None
    assert [r["attempt"] for r in row["receipts"]] == [1, 2, 3, 4, 5]
    keys = {r.headers["webhook-id"] for r in receiver.hook_requests()}
    assert keys == {row["delivery_key"]}
    assert len(receiver.hook_requests()) == 5
    letters = api.operator.get("/v1/tenants/acme/dead-letters", params={"kind": "delivery"}).json()
    [letter] = letters["dead_letters"]
    assert letter["delivery_id"] == str(row["delivery_id"])
    assert letter["last_failure"]["status"] == 500
    # A sixth run finds nothing: the budget is spent.
    make_due(db)
    assert deliver(settings, database_url).claimed == 0


def test_a_failed_attempt_is_due_again_at_its_instant_not_when_its_claim_ends(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    receiver.mode = "fail"
    register(api, receiver.url("/hook"))
    complete_one(api)
    assert deliver(settings, database_url).failed == 1
    [row] = rows(db)
    # The claim's lease (2 x the 1 s attempt timeout + 1 s) is far longer than the 0.03 s
    # first delay: recording the attempt makes the row due at the delay's instant.
    assert row["due_at"] == row["next_attempt_at"]
    assert row["next_attempt_at"] - row["last_attempt_at"] == timedelta(seconds=30 * SCALE)
    receiver.mode = "ok"
    wait_until(lambda: deliver(settings, database_url).delivered == 1, "the retry", timeout=2.0)
    assert rows(db)[0]["attempts"] == 2


def test_unscaled_schedule_is_persisted_at_the_policy_instants(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    receiver.mode = "fail"
    register(api, receiver.url("/hook"))
    complete_one(api)
    real = settings.model_copy(update={"delivery_backoff_scale": 1.0})
    expected_gaps = [30, 120, 480, 1920]
    for attempt in range(1, 5):
        make_due(db)
        assert deliver(real, database_url).claimed == 1
        [row] = rows(db)
        assert row["next_attempt_at"] - row["last_attempt_at"] == timedelta(
            seconds=expected_gaps[attempt - 1]
        )
        # Not due before its instant: a run now claims nothing.
        assert deliver(real, database_url).claimed == 0
    make_due(db)
    deliver(real, database_url)
    assert rows(db)[0]["state"] == "dead"


class _DiedError(Exception):
    """The deliverer is gone right after its claim committed."""


def _die(_: list[Row]) -> None:
    raise _DiedError


def _claim_and_die(settings: Settings, database_url: str) -> None:
    """A deliverer claims the due rows and is gone before it sends them."""

    async def claim_and_die() -> None:
        async with Deliverer(settings, database_url, on_claimed=_die) as deliverer:
            await deliverer.run_once()

    with pytest.raises(_DiedError):
        asyncio.run(claim_and_die())


def test_a_claim_lost_with_its_deliverer_is_taken_over_under_the_same_key(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    register(api, receiver.url("/hook"))
    complete_one(api)
    _claim_and_die(settings, database_url)
    [held] = rows(db)
    assert (held["attempts"], held["claim_token"] is not None) == (1, True)
    assert receiver.hook_requests() == []
    # While the lost claim runs nobody else sends the row ...
    assert deliver(settings, database_url).claimed == 0
    # ... and once it has expired the next deliverer takes the row over.
    db.execute("UPDATE outbox_deliveries SET claimed_until = now(), due_at = now()")
    assert deliver(settings, database_url).delivered == 1
    [row] = rows(db)
    assert (row["state"], row["attempts"]) == ("delivered", 2)
    assert [r.headers["webhook-id"] for r in receiver.hook_requests()] == [held["delivery_key"]]


ANOTHER = "00000000-0000-4000-8000-00000000000a"  # another deliverer's claim token


def test_a_deliverer_whose_claim_was_taken_over_meanwhile_records_nothing(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    # Its claim expires while it sends, and another deliverer claims the row (a token of
    # its own): the late sender's outcome is not the row's, whatever the receiver said.
    register(api, receiver.url("/hook"))
    complete_one(api)

    def taken_over(claimed: list[Row]) -> None:
        db.execute("UPDATE outbox_deliveries SET claim_token = %s", (ANOTHER,))

    async def late() -> RunReport:
        async with Deliverer(settings, database_url, on_claimed=taken_over) as deliverer:
            return await deliverer.run_once()

    report = asyncio.run(late())
    assert len(receiver.hook_requests()) == 1  # it did send
    assert (report.lost, report.delivered) == (1, 0)
    [row] = rows(db)
    assert (row["state"], str(row["claim_token"]), row["attempts"]) == ("pending", ANOTHER, 1)


def test_a_last_attempt_lost_with_its_deliverer_is_dead_and_never_sent_again(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    """The deliverer that claimed the policy's last attempt died before sending it: the one
    that takes the row over sends nothing more; the row is dead, saying which attempt was
    never recorded, and is in the dead letters."""
    receiver.mode = "fail"
    register(api, receiver.url("/hook"))
    complete_one(api)
    for _ in range(4):
        make_due(db)
        assert deliver(settings, database_url).claimed == 1
    make_due(db)
    _claim_and_die(settings, database_url)
    db.execute("UPDATE outbox_deliveries SET claimed_until = now(), due_at = now()")
    assert deliver(settings, database_url).claimed == 1
    [row] = rows(db)
    assert row["state"] == "dead"
    assert row["last_outcome"]["outcome"] == "abandoned"
    assert row["last_outcome"]["attempt"] == 5
    assert len(receiver.hook_requests()) == 4
    letters = api.operator.get("/v1/tenants/acme/dead-letters", params={"kind": "delivery"}).json()
    [letter] = letters["dead_letters"]
    assert letter["delivery_id"] == str(row["delivery_id"])
    assert "attempt 5 was never recorded" in letter["reason"]
    make_due(db)
    assert deliver(settings, database_url).claimed == 0


@pytest.mark.parametrize(
    ("mode", "outcome", "status", "failure_class"),
    [
        ("fail", "http_error", 500, "dependency-unavailable"),
        ("status?code=503", "http_error", 503, "dependency-unavailable"),
        ("status?code=429", "http_error", 429, "rate-limited"),
        ("reset", "transport_error", None, "transport-error"),
        ("slow", "timeout", None, "attempt-timeout"),
    ],
)
def test_a_retryable_failure_is_a_failed_attempt_with_its_receipt(
    api: Api,
    db: Db,
    receiver: ModeReceiver,
    settings: Settings,
    database_url: str,
    mode: str,
    outcome: str,
    status: int | None,
    failure_class: str,
) -> None:
    receiver.mode = mode
    register(api, receiver.url("/hook"))
    complete_one(api)
    # Short only where the timeout is the point: on a busy machine the receiver's thread can
    # take more than half a second to answer a request it answers at once.
    timeout = 0.5 if mode == "slow" else 5.0
    report = deliver(settings, database_url, delivery_attempt_timeout=timeout)
    assert report.failed == 1
    [row] = rows(db)
    assert row["state"] == "pending"
    assert row["last_outcome"]["outcome"] == outcome
    assert row["last_outcome"]["status"] == status
    assert row["last_outcome"]["failure_class"] == failure_class
    [receipt] = row["receipts"]
    assert receipt["outcome"] == outcome
    # The receiver records a request from its own thread once it has read it: on a busy
    # machine a timed-out attempt can return before that thread has run.
    wait_until(lambda: len(receiver.hook_requests()) >= 1, "the attempt reached the receiver", 5)
    assert len(receiver.hook_requests()) == 1


@pytest.mark.parametrize(
    ("mode", "outcome", "status"),
    [
        ("notfound", "http_error", 404),
        ("status?code=400", "http_error", 400),
        ("status?code=401", "http_error", 401),
        ("redirect", "redirect_refused", 302),
    ],
)
def test_any_other_answer_is_a_dead_delivery_after_one_attempt(
    api: Api,
    db: Db,
    receiver: ModeReceiver,
    settings: Settings,
    database_url: str,
    mode: str,
    outcome: str,
    status: int,
) -> None:
    receiver.mode = mode
    register(api, receiver.url("/hook"))
    complete_one(api)
    report = deliver(settings, database_url)
    assert report.dead == 1
    [row] = rows(db)
    assert (row["state"], row["attempts"]) == ("dead", 1)
    assert row["last_outcome"]["outcome"] == outcome
    assert row["last_outcome"]["failure_class"] is None
    [receipt] = row["receipts"]
    assert (receipt["outcome"], receipt["status"]) == (outcome, status)
    letters = api.operator.get("/v1/tenants/acme/dead-letters", params={"kind": "delivery"})
    [letter] = letters.json()["dead_letters"]
    assert letter["reason"] == f"not-retryable: the receiver answered {status}"
    # A redirect is never followed, and nothing is sent again.
    make_due(db)
    assert deliver(settings, database_url).claimed == 0
    assert [r.target for r in receiver.requests] == ["/hook"]


def test_huge_response_body_is_cut_at_the_collection_bound(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    receiver.mode = "huge?n=5000000"
    register(api, receiver.url("/hook"))
    complete_one(api)
    report = deliver(settings, database_url)
    assert report.delivered == 1
    [row] = rows(db)
    [receipt] = row["receipts"]
    assert receipt["status"] == 200
    # Collection stops at the broker's per-dispatch bound; far less than 5 MB was charged.
    assert 64 * 1024 <= receipt["response_bytes"] < 200 * 1024
    assert len(row["last_outcome"]["response_prefix"]) <= 512


def test_gone_disables_the_watcher_and_cancels_its_pending_deliveries(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    receiver.mode = "gone"
    watcher = register(api, receiver.url("/hook"))
    complete_one(api)
    complete_one(api)
    report = deliver(settings, database_url)
    assert report.gone == 1
    assert len(receiver.hook_requests()) == 1
    assert [r["state"] for r in rows(db)] == ["cancelled", "cancelled"]
    shown = api.operator.get(f"/v1/tenants/acme/watchers/{watcher['watcher_id']}").json()
    assert shown["state"] == "disabled"
    assert "410" in shown["disabled_reason"]
    complete_one(api)
    assert len(rows(db)) == 2
    # Disabled, it keeps its history and its secret may still be rotated (one that leaked).
    rotated = api.operator.post(
        f"/v1/tenants/acme/watchers/{watcher['watcher_id']}/rotate-secret",
        headers={"Idempotency-Key": "rotate"},
    )
    assert rotated.status_code == 200, rotated.text
    # Nor cancelled by an operator: it is already past that.
    cancelled = api.operator.post(
        f"/v1/tenants/acme/watchers/{watcher['watcher_id']}/cancel",
        headers={"Idempotency-Key": "cancel"},
    )
    assert (cancelled.status_code, cancelled.json()["code"]) == (409, "invalid-state")


def test_request_budget_refuses_before_the_socket_and_releases_the_row(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    register(api, receiver.url("/hook"))
    complete_one(api)
    report = deliver(settings, database_url, budget=Budget(max_requests=0))
    assert report.released == 1
    [run] = report.runs.values()
    # Refused before the lease: no receipt, nothing used.
    assert run.receipts == ()
    assert run.usage.requests == 0
    assert receiver.connections == 0
    [row] = rows(db)
    # Not an attempt: nothing counted, no receipt, due as before.
    assert row["state"] == "pending"
    assert row["attempts"] == 0
    assert row["receipts"] == []
    assert row["claim_token"] is None
    assert deliver(settings, database_url).delivered == 1


def test_each_attempt_is_its_own_broker_run_with_its_own_budget(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    register(api, receiver.url("/hook"))
    for _ in range(3):
        complete_one(api)
    report = deliver(settings, database_url)
    assert report.delivered == 3
    runs = list(report.runs.values())
    assert [len(run.receipts) for run in runs] == [1, 1, 1]
    assert all(run.usage.requests == 1 and run.usage.max_requests == 1 for run in runs)
    assert all(run.receipts[0].seq == 1 for run in runs)


def test_a_response_over_the_byte_budget_is_charged_and_dead(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    receiver.mode = "huge?n=100000"
    register(api, receiver.url("/hook"))
    complete_one(api)
    budget = Budget(max_requests=1, max_response_bytes=1000)
    report = deliver(settings, database_url, budget=budget)
    assert receiver.connections == 1
    assert report.dead == 1
    [row] = rows(db)
    assert row["attempts"] == 1
    assert row["last_outcome"]["outcome"] == "response_budget_exhausted"
    [receipt] = row["receipts"]
    # The chunk that crossed the budget was charged in full.
    assert receipt["response_bytes"] > 1000
    [run] = report.runs.values()
    assert run.usage.response_bytes > 1000


def test_paused_watcher_holds_its_rows_and_resume_sends_them_in_order(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    watcher = register(api, receiver.url("/hook"))
    path = f"/v1/tenants/acme/watchers/{watcher['watcher_id']}"
    items = [complete_one(api, payload=n) for n in range(4)]
    paused = api.operator.post(f"{path}/pause", headers={"Idempotency-Key": "p1"})
    assert paused.json()["state"] == "paused"
    # Only active watchers subscribe: a transition during the pause records nothing for it.
    complete_one(api, payload="during the pause")
    assert len(rows(db)) == 4
    assert deliver(settings, database_url).claimed == 0
    assert receiver.hook_requests() == []
    resumed = api.operator.post(f"{path}/resume", headers={"Idempotency-Key": "r1"})
    assert resumed.json()["state"] == "active"
    assert deliver(settings, database_url).delivered == 4
    sent = [json.loads(r.body)["item"]["item_id"] for r in receiver.hook_requests()]
    assert sent == items


def test_two_deliverers_never_send_one_row_at_once(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    register(api, receiver.url("/hook"))
    register(api, receiver.url("/hook"))
    api.approve("q", 50)
    api.worker.post(
        "/v1/tenants/acme/queues/q/items:batch",
        json={"items": [{"payload": n} for n in range(15)]},
        headers={"Idempotency-Key": "fifteen"},
    )
    leases = api.acquire(max_items=15)
    for lease in leases:
        done = api.holder("complete", lease["item_id"], worker="w1", fence=lease["fence"])
        assert done.status_code == 200
    small = settings.model_copy(update={"delivery_batch_size": 4})

    async def race() -> list[RunReport]:
        async with Deliverer(small, database_url) as a, Deliverer(small, database_url) as b:
            reports: list[RunReport] = []
            for _ in range(20):
                both = await asyncio.gather(a.run_once(), b.run_once())
                # Each run claims at most its batch. (One round of the two may claim twice
                # the class's concurrency: one run can claim, send and record before the
                # other claims. Requests in flight at once are counted by the receiver in
                # test_delivery_concurrency.py.)
                assert all(r.claimed <= 4 for r in both)
                reports += both
                if not any(r.claimed for r in both):
                    break
            return reports

    reports = asyncio.run(race())
    keys = [r.headers["webhook-id"] for r in receiver.hook_requests()]
    assert len(keys) == 30
    assert len(set(keys)) == 30
    assert sum(r.claimed for r in reports) == 30
    assert all(r["state"] == "delivered" for r in rows(db))


def test_rotated_secret_and_the_previous_one_both_verify(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    watcher = register(api, receiver.url("/hook"))
    rotated = api.operator.post(
        f"/v1/tenants/acme/watchers/{watcher['watcher_id']}/rotate-secret",
        headers={"Idempotency-Key": "rot-1"},
    )
    assert rotated.status_code == 200, rotated.text
    new_secret = rotated.json()["secret"]
    assert new_secret != watcher["secret"]
    assert rotated.json()["previous_secret_expires_at"] is not None
    complete_one(api)
    deliver(settings, database_url)
    [seen] = receiver.hook_requests()
    for secret in (watcher["secret"], new_secret):
        Webhook(secret).verify(seen.body, seen.headers)
    # After the grace period only the new secret signs.
    db.execute("UPDATE watchers SET previous_secret_expires_at = now() - interval '1 second'")
    complete_one(api)
    deliver(settings, database_url)
    latest = receiver.hook_requests()[-1]
    Webhook(new_secret).verify(latest.body, latest.headers)
    assert len(latest.headers["webhook-signature"].split()) == 1


def test_dispatch_rechecks_the_target_and_the_canary_sees_no_connection(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    register(api, receiver.url("/hook"))
    complete_one(api)
    # The deliverer's own policy no longer allows loopback: refused before any socket.
    report = deliver(settings, database_url, transport_allow=[])
    # A refusal is not a retryable failure: dead at once, with its reason.
    assert report.dead == 1
    assert receiver.connections == 0
    [row] = rows(db)
    assert (row["state"], row["attempts"]) == ("dead", 1)
    assert row["last_outcome"]["outcome"] == "policy_refused"
    assert "loopback" in row["last_outcome"]["detail"]
    assert row["receipts"] == []
    letters = api.operator.get("/v1/tenants/acme/dead-letters", params={"kind": "delivery"})
    [letter] = letters.json()["dead_letters"]
    assert letter["reason"].startswith("policy-refused: ")
    assert "loopback" in letter["reason"]
