"""Acquire and the holder operations, with every refusal by name."""

from __future__ import annotations

import psycopg

from tests.helpers.api import Api
from tests.helpers.items import expire

Db = psycopg.Connection[dict[str, object]]


def ledger_kinds(api: Api, item_id: object) -> list[str]:
    events = api.worker.get(f"/v1/tenants/acme/items/{item_id}/ledger").json()["events"]
    return [event["kind"] for event in events]


def test_acquire_raises_fence_and_acquisition_count(api: Api) -> None:
    item = api.enqueue()
    (lease,) = api.acquire(worker="w1", ttl=30)
    assert lease["item_id"] == item["item_id"]
    assert lease["fence"] == 1
    assert lease["acquisition_count"] == 1
    row = api.worker.get(f"/v1/tenants/acme/items/{item['item_id']}").json()
    assert row["state"] == "leased"
    assert row["lease_holder"] == "w1"
    assert row["lease_deadline_at"] == lease["lease_deadline_at"] is not None
    # Completed, it has no lease and so no lease deadline.
    done = api.holder("complete", item["item_id"], worker="w1", fence=lease["fence"])
    assert (done.json()["state"], done.json()["lease_deadline_at"]) == ("completed", None)


def test_acquire_on_an_empty_queue_is_an_empty_list(api: Api) -> None:
    assert api.acquire() == []


def test_acquire_skips_item_leased_by_another_worker(api: Api) -> None:
    api.approve("q", 10)
    api.enqueue()
    assert len(api.acquire(worker="w1")) == 1
    assert api.acquire(worker="w2") == []


def test_heartbeat_extends_the_lease(api: Api) -> None:
    api.enqueue()
    (lease,) = api.acquire(ttl=5)
    response = api.worker.post(
        f"/v1/tenants/acme/items/{lease['item_id']}/heartbeat",
        json={"worker": "w1", "fence": lease["fence"], "lease_ttl": 30},
    )
    assert response.status_code == 200
    assert response.json()["lease_expires_at"] > str(lease["lease_expires_at"])


def test_complete_rejects_stale_fence(api: Api, db: Db) -> None:
    api.approve("q", 10)
    api.enqueue()
    (first,) = api.acquire(worker="w1")
    expire(db, first["item_id"])
    (second,) = api.acquire(worker="w2")
    assert second["fence"] == int(str(first["fence"])) + 1
    refused = api.holder("complete", first["item_id"], worker="w1", fence=first["fence"])
    assert refused.status_code == 409
    assert refused.json()["code"] == "stale-fence"
    assert refused.json()["current_fence"] == second["fence"]
    accepted = api.holder("complete", second["item_id"], worker="w2", fence=second["fence"])
    assert accepted.status_code == 200
    assert accepted.json()["fence"] == second["fence"]


def test_a_superseded_fence_is_refused_even_for_the_same_worker(api: Api, db: Db) -> None:
    api.enqueue()
    (first,) = api.acquire(worker="w1")
    expire(db, first["item_id"])
    (second,) = api.acquire(worker="w1")  # the same worker name, a new lease
    assert second["fence"] == int(str(first["fence"])) + 1
    for action in ("heartbeat", "complete", "requeue"):
        refused = api.holder(action, first["item_id"], worker="w1", fence=first["fence"])
        assert (refused.status_code, refused.json()["code"]) == (409, "stale-fence"), action
    done = api.holder("complete", second["item_id"], worker="w1", fence=second["fence"])
    assert done.status_code == 200


def test_complete_rejects_another_worker(api: Api) -> None:
    api.enqueue()
    (lease,) = api.acquire(worker="w1")
    refused = api.holder("complete", lease["item_id"], worker="intruder", fence=lease["fence"])
    assert refused.status_code == 409
    assert refused.json()["code"] == "not-lease-holder"


def test_expired_lease_grants_no_authority_even_untaken(api: Api, db: Db) -> None:
    api.enqueue()
    (lease,) = api.acquire(worker="w1")
    expire(db, lease["item_id"])
    for action in ("complete", "requeue"):
        refused = api.holder(action, lease["item_id"], worker="w1", fence=lease["fence"])
        assert refused.status_code == 409
        assert refused.json()["code"] == "lease-expired"
    heartbeat = api.worker.post(
        f"/v1/tenants/acme/items/{lease['item_id']}/heartbeat",
        json={"worker": "w1", "fence": lease["fence"]},
    )
    assert heartbeat.status_code == 409
    assert heartbeat.json()["code"] == "lease-expired"


def test_holder_operations_on_an_unleased_item_are_item_not_leased(api: Api) -> None:
    item = api.enqueue()
    for action in ("complete", "requeue"):
        refused = api.holder(action, item["item_id"], worker="w1", fence=0)
        assert refused.status_code == 409
        assert refused.json()["code"] == "item-not-leased"


def test_triage_of_unleased_item_is_refused_but_ledgered(api: Api) -> None:
    item = api.enqueue()
    failure = {"class": "Boom", "message": "it broke", "transient": False}
    refused = api.holder(
        "triage", item["item_id"], worker="w9", fence=0, failure=failure, decision="requeue"
    )
    assert refused.status_code == 409
    assert refused.json()["code"] == "item-not-leased"
    events = api.worker.get(f"/v1/tenants/acme/items/{item['item_id']}/ledger").json()["events"]
    assert events[-1]["kind"] == "triage_rejected"
    assert events[-1]["data"]["failure"] == failure
    assert events[-1]["actor"] == "w9"
    row = api.worker.get(f"/v1/tenants/acme/items/{item['item_id']}").json()
    assert row["state"] == "ready"
    assert row["last_failure"] is None


def test_expired_lease_is_taken_over_with_a_higher_fence(api: Api, db: Db) -> None:
    api.enqueue()
    (first,) = api.acquire(worker="w1")
    expire(db, first["item_id"])
    (second,) = api.acquire(worker="w2")
    assert second["item_id"] == first["item_id"]
    assert second["fence"] == 2
    assert second["acquisition_count"] == 2
    # A lease that expired before its deadline ends as no failure: the ledger has no
    # deadline_exceeded, and the item no last failure.
    assert ledger_kinds(api, first["item_id"]) == ["enqueued", "acquired", "acquired"]
    item = api.worker.get(f"/v1/tenants/acme/items/{first['item_id']}").json()
    assert item["last_failure"] is None


def test_requeue_returns_item_and_next_acquire_raises_fence(api: Api) -> None:
    api.enqueue()
    (lease,) = api.acquire()
    response = api.holder("requeue", lease["item_id"], worker="w1", fence=1, reason="later")
    body = response.json()
    assert body["state"] == "ready"
    assert body["lease_holder"] is None
    assert body["fence"] == 1
    (again,) = api.acquire(worker="w2")
    assert again["fence"] == 2
    assert ledger_kinds(api, lease["item_id"]) == ["enqueued", "acquired", "requeued", "acquired"]


def test_triage_requeue_records_failure(api: Api) -> None:
    api.enqueue()
    (lease,) = api.acquire()
    failure = {"class": "Timeout", "message": "slow upstream", "transient": True}
    response = api.holder(
        "triage", lease["item_id"], worker="w1", fence=1, failure=failure, decision="requeue"
    )
    assert response.status_code == 200
    assert response.json()["state"] == "ready"
    assert response.json()["last_failure"] == failure


def test_triage_quarantine_opens_a_dead_letter(api: Api, db: Db) -> None:
    api.enqueue()
    (lease,) = api.acquire()
    failure = {"class": "Poison", "message": "bad payload", "transient": False}
    response = api.holder(
        "triage", lease["item_id"], worker="w1", fence=1, failure=failure, decision="quarantine"
    )
    assert response.json()["state"] == "quarantined"
    dead = db.execute(
        "SELECT kind, reason, last_failure FROM dead_letters WHERE item_id = %s",
        (lease["item_id"],),
    ).fetchall()
    assert dead == [{"kind": "item", "reason": "quarantined by triage", "last_failure": failure}]


def test_a_failure_with_no_attempt_left_is_dead_lettered_at_once(api: Api, db: Db) -> None:
    # Its last attempt failed: a requeue could never run it again, so it goes to the dead
    # letters now, not when some worker next polls the queue.
    item = api.enqueue(max_acquisitions=2)
    failure = {"class": "Timeout", "message": "slow upstream", "transient": True}
    for attempt, state in ((1, "ready"), (2, "quarantined")):
        (lease,) = api.acquire()
        assert lease["fence"] == attempt
        response = api.holder(
            "triage", item["item_id"], worker="w1", fence=attempt, failure=failure,
            decision="requeue", delay=0,
        )  # fmt: skip
        assert response.status_code == 200, response.text
        assert response.json()["state"] == state
    dead = db.execute(
        "SELECT reason, last_failure FROM dead_letters WHERE item_id = %s", (item["item_id"],)
    ).fetchall()
    assert dead == [{"reason": "acquisition budget exhausted", "last_failure": failure}]
    events = api.worker.get(f"/v1/tenants/acme/items/{item['item_id']}/ledger").json()["events"]
    assert events[-1]["kind"] == "triaged"
    assert events[-1]["data"]["decision"] == "quarantine"
    assert events[-1]["data"]["budget_exhausted"] is True
    verified = api.operator.get("/v1/tenants/acme/ledger-verification").json()
    assert verified["mismatches"] == []
    assert api.acquire() == []


def test_items_past_their_budget_are_quarantined_not_handed_out(api: Api, db: Db) -> None:
    item = api.enqueue(max_acquisitions=2)
    for expected_fence in (1, 2):
        (lease,) = api.acquire(worker="w1")
        assert lease["fence"] == expected_fence
        api.holder("requeue", lease["item_id"], worker="w1", fence=lease["fence"])
    other = api.enqueue()
    leases = api.acquire(worker="w1")
    # The exhausted item is quarantined; the next due item is handed out in its place.
    assert [lease["item_id"] for lease in leases] == [other["item_id"]]
    row = api.worker.get(f"/v1/tenants/acme/items/{item['item_id']}").json()
    assert row["state"] == "quarantined"
    assert row["acquisition_count"] == 2
    dead = db.execute(
        "SELECT reason FROM dead_letters WHERE item_id = %s AND closed_at IS NULL",
        (item["item_id"],),
    ).fetchall()
    assert dead == [{"reason": "acquisition budget exhausted"}]
    assert ledger_kinds(api, item["item_id"])[-1] == "quarantined"


def test_concurrency_limit_is_one_without_an_approval(api: Api) -> None:
    api.enqueue()
    api.enqueue()
    assert len(api.acquire(max_items=10)) == 1
    info = api.worker.get("/v1/tenants/acme/queues/q/concurrency").json()
    assert info == {
        "tenant": "acme",
        "queue": "q",
        "limit": 1,
        "active_leases": 1,
        "approval": None,
        "approved_limit": 1,
        "concurrency": None,
        "expires_at": None,
        "expiring": False,
        "warning": None,
    }


def test_spend_approval_raises_the_limit_and_expired_one_falls_back(api: Api, db: Db) -> None:
    for _ in range(5):
        api.enqueue()
    api.approve("q", 3)
    assert len(api.acquire(max_items=10)) == 3
    info = api.worker.get("/v1/tenants/acme/queues/q/concurrency").json()
    assert info["limit"] == 3
    assert info["approval"]["approved_by"] == api.operator.get("/v1/whoami").json()["key_id"]
    db.execute("UPDATE spend_approvals SET expires_at = now() - interval '1 second'")
    assert api.worker.get("/v1/tenants/acme/queues/q/concurrency").json()["limit"] == 1
    assert api.acquire(max_items=10) == []


def test_spend_approval_needs_an_operator(api: Api) -> None:
    response = api.worker.post(
        "/v1/tenants/acme/queues/q/spend-approvals",
        json={
            "approved_by": "me",
            "max_concurrency": 5,
            "expires_at": "2999-01-01T00:00:00Z",
            "reason": "r",
        },
        headers={"Idempotency-Key": "s"},
    )
    assert response.status_code == 403


def test_booleans_and_strings_are_not_numbers(api: Api) -> None:
    for body in (
        {"worker": "w1", "wait": False},
        {"worker": "w1", "max_items": True},
        {"worker": "w1", "lease_ttl": "30"},
    ):
        response = api.worker.post("/v1/tenants/acme/queues/q/leases", json=body)
        assert response.status_code == 422, body
    item = api.enqueue()
    refused = api.holder("complete", item["item_id"], worker="w1", fence=True)
    assert refused.status_code == 422
