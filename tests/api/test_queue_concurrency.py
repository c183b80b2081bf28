"""A queue's concurrency is the operator's, changed live below the approved limit; an
approval about to lapse is shown before it does (the concurrency answer, /metrics), and
its expiry is an event in the queue's ledger, written by the server with the limit the
queue falls to. Each is seen through real acquires and the REST answers."""

from __future__ import annotations

import html
import time
import uuid
from typing import Any

import httpx

from tests.helpers.api import Api
from tests.helpers.console import sign_in
from tests.helpers.watchers import wait_until

QUEUE = "/v1/tenants/acme/queues/q"


def set_concurrency(
    client: httpx.Client, concurrency: int | None, reason: str = "", key: str | None = None
) -> httpx.Response:
    return client.put(
        f"{QUEUE}/concurrency",
        json={"concurrency": concurrency, "reason": reason},
        headers={"Idempotency-Key": key or uuid.uuid4().hex},
    )


def leased_at_once(api: Api, tries: int = 6) -> int:
    """How many leases separate workers get, one item each, before one gets none."""
    got = [api.acquire(worker=f"w{n}", max_items=1) for n in range(tries)]
    return sum(len(g) for g in got)


def concurrency(api: Api) -> dict[str, Any]:
    answer = api.worker.get(f"{QUEUE}/concurrency")
    assert answer.status_code == 200, answer.text
    info: dict[str, Any] = answer.json()
    return info


def events(api: Api, kind: str | None, queue: str = "q") -> list[dict[str, Any]]:
    """The queue's ledger events of `kind` (None: all), newest first."""
    page = api.operator.get(f"/v1/tenants/acme/queues/{queue}")
    assert page.status_code == 200, page.text
    return [e for e in page.json()["events"] if kind is None or e["kind"] == kind]


def test_an_operator_sets_the_concurrency_live_below_the_approved_limit(api: Api) -> None:
    for n in range(8):
        api.enqueue(payload=n)
    # Without an approval the approved limit is the policy's one: 2 is refused, naming it.
    refused = set_concurrency(api.operator, 2)
    assert refused.status_code == 422, refused.text
    problem = refused.json()
    assert problem["errors"][0]["loc"] == ["body", "concurrency"]
    assert problem["errors"][0]["limit"] == 1
    assert "spend approve" in problem["detail"]
    # A worker key may read the limit, never set it.
    assert set_concurrency(api.worker, 1).status_code == 403
    api.approve("q", 4, days=30)
    assert (concurrency(api)["limit"], concurrency(api)["approved_limit"]) == (4, 4)
    lowered = set_concurrency(api.operator, 2, reason="the mail provider throttles us")
    assert lowered.status_code == 200, lowered.text
    assert {k: lowered.json()[k] for k in ("limit", "approved_limit", "concurrency")} == {
        "limit": 2,
        "approved_limit": 4,
        "concurrency": 2,
    }
    assert leased_at_once(api) == 2
    # Raised live: the next acquire leases one more, with two still held.
    assert set_concurrency(api.operator, 3).status_code == 200
    assert leased_at_once(api) == 1
    # Above the approval: refused, nothing changed.
    assert set_concurrency(api.operator, 5).status_code == 422
    assert concurrency(api)["limit"] == 3
    # Null follows the approved limit again.
    assert set_concurrency(api.operator, None).json()["limit"] == 4
    assert leased_at_once(api) == 1
    # Each change is in the queue's ledger, with the operator and the values around it.
    changes = events(api, "concurrency")
    assert [(e["data"]["before"], e["data"]["after"]) for e in reversed(changes)] == [
        (None, 2),
        (2, 3),
        (3, None),
    ]
    assert changes[-1]["data"]["reason"] == "the mail provider throttles us"
    assert changes[-1]["data"]["approved_limit"] == 4
    assert all(e["actor"].startswith("key:") for e in changes)


def test_the_concurrency_may_be_set_to_the_approved_limit_itself(api: Api) -> None:
    api.approve("q", 3)
    at_limit = set_concurrency(api.operator, 3)
    assert at_limit.status_code == 200, at_limit.text
    assert (at_limit.json()["limit"], at_limit.json()["concurrency"]) == (3, 3)
    assert set_concurrency(api.operator, 4).status_code == 422


def test_the_queue_setting_is_held_to_an_approval_that_lapses(api: Api) -> None:
    for n in range(4):
        api.enqueue(payload=n)
    approval = api.approve("q", 3, days=3 / 86400)
    assert set_concurrency(api.operator, 2).status_code == 200
    info = concurrency(api)
    # Expiring within the server's warning window (a day by default): said before it does.
    assert info["expiring"] is True
    assert info["warning"]
    assert "expires" in info["warning"]
    assert "spend approve q" in info["warning"]
    assert info["expires_at"] is not None
    metrics = api.operator.get("/metrics").text
    assert 'queue_server_spend_approval_expiring{queue="q",tenant="acme"} 1.0' in metrics
    expiry = _sample(metrics, "queue_server_spend_approval_expiry_seconds")
    assert 0 < expiry <= 3
    # Once it lapses the queue falls to one at a time, although its own setting says 2.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not events(api, "approval-expired"):
        time.sleep(0.2)
    (expired,) = events(api, "approval-expired")
    assert expired["actor"] == "server"
    assert expired["data"]["approval_id"] == approval["approval_id"]
    assert (expired["data"]["max_concurrency"], expired["data"]["limit"]) == (3, 1)
    info = concurrency(api)
    assert (info["limit"], info["concurrency"], info["approval"], info["expiring"]) == (
        1,
        2,
        None,
        False,
    )
    assert leased_at_once(api) == 1
    assert "queue_server_spend_approval_expiring{" not in api.operator.get("/metrics").text
    # The console shows the queue's ledger on its settings page, in words.
    client, _ = sign_in(api.url, api.keys["operator"])
    page = html.unescape(client.get("/console/tenants/acme/queues/q/settings").text)
    assert (
        f"spend approval {str(approval['approval_id'])[:8]} of 3 expired: the queue leases at most"
        " 1 at a time" in page
    )
    assert (
        "concurrency the approved limit -&gt; 2 (approved 3)"
        in client.get("/console/tenants/acme/queues/q/settings").text
    )
    # Ledgered once: a later round writes nothing more.
    time.sleep(6)
    assert len(events(api, "approval-expired")) == 1


def test_an_approval_far_from_its_expiry_is_not_expiring_and_a_revoked_one_is_not_ledgered(
    api: Api,
) -> None:
    far = api.approve("q", 4, days=30)
    info = concurrency(api)
    assert (info["limit"], info["expiring"], info["warning"]) == (4, False, None)
    metrics = api.operator.get("/metrics").text
    assert 'queue_server_spend_approval_expiring{queue="q",tenant="acme"} 0.0' in metrics
    assert _sample(metrics, "queue_server_spend_approval_expiry_seconds") > 29 * 86400
    revoked = api.operator.delete(
        f"{QUEUE}/spend-approvals/{far['approval_id']}",
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert revoked.status_code == 200, revoked.text
    # Revoked, it is behind no limit: the metrics no longer count down to its expiry.
    assert "queue_server_spend_approval_expiry_seconds{" not in api.operator.get("/metrics").text
    short = api.approve("q", 2, days=2 / 86400)
    api.operator.delete(
        f"{QUEUE}/spend-approvals/{short['approval_id']}",
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    time.sleep(8)  # past its expiry and a sweep round
    assert events(api, "approval-expired") == []


def test_the_metrics_count_down_to_the_expiry_of_the_largest_live_approval(api: Api) -> None:
    """A smaller approval ending within the warning window is behind no limit: the queue's
    limit, and what the metrics count down to, is the larger one's."""
    api.approve("q", 5, days=30)
    api.approve("q", 2, days=1 / 24)
    info = concurrency(api)
    assert (info["limit"], info["expiring"], info["warning"]) == (5, False, None)
    metrics = api.operator.get("/metrics").text
    assert 'queue_server_spend_approval_expiring{queue="q",tenant="acme"} 0.0' in metrics
    assert _sample(metrics, "queue_server_spend_approval_expiry_seconds") > 29 * 86400


def test_an_expiry_event_names_the_limit_of_the_live_approvals_under_the_queue_setting(
    api: Api,
) -> None:
    """q falls to its largest approval not revoked; q2 to its own concurrency below its
    remaining approval. Each expiry takes the next number in its queue's ledger."""
    api.approve("q", 5, days=3 / 86400)
    revoked = api.approve("q", 4, days=30)
    gone = api.operator.delete(
        f"{QUEUE}/spend-approvals/{revoked['approval_id']}",
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert gone.status_code == 200, gone.text
    api.approve("q", 3, days=30)
    api.approve("q2", 5, days=3 / 86400)
    api.approve("q2", 3, days=30)
    lowered = api.operator.put(
        "/v1/tenants/acme/queues/q2/concurrency",
        json={"concurrency": 2, "reason": "throttled"},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert lowered.status_code == 200, lowered.text
    wait_until(
        lambda: all(events(api, "approval-expired", queue) for queue in ("q", "q2")),
        "both approvals' expiry in their queues' ledgers",
    )
    (expired,) = events(api, "approval-expired")
    assert (expired["data"]["max_concurrency"], expired["data"]["limit"]) == (5, 3)
    (expired2,) = events(api, "approval-expired", "q2")
    assert (expired2["data"]["max_concurrency"], expired2["data"]["limit"]) == (5, 2)
    assert (concurrency(api)["limit"], api.worker.get(f"{QUEUE}2/concurrency").json()["limit"]) == (
        3,
        2,
    )
    # The next change of each queue is ledgered after its expiry.
    for queue in ("q", "q2"):
        paused = api.operator.post(
            f"/v1/tenants/acme/queues/{queue}/pause",
            json={"reason": "after the expiry"},
            headers={"Idempotency-Key": uuid.uuid4().hex},
        )
        assert paused.status_code == 200, paused.text
        ledger = events(api, None, queue)
        assert [e["seq"] for e in ledger] == list(range(len(ledger) - 1, -1, -1))
        assert [e["kind"] for e in ledger[:2]] == ["paused", "approval-expired"]


def _sample(text: str, name: str) -> float:
    (value,) = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and 'tenant="acme"' in line
    ]
    return value
