"""A queue's own settings, below the loaded policy's envelope: what PUT refuses, what GET
explains, and each statement that reads them (enqueue, acquire, heartbeat one and many,
requeue and triage with `"delay": "backoff"`)."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import httpx
import pytest

from tests.helpers.api import Api
from tests.helpers.invariants import Db


def _key() -> dict[str, str]:
    return {"Idempotency-Key": uuid.uuid4().hex}


def _put(api: Api, queue: str, **body: Any) -> httpx.Response:
    return api.operator.put(
        f"/v1/tenants/{api.tenant}/queues/{queue}/settings", json=body, headers=_key()
    )


def _settings(api: Api, queue: str) -> dict[str, Any]:
    response = api.worker.get(f"/v1/tenants/{api.tenant}/queues/{queue}/settings")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _seconds_after(later: object, earlier: object) -> float:
    return (_at(str(later)) - _at(str(earlier))).total_seconds()


def _now(db: Db) -> datetime:
    row = db.execute("SELECT statement_timestamp() AS now").fetchone()
    assert row is not None
    now = row["now"]
    assert isinstance(now, datetime)
    return now


def _ledger(api: Api, item_id: object) -> list[dict[str, Any]]:
    response = api.worker.get(f"/v1/tenants/{api.tenant}/items/{item_id}/ledger")
    assert response.status_code == 200, response.text
    events: list[dict[str, Any]] = response.json()["events"]
    return events


def test_a_queue_without_settings_shows_where_each_value_comes_from(api: Api) -> None:
    shown = _settings(api, "fresh")
    assert shown["queue"] == "fresh"
    # The tenant was created with default_max_acquisitions 3; its lease TTL default is the
    # policy's attempt timeout; the deadline and the retry cap are the policy's.
    assert shown["max_acquisitions"] == {"value": 3, "source": "tenant"}
    assert shown["lease_ttl"]["source"] == "tenant"
    assert shown["deadline"] == {"value": 900.0, "source": "policy"}
    assert shown["retry"]["cap"] == {"value": 300.0, "source": "policy"}
    assert shown["retry"]["base"] == {"value": 1.0, "source": "default"}
    assert shown["retry"]["factor"] == {"value": 2.0, "source": "default"}
    assert shown["retry"]["jitter"] == {"value": False, "source": "default"}
    assert shown["updated_at"] is None


def test_put_sets_the_queue_s_own_values_and_a_later_put_replaces_them(api: Api) -> None:
    response = _put(
        api,
        "reports",
        lease_ttl=20,
        deadline=600,
        max_acquisitions=4,
        retry={"base": 2, "cap": 60, "jitter": True},
    )
    assert response.status_code == 200, response.text
    shown = response.json()
    assert shown["lease_ttl"] == {"value": 20.0, "source": "queue"}
    assert shown["deadline"] == {"value": 600.0, "source": "queue"}
    assert shown["max_acquisitions"] == {"value": 4, "source": "queue"}
    assert shown["retry"]["base"] == {"value": 2.0, "source": "queue"}
    assert shown["retry"]["cap"] == {"value": 60.0, "source": "queue"}
    assert shown["retry"]["jitter"] == {"value": True, "source": "queue"}
    assert shown["updated_by"] is not None
    assert _settings(api, "reports") == shown
    # A PUT is the whole of the queue's settings: what it leaves out is inherited again.
    again = _put(api, "reports", deadline=300).json()
    assert again["deadline"] == {"value": 300.0, "source": "queue"}
    assert again["max_acquisitions"] == {"value": 3, "source": "tenant"}
    assert again["retry"]["cap"]["source"] == "policy"
    assert again["lease_ttl"]["source"] == "tenant"
    assert again["retry"]["base"] == {"value": 1.0, "source": "default"}
    assert again["retry"]["jitter"] == {"value": False, "source": "default"}
    assert _settings(api, "reports") == again
    events = api.worker.get(f"/v1/tenants/{api.tenant}/queues/reports").json()["events"]
    assert [e["kind"] for e in events][:2] == ["settings", "settings"]
    assert events[0]["data"]["before"]["max_acquisitions"] == 4


def test_the_retry_base_shown_is_never_above_the_retry_cap(api: Api, db: Db) -> None:
    # A cap below the default base of 1 s: the default base shown is the cap.
    assert _put(api, "q", retry={"cap": 0.5}).status_code == 200
    assert _settings(api, "q")["retry"]["base"] == {"value": 0.5, "source": "default"}
    # A base stored above the queue's cap (under a looser check) is shown at the cap.
    db.execute("UPDATE queues SET retry_base = 10, retry_cap = 5 WHERE queue = 'q'")
    assert _settings(api, "q")["retry"]["base"] == {"value": 5.0, "source": "queue"}


@pytest.mark.parametrize(
    ("body", "loc", "cell"),
    [
        ({"lease_ttl": 31}, ["body", "lease_ttl"], "durable-leased-work/attempt-timeout"),
        ({"deadline": 901}, ["body", "deadline"], "durable-leased-work/deadline"),
        ({"max_acquisitions": 6}, ["body", "max_acquisitions"], "durable-leased-work/retry"),
        (
            {"retry": {"cap": 301}},
            ["body", "retry", "cap"],
            "durable-leased-work/backoff-and-jitter",
        ),
        (
            {"retry": {"base": 301}},
            ["body", "retry", "base"],
            "durable-leased-work/backoff-and-jitter",
        ),
    ],
)
def test_a_value_above_the_envelope_is_refused_naming_the_field_and_the_cell(
    api: Api, body: dict[str, Any], loc: list[Any], cell: str
) -> None:
    response = _put(api, "q", **body)
    assert response.status_code == 422, response.text
    problem = response.json()
    assert problem["code"] == "invalid-request"
    assert [(e["loc"], e["cell"]) for e in problem["errors"]] == [(loc, cell)]
    assert cell in problem["detail"]
    # Nothing was stored.
    assert _settings(api, "q")["updated_at"] is None


def test_settings_that_contradict_each_other_are_refused(api: Api) -> None:
    for lease_ttl in (30, 11):  # a second over is as contradictory as twenty
        response = _put(api, "q", lease_ttl=lease_ttl, deadline=10)
        assert response.status_code == 422, response.text
        assert response.json()["errors"][0]["loc"] == ["body", "lease_ttl"]
    for base in (20, 10.5):  # and a first backoff half a second past the cap
        response = _put(api, "q", retry={"base": base, "cap": 10})
        assert response.status_code == 422, response.text
        assert response.json()["errors"][0]["loc"] == ["body", "retry", "base"]
    # Equal is consistent: a lease as long as the deadline, a first backoff at the cap.
    response = _put(api, "q", lease_ttl=30, deadline=30, retry={"base": 10, "cap": 10})
    assert response.status_code == 200, response.text


def test_only_an_operator_sets_them(api: Api) -> None:
    response = api.worker.put(
        f"/v1/tenants/{api.tenant}/queues/q/settings", json={"deadline": 60}, headers=_key()
    )
    assert response.status_code == 403, response.text


def test_enqueue_gives_an_item_the_queue_s_budget_unless_it_names_its_own(api: Api) -> None:
    assert _put(api, "limited", max_acquisitions=2).status_code == 200
    assert api.enqueue("limited")["max_acquisitions"] == 2
    assert api.enqueue("limited", max_acquisitions=5)["max_acquisitions"] == 5
    assert api.enqueue("other")["max_acquisitions"] == 3  # the tenant's default
    batch = api.worker.post(
        f"/v1/tenants/{api.tenant}/queues/limited/items:batch",
        json={"items": [{}, {"max_acquisitions": 4}]},
        headers=_key(),
    )
    assert batch.status_code == 201, batch.text
    assert [i["max_acquisitions"] for i in batch.json()["items"]] == [2, 4]


def test_acquire_uses_the_queue_s_lease_ttl_and_deadline(api: Api, db: Db) -> None:
    assert _put(api, "timed", lease_ttl=10, deadline=20).status_code == 200
    api.enqueue("timed")
    api.enqueue("timed")
    before = _now(db)
    response = api.worker.post(
        f"/v1/tenants/{api.tenant}/queues/timed/leases", json={"worker": "w1"}
    )
    assert response.status_code == 200, response.text
    (lease,) = response.json()["leases"]
    expires = (_at(lease["lease_expires_at"]) - before).total_seconds()
    deadline = (_at(lease["lease_deadline_at"]) - before).total_seconds()
    assert 9.5 <= expires <= 11
    assert 19.5 <= deadline <= 21
    # A TTL the worker asks for beats the queue's, within the deadline.
    api.holder("complete", lease["item_id"], worker="w1", fence=lease["fence"])
    (second,) = api.acquire("timed", ttl=25)
    assert _seconds_after(second["lease_expires_at"], second["lease_deadline_at"]) == 0
    # Another queue of the tenant keeps the policy's deadline.
    api.enqueue("plain")
    (plain,) = api.acquire("plain", ttl=5)
    assert 899 <= _seconds_after(plain["lease_deadline_at"], plain["lease_expires_at"]) + 5 <= 901


def test_a_heartbeat_without_a_ttl_extends_by_the_queue_s_lease_ttl(api: Api, db: Db) -> None:
    """Each queue's own: two queues of the tenant with different TTLs, each item's heartbeat
    (one by one and in a batch) extends its lease by its queue's."""
    ttls = {"beats": 12, "beats2": 20}
    for queue, ttl in ttls.items():
        assert _put(api, queue, lease_ttl=ttl).status_code == 200
        api.approve(queue, 2)
    items = {queue: [api.enqueue(queue), api.enqueue(queue)] for queue in ttls}
    leases = api.acquire("beats", ttl=2, max_items=2) + api.acquire("beats2", ttl=2, max_items=2)
    fence = {lease["item_id"]: lease["fence"] for lease in leases}
    for queue, ttl in ttls.items():
        single, batched = items[queue]
        before = _now(db)
        one = api.worker.post(
            f"/v1/tenants/{api.tenant}/items/{single['item_id']}/heartbeat",
            json={"worker": "w1", "fence": fence[single["item_id"]]},
        )
        assert one.status_code == 200, one.text
        assert (
            ttl - 0.5 <= (_at(one.json()["lease_expires_at"]) - before).total_seconds() <= ttl + 1
        )
        many = api.worker.post(
            f"/v1/tenants/{api.tenant}/leases:heartbeat",
            json={
                "worker": "w1",
                "leases": [{"item_id": batched["item_id"], "fence": fence[batched["item_id"]]}],
            },
        )
        assert many.status_code == 200, many.text
        (result,) = many.json()["results"]
        assert ttl - 0.5 <= (_at(result["lease_expires_at"]) - before).total_seconds() <= ttl + 1


def _fail(api: Api, queue: str, item_id: object, action: str, **body: Any) -> dict[str, Any]:
    (lease,) = api.acquire(queue, ttl=5)
    assert lease["item_id"] == item_id
    if action == "triage":
        body = {"failure": {"class": "Boom", "transient": True}, "decision": "requeue", **body}
    else:
        body = {"reason": "later", **body}
    response = api.holder(action, item_id, worker="w1", fence=lease["fence"], **body)
    assert response.status_code == 200, response.text
    item: dict[str, Any] = response.json()
    return item


@pytest.mark.parametrize("action", ["requeue", "triage"])
def test_backoff_doubles_from_the_queue_s_base_up_to_its_cap_and_is_ledgered(
    api: Api, db: Db, action: str
) -> None:
    assert _put(api, "slow", retry={"base": 2, "cap": 5}, max_acquisitions=5).status_code == 200
    item = api.enqueue("slow")
    delays = []
    for _ in range(3):
        failed = _fail(api, "slow", item["item_id"], action, delay="backoff")
        assert failed["state"] == "ready"
        event = _ledger(api, item["item_id"])[-1]
        assert event["kind"] == ("triaged" if action == "triage" else "requeued")
        assert event["data"]["backoff"] is True
        delays.append(event["data"]["delay"])
        assert _seconds_after(failed["available_at"], failed["updated_at"]) == pytest.approx(
            event["data"]["delay"], abs=0.01
        )
        db.execute(  # the clock jumps to the item's next attempt
            "UPDATE work_items SET available_at = now() WHERE item_id = %s", (item["item_id"],)
        )
    assert delays == [2.0, 4.0, 5.0]


def test_backoff_without_settings_starts_at_a_second(api: Api, db: Db) -> None:
    item = api.enqueue("q", None, max_acquisitions=4)  # each failure leaves an attempt
    delays = []
    for _ in range(3):
        _fail(api, "q", item["item_id"], "triage", delay="backoff")
        delays.append(_ledger(api, item["item_id"])[-1]["data"]["delay"])
        db.execute(
            "UPDATE work_items SET available_at = now() WHERE item_id = %s", (item["item_id"],)
        )
    assert delays == [1.0, 2.0, 4.0]
    # A numeric delay is ledgered as chosen, not as backoff.
    other = api.enqueue("q2")
    _fail(api, "q2", other["item_id"], "requeue", delay=7)
    event = _ledger(api, other["item_id"])[-1]
    assert (event["data"]["delay"], event["data"]["backoff"]) == (7.0, False)


def test_full_jitter_draws_each_delay_up_to_its_backoff(api: Api) -> None:
    delays = []
    for n in range(8):
        # A queue each: a delay drawn near 0 makes that item due again at once, and on a
        # busy machine the next acquire of a shared queue would take it back first.
        queue = f"jittery-{n}"
        assert _put(api, queue, retry={"base": 100, "jitter": True}).status_code == 200
        item = api.enqueue(queue)
        _fail(api, queue, item["item_id"], "requeue", delay="backoff")
        delays.append(_ledger(api, item["item_id"])[-1]["data"]["delay"])
    assert all(0 <= d <= 100 for d in delays)
    # Drawn, not the full delay each time.
    assert len(set(delays)) > 1
    assert max(delays) < 100


def test_quarantine_takes_no_backoff(api: Api) -> None:
    item = api.enqueue("q")
    (lease,) = api.acquire("q")
    response = api.holder(
        "triage",
        item["item_id"],
        worker="w1",
        fence=lease["fence"],
        failure={"class": "Boom"},
        decision="quarantine",
        delay="backoff",
    )
    assert response.status_code == 422, response.text


def test_a_setting_stored_under_a_looser_policy_is_held_to_the_loaded_one(api: Api, db: Db) -> None:
    assert _put(api, "old", lease_ttl=20).status_code == 200
    db.execute("UPDATE queues SET lease_ttl = interval '100 seconds' WHERE queue = 'old'")
    assert _settings(api, "old")["lease_ttl"] == {"value": 30.0, "source": "queue"}
    api.enqueue("old")
    before = _now(db)
    response = api.worker.post(f"/v1/tenants/{api.tenant}/queues/old/leases", json={"worker": "w1"})
    (lease,) = response.json()["leases"]
    assert (_at(lease["lease_expires_at"]) - before).total_seconds() <= 31
    # A heartbeat that names no TTL extends by the queue's, held to the policy's as well.
    before = _now(db)
    beat = api.worker.post(
        f"/v1/tenants/{api.tenant}/items/{lease['item_id']}/heartbeat",
        json={"worker": "w1", "fence": lease["fence"]},
    )
    assert beat.status_code == 200, beat.text
    assert 29 <= (_at(beat.json()["lease_expires_at"]) - before).total_seconds() <= 31


def test_a_deadline_stored_under_a_looser_policy_is_held_to_the_loaded_one(
    api: Api, db: Db
) -> None:
    """The policy's deadline is 900 s: a queue's longer one, stored before, gives no more."""
    assert _put(api, "old", deadline=600).status_code == 200
    db.execute("UPDATE queues SET deadline = interval '2000 seconds' WHERE queue = 'old'")
    item = api.enqueue("old")
    (lease,) = api.acquire("old", ttl=5)
    (acquired,) = [e for e in _ledger(api, item["item_id"]) if e["kind"] == "acquired"]
    assert _seconds_after(lease["lease_deadline_at"], acquired["at"]) == pytest.approx(900)
