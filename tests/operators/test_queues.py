"""Operators pause and resume queues and read every queue's figures; pause races acquire."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest

from queue_server.settings import Settings
from queue_server.store import queues as queue_store
from tests.helpers.api import Api, client_for, setup_tenant
from tests.helpers.items import expire, quarantine, sample_queues
from tests.helpers.server import LiveServer, make_admin_key

Db = psycopg.Connection[dict[str, object]]


def _key() -> dict[str, str]:
    return {"Idempotency-Key": uuid.uuid4().hex}


def pause(api: Api, queue: str = "q", key: str | None = None, **body: Any) -> httpx.Response:
    return api.operator.post(
        f"/v1/tenants/{api.tenant}/queues/{queue}/pause",
        json=body,
        headers={"Idempotency-Key": key or uuid.uuid4().hex},
    )


def resume(api: Api, queue: str = "q", **body: Any) -> httpx.Response:
    return api.operator.post(
        f"/v1/tenants/{api.tenant}/queues/{queue}/resume", json=body, headers=_key()
    )


def figures(api: Api, queue: str = "q") -> dict[str, Any]:
    status = api.operator.get(f"/v1/tenants/{api.tenant}/queues")
    assert status.status_code == 200, status.text
    (found,) = [q for q in status.json()["queues"] if q["queue"] == queue]
    return dict(found)


def test_a_paused_queue_hands_out_nothing_but_admits_enqueues_until_resumed(api: Api) -> None:
    api.enqueue("q", 1)
    api.enqueue("other", 2)
    key = uuid.uuid4().hex
    paused = pause(api, key=key, reason="deploying v2")
    assert paused.status_code == 200, paused.text
    assert paused.json()["paused"] is True
    assert paused.json()["pause_reason"] == "deploying v2"
    assert pause(api, key=key, reason="deploying v2").headers["Idempotent-Replayed"] == "true"
    assert pause(api, reason="again").json()["pause_reason"] == "deploying v2"  # no change

    assert api.acquire("q") == []
    api.enqueue("q", 3)  # still admitted
    assert figures(api)["states"]["ready"] == 2
    assert len(api.acquire("other")) == 1  # other queues are not paused

    resumed = resume(api, reason="v2 is out")
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["paused"] is False
    assert len(api.acquire("q", max_items=5)) == 1  # the concurrency limit of 1 holds

    detail = api.operator.get("/v1/tenants/acme/queues/q").json()
    assert [(e["kind"], e["data"]["reason"]) for e in detail["events"]] == [
        ("resumed", "v2 is out"),
        ("paused", "deploying v2"),
    ]
    assert all(e["actor"].startswith("key:") for e in detail["events"])
    assert api.worker.post("/v1/tenants/acme/queues/q/pause", headers=_key()).status_code == 403
    other = setup_tenant(api.url, api.admin, "other")
    assert pause(other, queue="q").status_code == 200  # its own queue q
    assert other.operator.post("/v1/tenants/acme/queues/q/pause", headers=_key()).status_code == 404


def queue_events(api: Api, queue: str = "q") -> list[tuple[str, str]]:
    """The queue's ledger as its page shows it, newest first: (kind, reason) each."""
    detail = api.operator.get(f"/v1/tenants/{api.tenant}/queues/{queue}")
    assert detail.status_code == 200, detail.text
    return [(e["kind"], e["data"]["reason"]) for e in detail.json()["events"]]


def test_resuming_a_queue_that_is_not_paused_changes_nothing_and_records_nothing(
    api: Api,
) -> None:
    api.enqueue("q", 1)
    never_paused = resume(api, reason="nothing to resume")
    assert never_paused.status_code == 200, never_paused.text
    assert never_paused.json()["paused"] is False
    assert queue_events(api) == []

    assert pause(api, reason="deploying").status_code == 200
    assert resume(api, reason="deployed").status_code == 200
    assert resume(api, reason="again").status_code == 200
    assert queue_events(api) == [("resumed", "deployed"), ("paused", "deploying")]


def test_a_queues_page_shows_its_latest_fifty_events_newest_first(api: Api) -> None:
    for n in range(30):
        assert pause(api, reason=f"pause {n}").status_code == 200
        assert resume(api, reason=f"resume {n}").status_code == 200
    detail = api.operator.get(f"/v1/tenants/{api.tenant}/queues/q")
    assert detail.status_code == 200, detail.text
    shown = detail.json()["events"]
    assert [e["seq"] for e in shown] == list(range(59, 9, -1))
    assert (shown[0]["data"]["reason"], shown[-1]["data"]["reason"]) == ("resume 29", "pause 5")


@pytest.fixture
def slow_poll(settings: Settings, database_url: str) -> Iterator[Api]:
    """A server that re-checks a waiting acquire only every 20 s without a notification."""
    server = LiveServer(settings.model_copy(update={"poll_interval": 20.0}), database_url)
    server.start()
    admin = client_for(server.url, make_admin_key(settings, database_url))
    try:
        yield setup_tenant(server.url, admin, "acme")
    finally:
        admin.close()
        server.stop()


def test_resume_wakes_a_long_poll_waiting_on_the_paused_queue(slow_poll: Api) -> None:
    api = slow_poll
    pause(api)
    api.enqueue("q", "waiting")
    result: dict[str, Any] = {}

    def wait_for_work() -> None:
        with api.client(api.keys["worker"]) as client:
            response = client.post(
                "/v1/tenants/acme/queues/q/leases",
                json={"worker": "w1", "lease_ttl": 30, "wait": 15},
            )
            result["at"] = time.monotonic()
            result["leases"] = response.json()["leases"]

    thread = threading.Thread(target=wait_for_work)
    thread.start()
    time.sleep(1.0)
    assert "at" not in result  # still waiting while paused
    resumed_at = time.monotonic()
    assert resume(api).status_code == 200
    thread.join(timeout=20)
    assert len(result["leases"]) == 1
    assert result["at"] - resumed_at < 1.0


def test_no_lease_is_committed_after_pause_answers_while_acquires_race(api: Api, db: Db) -> None:
    """Real connections acquire in a loop while an operator pauses: every lease of the
    queue was committed before the pause, none after, until the resume."""
    api.admin.put("/v1/tenants/acme", json={"backlog_cap": 5000})
    api.approve("q", 1000)  # the policy's max-approved
    for _ in range(4):
        loaded = api.worker.post(
            "/v1/tenants/acme/queues/q/items:batch",
            json={"items": [{"payload": i} for i in range(500)]},
            headers=_key(),
        )
        assert loaded.status_code == 201, loaded.text
    stop = threading.Event()
    answers: list[tuple[float, list[str]]] = []  # (sent at, items leased)

    def acquire(n: int) -> None:
        with api.client(api.keys["worker"]) as client:
            while not stop.is_set():
                sent = time.monotonic()
                got = client.post(
                    "/v1/tenants/acme/queues/q/leases",
                    json={"worker": f"w{n}", "lease_ttl": 30, "max_items": 2},
                )
                assert got.status_code == 200, got.text
                answers.append((sent, [lease["item_id"] for lease in got.json()["leases"]]))

    threads = [threading.Thread(target=acquire, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 10
    while sum(1 for _, got in answers if got) < 16 and time.monotonic() < deadline:
        time.sleep(0.05)
    response = pause(api)
    answered = time.monotonic()
    assert response.status_code == 200, response.text
    # Until more than eight acquires were sent after the answer (a loaded machine may take
    # longer than a quiet one's fraction of a second).
    deadline = time.monotonic() + 10
    while sum(1 for sent, _ in answers if sent > answered) <= 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    # Requests sent after the pause answered got nothing; earlier ones leased.
    assert [got for sent, got in answers if sent > answered and got] == []
    assert any(got for sent, got in answers if sent < answered)
    assert len([1 for sent, _ in answers if sent > answered]) > 8
    paused_at = response.json()["paused_at"]
    late = db.execute(
        "SELECT count(*) AS n FROM item_events WHERE kind = 'acquired' AND at >= %s::timestamptz",
        (paused_at,),
    ).fetchone()
    assert late == {"n": 0}
    assert resume(api).status_code == 200
    assert len(api.acquire("q", max_items=3)) == 3


def test_queue_figures_count_every_state_with_ages_leases_letters_and_rates(
    api: Api, db: Db, database_url: str
) -> None:
    api.approve("q", 10)
    for i in range(6):
        api.enqueue("q", i, max_acquisitions=1)
    fresh = figures(api)
    assert fresh["states"] == {
        "ready": 6,
        "leased": 0,
        "completed": 0,
        "quarantined": 0,
        "cancelled": 0,
    }
    assert fresh["completions"] == {"last_minute": 0, "last_hour": 0, "total": 0}
    assert fresh["oldest_lease_age"] is None
    assert fresh["paused"] is False

    leases = api.acquire("q", max_items=4)
    for lease in leases[:2]:
        api.holder("complete", lease["item_id"], worker="w1", fence=lease["fence"])
    api.holder(
        "triage",
        leases[2]["item_id"],
        worker="w1",
        fence=leases[2]["fence"],
        failure={"class": "Boom", "message": "m", "transient": False},
        decision="quarantine",
    )
    ready = api.operator.get("/v1/tenants/acme/items", params={"state": "ready"}).json()
    api.operator.post(
        f"/v1/tenants/acme/items/{ready['items'][0]['item_id']}/cancel", json={}, headers=_key()
    )
    now = figures(api)
    assert now["states"] == {
        "ready": 1,
        "leased": 1,
        "completed": 2,
        "quarantined": 1,
        "cancelled": 1,
    }
    tenant = api.operator.get("/v1/tenants/acme").json()
    assert [tenant[s] for s in ("ready", "leased", "completed", "quarantined", "cancelled")] == [
        1,
        1,
        2,
        1,
        1,
    ]
    assert tenant["backlog"] == 2  # the ready item and the leased one
    assert now["active_leases"] == 1
    assert now["oldest_lease_age"] is not None
    assert now["oldest_lease_age"] >= 0
    assert now["oldest_ready_age"] is not None
    assert now["open_dead_letters"] == 1
    assert now["quarantines"] == 1
    # Nothing was sampled a minute ago: every completion counts for both windows.
    assert now["completions"] == {"last_minute": 2, "last_hour": 2, "total": 2}
    assert now["failures"] == {"last_minute": 1, "last_hour": 1, "total": 1}

    # Two minutes pass (the sample is moved back), then one more completion.
    sample_queues(database_url)
    db.execute("UPDATE queue_samples SET sampled_at = sampled_at - interval '2 minutes'")
    api.holder("complete", leases[3]["item_id"], worker="w1", fence=leases[3]["fence"])
    later = figures(api)
    assert later["completions"] == {"last_minute": 1, "last_hour": 3, "total": 3}
    assert later["failures"] == {"last_minute": 0, "last_hour": 1, "total": 1}
    # Two hours pass: the hour's window starts from the old sample.
    sample_queues(database_url)
    db.execute("UPDATE queue_samples SET sampled_at = sampled_at - interval '2 hours'")
    assert figures(api)["completions"] == {"last_minute": 0, "last_hour": 0, "total": 3}
    # Pruning keeps each queue's newest sample past the hour, so the window stays right.
    db.execute(queue_store._SQL["prune_samples"], {"limit": 100})
    kept = db.execute("SELECT count(*) AS n FROM queue_samples").fetchone()
    assert kept == {"n": 1}
    assert figures(api)["completions"]["last_hour"] == 0


def test_a_queues_figures_count_an_item_made_ready_since_their_last_look_where_none_was(
    api: Api,
) -> None:
    # The figures are read from where the last look left each priority; an item of a
    # priority the queue had none of is found by the transaction that made it ready.
    api.enqueue("q", 1)
    assert figures(api)["ready"] == 1
    api.enqueue("q", 2, priority=5)
    now = figures(api)
    assert (now["ready"], now["due"]) == (2, 2)


def test_a_queues_figures_count_only_its_own_items_and_a_delayed_item_as_ready_not_due(
    api: Api,
) -> None:
    quarantine(api, "a")
    api.enqueue("b", 1)
    api.enqueue("b", 2, delay=3600)
    b = figures(api, "b")
    assert (b["ready"], b["due"], b["quarantined"]) == (2, 1, 0)
    assert b["states"]["quarantined"] == 0
    a = figures(api, "a")
    assert (a["ready"], a["due"], a["quarantined"]) == (0, 0, 1)


def test_an_expired_lease_is_still_leased_but_neither_active_nor_aged(api: Api, db: Db) -> None:
    api.enqueue("q", 1)
    (lease,) = api.acquire("q")
    held = figures(api)
    assert (held["leased"], held["active_leases"]) == (1, 1)
    assert held["oldest_lease_age"] is not None
    expire(db, lease["item_id"])
    for _ in range(2):  # and at the next look, from where the first one left off
        lapsed = figures(api)
        assert (lapsed["leased"], lapsed["active_leases"]) == (1, 0)
        assert lapsed["oldest_lease_age"] is None


def test_pruning_keeps_the_sample_the_hours_window_starts_from_while_newer_ones_come(
    api: Api, db: Db, database_url: str
) -> None:
    """The last hour's completions count from the latest sample an hour old or more: pruning
    must keep it although samples were taken since."""
    for n in range(2):
        api.enqueue("q", n)

    def complete_one() -> None:
        (lease,) = api.acquire("q")
        done = api.holder("complete", lease["item_id"], worker="w1", fence=lease["fence"])
        assert done.status_code == 200, done.text

    complete_one()
    sample_queues(database_url)
    db.execute("UPDATE queue_samples SET sampled_at = sampled_at - interval '2 hours'")
    complete_one()
    sample_queues(database_url)
    assert figures(api)["completions"] == {"last_minute": 1, "last_hour": 1, "total": 2}
    db.execute(queue_store._SQL["prune_samples"], {"limit": 100})
    assert figures(api)["completions"] == {"last_minute": 1, "last_hour": 1, "total": 2}


def test_the_status_lists_every_lease_each_with_its_holder_and_fence(api: Api) -> None:
    api.approve("q", 10)
    for n in range(6):
        api.enqueue("q", n)
    leases = api.acquire("q", worker="w7", max_items=6)
    assert len(leases) == 6
    status = api.operator.get(f"/v1/tenants/{api.tenant}/queues")
    assert status.status_code == 200, status.text
    shown = {lease["item_id"]: lease for lease in status.json()["leases"]}
    assert set(shown) == {lease["item_id"] for lease in leases}
    assert {(s["queue"], s["worker"]) for s in shown.values()} == {("q", "w7")}
    assert all(shown[lease["item_id"]]["fence"] == lease["fence"] for lease in leases)


def test_the_status_lists_leases_oldest_first_from_their_latest_acquisition(api: Api) -> None:
    """An item leased again shows when its current lease began, not its first one, and
    sorts among the leases by that."""
    api.approve("q", 10)
    first = api.enqueue("q", "first")["item_id"]
    second = api.enqueue("q", "second")["item_id"]
    (lease,) = api.acquire("q")
    assert lease["item_id"] == first
    assert [held["item_id"] for held in api.acquire("q")] == [second]
    requeued = api.holder("requeue", first, worker="w1", fence=lease["fence"])
    assert requeued.status_code == 200, requeued.text
    (again,) = api.acquire("q")
    assert again["item_id"] == first

    leases = api.operator.get(f"/v1/tenants/{api.tenant}/queues").json()["leases"]
    assert [held["item_id"] for held in leases] == [second, first]
    events = api.operator.get(f"/v1/tenants/{api.tenant}/items/{first}/ledger").json()["events"]
    acquired = [e["at"] for e in events if e["kind"] == "acquired"]
    assert len(acquired) == 2
    assert leases[1]["acquired_at"] == acquired[-1]
