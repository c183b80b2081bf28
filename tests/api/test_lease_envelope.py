"""The durable-leased-work envelope, enforced by a live server: the attempt cap, the TTL bound,
a lease's deadline from its acquisition, and the requeue/triage delay cap."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from queue_server.settings import Settings
from tests.helpers.api import Api, live_api, policy_file

DEADLINE = 4.0  # seconds: the short lease deadline of the `short` server's policy


def _problem(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert body["code"] == code
    return body


def _refused(response: httpx.Response, loc: list[Any], cell: str) -> None:
    body = _problem(response, 422, "invalid-request")
    assert [(e["loc"], e["cell"]) for e in body["errors"]] == [(loc, cell)]
    assert cell in body["detail"]


def _put_tenant(api: Api, **fields: Any) -> httpx.Response:
    return api.admin.put(f"/v1/tenants/{api.tenant}", json={"backlog_cap": 100, **fields})


def _replay(api: Api, dead_letter_id: str, **body: Any) -> httpx.Response:
    return api.operator.post(
        f"/v1/tenants/{api.tenant}/dead-letters/{dead_letter_id}/replay",
        json=body,
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )


def test_budget_above_the_attempt_cap_is_refused_naming_the_field_and_the_cell(api: Api) -> None:
    cell = "durable-leased-work/retry"
    enqueue = f"/v1/tenants/{api.tenant}/queues/q/items"
    key = {"Idempotency-Key": uuid.uuid4().hex}
    _refused(
        api.worker.post(enqueue, json={"max_acquisitions": 6}, headers=key),
        ["body", "max_acquisitions"],
        cell,
    )
    batch = {"items": [{"max_acquisitions": 5}, {"max_acquisitions": 6}]}
    _refused(
        api.worker.post(enqueue + ":batch", json=batch, headers=key),
        ["body", "items", 1, "max_acquisitions"],
        cell,
    )
    _refused(
        _put_tenant(api, default_max_acquisitions=6), ["body", "default_max_acquisitions"], cell
    )
    assert api.enqueue(max_acquisitions=5)["max_acquisitions"] == 5
    # A tenant's defaults, unset, are the policy's.
    assert _put_tenant(api).json()["default_max_acquisitions"] == 5

    quarantined = api.enqueue("poison", max_acquisitions=1)
    (lease,) = api.acquire("poison")
    api.holder(
        "triage",
        lease["item_id"],
        worker="w1",
        fence=lease["fence"],
        failure={"class": "boom"},
        decision="quarantine",
    )
    (letter,) = api.operator.get(f"/v1/tenants/{api.tenant}/dead-letters").json()["dead_letters"]
    assert letter["item_id"] == quarantined["item_id"]
    _refused(
        _replay(api, letter["dead_letter_id"], max_acquisitions=6),
        ["body", "max_acquisitions"],
        cell,
    )
    replayed = _replay(api, letter["dead_letter_id"], max_acquisitions=5)
    assert replayed.json()["max_acquisitions"] == 5


def test_an_item_is_acquired_at_most_the_attempt_cap_then_quarantined(api: Api) -> None:
    item = api.enqueue(max_acquisitions=5)
    for n in range(1, 6):
        (lease,) = api.acquire()
        assert lease["acquisition_count"] == n
        api.holder("requeue", item["item_id"], worker="w1", fence=lease["fence"])
    assert api.acquire() == []
    assert (
        api.worker.get(f"/v1/tenants/{api.tenant}/items/{item['item_id']}").json()["state"]
        == "quarantined"
    )


def test_lease_ttl_above_the_attempt_timeout_is_refused_naming_the_field_and_the_cell(
    api: Api,
) -> None:
    cell = "durable-leased-work/attempt-timeout"
    leases = f"/v1/tenants/{api.tenant}/queues/q/leases"
    _refused(
        api.worker.post(leases, json={"worker": "w1", "lease_ttl": 31}), ["body", "lease_ttl"], cell
    )
    _refused(_put_tenant(api, default_lease_ttl=31), ["body", "default_lease_ttl"], cell)
    item = api.enqueue()
    (lease,) = api.acquire(ttl=30)
    beat = f"/v1/tenants/{api.tenant}/items/{item['item_id']}/heartbeat"
    _refused(
        api.worker.post(beat, json={"worker": "w1", "fence": lease["fence"], "lease_ttl": 31}),
        ["body", "lease_ttl"],
        cell,
    )
    assert (
        api.worker.post(
            beat, json={"worker": "w1", "fence": lease["fence"], "lease_ttl": 30}
        ).status_code
        == 200
    )


@pytest.fixture
def short(tmp_path: Path, database_url: str) -> Iterator[Api]:
    """A live server whose policy gives a lease at most DEADLINE seconds (a policy file)."""
    path = policy_file(
        tmp_path / "short.json",
        {
            "durable-leased-work": {
                "deadline": {"seconds": DEADLINE},
                "attempt-timeout": {"seconds": 2, "on-timeout": "lease-expires"},
            }
        },
    )
    settings = Settings(data_dir=tmp_path, poll_interval=0.2, policy=str(path))
    with live_api(settings, database_url) as api:
        yield api


def _at(value: object) -> datetime:
    return datetime.fromisoformat(str(value))


def test_a_heartbeat_past_the_deadline_is_refused_and_the_item_taken_over_with_a_higher_fence(
    short: Api,
) -> None:
    api = short
    item = api.enqueue("q")
    last = api.enqueue("last", max_acquisitions=1)
    # Counted from before the lease was taken: the deadline runs from the acquire, and a
    # busy machine may take a second between it and the first heartbeat.
    started = time.monotonic()
    (lease,) = api.acquire("q", worker="hung", ttl=2)
    (last_lease,) = api.acquire("last", worker="hung", ttl=2)
    deadline = _at(lease["lease_deadline_at"])
    assert (deadline - _at(lease["lease_expires_at"])).total_seconds() == pytest.approx(
        DEADLINE - 2, abs=0.05
    )

    def beat(lease: dict[str, Any]) -> httpx.Response:
        return api.worker.post(
            f"/v1/tenants/{api.tenant}/items/{lease['item_id']}/heartbeat",
            json={"worker": "hung", "fence": lease["fence"], "lease_ttl": 2},
        )

    # The holder heartbeats well within its TTL, yet its lease ends at the deadline.
    refusal: dict[str, Any] | None = None
    while time.monotonic() - started < DEADLINE + 3:
        response = beat(lease)
        beat(last_lease)
        if response.status_code != 200:
            refusal = _problem(response, 409, "lease-deadline-exceeded")
            break
        assert _at(response.json()["lease_expires_at"]) <= deadline
        time.sleep(0.3)
    assert refusal is not None, "heartbeats extended the lease past its deadline"
    assert time.monotonic() - started >= DEADLINE - 0.5
    # No holder operation has authority any more; another worker takes the item over.
    late = api.holder("complete", item["item_id"], worker="hung", fence=lease["fence"], result=1)
    _problem(late, 409, "lease-deadline-exceeded")
    (taken,) = api.acquire("q", worker="other", ttl=2)
    assert taken["item_id"] == item["item_id"]
    assert taken["fence"] == int(str(lease["fence"])) + 1
    done = api.holder("complete", item["item_id"], worker="other", fence=taken["fence"], result=2)
    assert done.status_code == 200, done.text
    events = api.worker.get(f"/v1/tenants/{api.tenant}/items/{item['item_id']}/ledger").json()[
        "events"
    ]
    kinds = [e["kind"] for e in events]
    assert kinds[kinds.index("deadline_exceeded") :] == [
        "deadline_exceeded",
        "acquired",
        "completed",
    ]
    overdue = events[kinds.index("deadline_exceeded")]
    assert (overdue["fence"], overdue["actor"]) == (lease["fence"], "server")
    assert overdue["data"]["lease_holder"] == "hung"
    # The attempt that ran out is the item's last failure, on the item and in the ledger.
    failure = overdue["data"]["failure"]
    assert failure["class"] == "LeaseDeadlineExceeded"
    assert "hung" in failure["message"]
    taken_over = api.worker.get(f"/v1/tenants/{api.tenant}/items/{item['item_id']}").json()
    assert taken_over["last_failure"] == failure
    # At the budget, a lease past its deadline is quarantined, as an expired lease is.
    time.sleep(0.2)  # `last` was acquired a moment after `q`
    assert api.acquire("last", worker="other", ttl=2) == []
    quarantined = api.worker.get(f"/v1/tenants/{api.tenant}/items/{last['item_id']}").json()
    assert quarantined["state"] == "quarantined"
    last_kinds = [
        e["kind"]
        for e in api.worker.get(f"/v1/tenants/{api.tenant}/items/{last['item_id']}/ledger").json()[
            "events"
        ]
    ]
    assert last_kinds[-2:] == ["deadline_exceeded", "quarantined"]
    assert quarantined["last_failure"]["class"] == "LeaseDeadlineExceeded"
    # Both ledgers fold to their rows, the failure included.
    verified = api.operator.get(f"/v1/tenants/{api.tenant}/ledger-verification").json()
    assert verified["mismatches"] == [], verified
    dead = api.operator.get(f"/v1/tenants/{api.tenant}/dead-letters").json()["dead_letters"]
    assert [d["last_failure"]["class"] for d in dead if d["item_id"] == last["item_id"]] == [
        "LeaseDeadlineExceeded"
    ]


def test_requeue_and_triage_delay_the_item_up_to_the_backoff_cap(api: Api) -> None:
    cell = "durable-leased-work/backoff-and-jitter"
    item = api.enqueue()
    (lease,) = api.acquire()
    _refused(
        api.holder("requeue", item["item_id"], worker="w1", fence=lease["fence"], delay=301),
        ["body", "delay"],
        cell,
    )
    requeued = api.holder("requeue", item["item_id"], worker="w1", fence=lease["fence"], delay=1.5)
    assert requeued.status_code == 200, requeued.text
    body = requeued.json()
    assert (_at(body["available_at"]) - _at(body["updated_at"])).total_seconds() == pytest.approx(
        1.5
    )
    assert api.acquire() == []
    time.sleep(1.6)
    (again,) = api.acquire()
    assert again["fence"] == int(str(lease["fence"])) + 1

    failure = {"class": "rate-limited", "transient": True}
    _problem(
        api.holder(
            "triage",
            item["item_id"],
            worker="w1",
            fence=again["fence"],
            failure=failure,
            decision="quarantine",
            delay=1,
        ),
        422,
        "invalid-request",
    )
    _refused(
        api.holder(
            "triage",
            item["item_id"],
            worker="w1",
            fence=again["fence"],
            failure=failure,
            decision="requeue",
            delay=300.5,
        ),
        ["body", "delay"],
        cell,
    )
    triaged = api.holder(
        "triage",
        item["item_id"],
        worker="w1",
        fence=again["fence"],
        failure=failure,
        decision="requeue",
        delay=300,
    )
    assert triaged.status_code == 200, triaged.text
    body = triaged.json()
    assert (_at(body["available_at"]) - _at(body["updated_at"])).total_seconds() == pytest.approx(
        300
    )
    assert api.acquire() == []


def test_a_batch_heartbeat_never_extends_a_lease_past_its_deadline(short: Api) -> None:
    api = short
    route = f"/v1/tenants/{api.tenant}/leases:heartbeat"
    items = [api.enqueue(queue) for queue in ("a", "b")]
    started = time.monotonic()  # before the acquires, whose deadlines run from them
    leases = [api.acquire(queue, worker="hung", ttl=2)[0] for queue in ("a", "b")]
    entries = [{"item_id": lease["item_id"], "fence": lease["fence"]} for lease in leases]
    _refused(
        api.worker.post(route, json={"worker": "hung", "lease_ttl": 3, "leases": entries}),
        ["body", "lease_ttl"],
        "durable-leased-work/attempt-timeout",
    )
    deadlines = {lease["item_id"]: _at(lease["lease_deadline_at"]) for lease in leases}
    results: list[dict[str, Any]] = []
    while time.monotonic() - started < DEADLINE + 3:
        response = api.worker.post(
            route, json={"worker": "hung", "lease_ttl": 2, "leases": entries}
        )
        assert response.status_code == 200, response.text
        results = response.json()["results"]
        if any(r["status"] != 200 for r in results):
            break
        for r in results:
            assert _at(r["lease_deadline_at"]) == deadlines[r["item_id"]]
            assert _at(r["lease_expires_at"]) <= deadlines[r["item_id"]]
        time.sleep(0.2)
    # Refused only at the deadline.
    assert time.monotonic() - started >= DEADLINE - 0.5, results
    # The second lease was acquired a moment after the first: its deadline is that much later.
    time.sleep((max(deadlines.values()) - min(deadlines.values())).total_seconds() + 0.05)
    response = api.worker.post(route, json={"worker": "hung", "lease_ttl": 2, "leases": entries})
    assert [(r["status"], r["problem"]["code"]) for r in response.json()["results"]] == [
        (409, "lease-deadline-exceeded")
    ] * 2
    # Each is then taken over with a higher fence.
    for item, lease, queue in zip(items, leases, ("a", "b"), strict=True):
        (taken,) = api.acquire(queue, worker="other", ttl=2)
        assert (taken["item_id"], taken["fence"]) == (item["item_id"], int(str(lease["fence"])) + 1)
