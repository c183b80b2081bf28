"""Operators list, filter and cancel items: pages, cancel of one item or a filter's page,
the holder refused with item-cancelled, and cancel racing complete on real connections."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import httpx
import psycopg

from tests.helpers.api import Api, setup_tenant
from tests.helpers.invariants import assert_backlog_counter_matches, assert_ledgers_fold_to_rows

Db = psycopg.Connection[dict[str, object]]


def _key() -> dict[str, str]:
    return {"Idempotency-Key": uuid.uuid4().hex}


def items(api: Api, **params: Any) -> dict[str, Any]:
    response = api.operator.get("/v1/tenants/acme/items", params=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def ids(page: dict[str, Any]) -> list[str]:
    return [item["item_id"] for item in page["items"]]


def cancel(api: Api, item_id: object, key: str | None = None, **body: Any) -> httpx.Response:
    return api.operator.post(
        f"/v1/tenants/acme/items/{item_id}/cancel",
        json=body,
        headers={"Idempotency-Key": key or uuid.uuid4().hex},
    )


def test_list_filters_by_queue_state_time_and_payload_and_pages_in_creation_order(
    api: Api, db: Db
) -> None:
    api.approve("a", 10)
    a = [api.enqueue("a", {"customer": i % 2, "n": i}) for i in range(5)]
    b = [api.enqueue("b", {"customer": 1, "n": 9})]
    (lease,) = api.acquire("a")  # a[0] leased
    done = api.acquire("a")[0]  # a[1] leased, then completed
    api.holder("complete", done["item_id"], worker="w1", fence=done["fence"])

    everything = items(api)
    assert ids(everything) == [x["item_id"] for x in a + b]
    assert everything["next_cursor"] is None
    assert everything["items"][0]["state"] == "leased"
    assert set(everything["items"][0]) >= {"item_id", "queue", "state", "payload", "fence"}

    assert ids(items(api, queue="b")) == [b[0]["item_id"]]
    assert ids(items(api, state="ready")) == [x["item_id"] for x in a[2:] + b]
    assert ids(items(api, state="ready", queue="a")) == [x["item_id"] for x in a[2:]]
    assert ids(items(api, state="leased")) == [lease["item_id"]]
    assert ids(items(api, state="completed", queue="a")) == [done["item_id"]]
    assert ids(items(api, state="quarantined")) == []
    assert ids(items(api, payload='{"customer": 1}')) == [x["item_id"] for x in (a[1], a[3], b[0])]
    assert ids(items(api, queue="a", payload='{"customer": 1, "n": 3}')) == [a[3]["item_id"]]
    middle = db.execute(
        "SELECT created_at FROM work_items WHERE item_id = %s", (a[2]["item_id"],)
    ).fetchone()
    assert middle is not None
    at = middle["created_at"].isoformat()  # type: ignore[attr-defined]
    assert ids(items(api, created_after=at)) == [x["item_id"] for x in a[3:] + b]
    assert ids(items(api, created_before=at)) == [x["item_id"] for x in a[:2]]

    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = items(api, **params)
        seen += ids(page)
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [x["item_id"] for x in a + b]
    assert pages == 3

    # Leased items are held to the time filters too: b's, made after `at`, once leased.
    api.acquire("b")
    assert ids(items(api, created_before=at)) == [x["item_id"] for x in a[:2]]
    assert ids(items(api, created_after=at, state="leased")) == [b[0]["item_id"]]


def test_list_refuses_bad_filters_workers_and_other_tenants(api: Api) -> None:
    for params, field in (
        ({"payload": "{not json"}, "payload"),
        ({"state": "sleeping"}, "state"),
        ({"created_after": "yesterday"}, "created_after"),
        ({"created_after": "2026-01-01T00:00:00"}, "created_after"),
        ({"cursor": "nonsense"}, "cursor"),
        ({"limit": 0}, "limit"),
    ):
        response = api.operator.get("/v1/tenants/acme/items", params=params)
        assert response.status_code == 422, (params, response.text)
        assert response.json()["code"] == "invalid-request"
        assert field in response.text
    assert api.worker.get("/v1/tenants/acme/items").status_code == 403
    other = setup_tenant(api.url, api.admin, "other")
    api.enqueue("q", "acme's")
    assert other.operator.get("/v1/tenants/acme/items").status_code == 404
    assert other.operator.get("/v1/tenants/other/items").json()["items"] == []
    assert api.admin.get("/v1/tenants/nobody/items").status_code == 404


def test_cancel_a_ready_item_releases_the_backlog_and_ledgers_who_and_why(api: Api, db: Db) -> None:
    api.admin.put("/v1/tenants/acme", json={"backlog_cap": 1})
    item = api.enqueue("q", "x")
    key = uuid.uuid4().hex
    response = cancel(api, item["item_id"], key, reason="customer asked")
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "cancelled"
    replayed = cancel(api, item["item_id"], key, reason="customer asked")
    assert replayed.status_code == 200
    assert replayed.headers["Idempotent-Replayed"] == "true"
    assert replayed.json() == response.json()

    ledger = api.operator.get(f"/v1/tenants/acme/items/{item['item_id']}/ledger").json()
    last = ledger["events"][-1]
    assert last["kind"] == "cancelled"
    assert last["actor"] == f"key:{api.keys['operator'].split('_')[1]}"
    assert last["data"]["reason"] == "customer asked"
    assert last["data"]["previous_state"] == "ready"
    # The backlog has room again: the cap of 1 admits another item.
    api.enqueue("q", "y")
    assert_backlog_counter_matches(db)

    again = cancel(api, item["item_id"])
    assert again.status_code == 409
    assert again.json()["code"] == "invalid-state"
    assert cancel(api, uuid.uuid4()).status_code == 404
    worker = api.worker.post(
        f"/v1/tenants/acme/items/{item['item_id']}/cancel", json={}, headers=_key()
    )
    assert worker.status_code == 403
    assert api.operator.post(f"/v1/tenants/acme/items/{item['item_id']}/cancel").status_code == 400


def test_a_cancelled_lease_refuses_its_holder_with_item_cancelled(api: Api, db: Db) -> None:
    item = api.enqueue("q", "long job")
    (lease,) = api.acquire("q", worker="w1")
    response = cancel(api, item["item_id"], reason="stuck")
    assert response.status_code == 200, response.text
    cancelled = response.json()
    assert cancelled["state"] == "cancelled"
    assert cancelled["lease_holder"] is None

    for action, body in (
        ("heartbeat", {}),
        ("complete", {"result": "late"}),
        ("requeue", {"reason": "x"}),
    ):
        refused = api.holder(action, item["item_id"], worker="w1", fence=lease["fence"], **body)
        assert refused.status_code == 409, refused.text
        problem = refused.json()
        assert problem["code"] == "item-cancelled"
        assert problem["reason"] == "stuck"
        assert problem["cancelled_by"].startswith("key:")
    # Someone else's stale call on the same item is told the item is not leased.
    other = api.holder("complete", item["item_id"], worker="w2", fence=lease["fence"])
    assert other.json()["code"] == "item-not-leased"
    # The lease left the backlog and the queue's concurrency slot is free again.
    api.enqueue("q", "next")
    assert len(api.acquire("q", worker="w3")) == 1
    assert_ledgers_fold_to_rows(db)
    assert_backlog_counter_matches(db)


def test_a_holder_is_told_of_the_cancel_that_ended_its_own_lease(api: Api) -> None:
    # Cancelled, retried, leased again and cancelled again: the second holder is told of
    # the second cancel, the one that ended its lease, not of the first.
    item = api.enqueue("q", "job")
    api.acquire("q", worker="w1")
    assert cancel(api, item["item_id"], reason="first").status_code == 200
    retried = api.operator.post(
        "/v1/tenants/acme/items:retry", json={"filter": {"state": "cancelled"}}, headers=_key()
    )
    assert retried.json()["item_ids"] == [item["item_id"]]
    (lease,) = api.acquire("q", worker="w2")
    assert cancel(api, item["item_id"], reason="second").status_code == 200
    refused = api.holder("complete", item["item_id"], worker="w2", fence=lease["fence"])
    assert refused.status_code == 409, refused.text
    assert (refused.json()["code"], refused.json()["reason"]) == ("item-cancelled", "second")


def test_cancelling_a_quarantined_item_closes_its_dead_letter(api: Api) -> None:
    item = api.enqueue("q", "poison", max_acquisitions=1)
    (lease,) = api.acquire("q")
    api.holder("requeue", item["item_id"], worker="w1", fence=lease["fence"])
    assert api.acquire("q") == []  # quarantined past its budget
    response = cancel(api, item["item_id"], reason="poison")
    assert response.status_code == 200, response.text
    letters = api.operator.get("/v1/tenants/acme/dead-letters", params={"status": "all"}).json()
    (letter,) = letters["dead_letters"]
    assert letter["resolution"] == "cancelled"


def test_cancelling_quarantined_items_leaves_the_backlog_and_its_cap_exact(
    api: Api, db: Db
) -> None:
    """A quarantined item already left the backlog: cancelling it, alone or by filter, gives
    back no room, and the cap still admits exactly its number of items."""
    api.admin.put("/v1/tenants/acme", json={"backlog_cap": 3})
    for _ in range(2):
        item = api.enqueue("q", "poison", max_acquisitions=1)
        (lease,) = api.acquire("q")
        api.holder("requeue", item["item_id"], worker="w1", fence=lease["fence"])
    assert api.acquire("q") == []  # both quarantined past their budget
    (first, second) = ids(items(api, state="quarantined"))
    assert cancel(api, first, reason="poison").status_code == 200
    by_filter = api.operator.post(
        "/v1/tenants/acme/items:cancel",
        json={"filter": {"state": "quarantined"}, "reason": "poison"},
        headers=_key(),
    )
    assert by_filter.status_code == 200, by_filter.text
    assert by_filter.json()["item_ids"] == [second]
    assert api.operator.get("/v1/tenants/acme/queues").json()["backlog"] == 0

    for n in range(3):
        api.enqueue("q", n)
    assert api.operator.get("/v1/tenants/acme/queues").json()["backlog"] == 3
    refused = api.worker.post(
        "/v1/tenants/acme/queues/q/items", json={"payload": 3}, headers=_key()
    )
    assert refused.status_code == 429, refused.text
    assert refused.json()["code"] == "backlog-cap-reached"
    assert_backlog_counter_matches(db)


def test_cancel_by_filter_is_bounded_resumable_and_idempotent(api: Api, db: Db) -> None:
    api.approve("q", 10)
    doomed = [api.enqueue("q", {"batch": 7, "n": i}) for i in range(5)]
    kept = [api.enqueue("q", {"batch": 8}), api.enqueue("other", {"batch": 7})]
    api.acquire("q", max_items=2)  # two of the doomed are leased: cancelled too
    body = {"filter": {"queue": "q", "payload": {"batch": 7}}, "reason": "bad batch", "limit": 2}

    key = uuid.uuid4().hex
    first = api.operator.post(
        "/v1/tenants/acme/items:cancel", json=body, headers={"Idempotency-Key": key}
    )
    assert first.status_code == 200, first.text
    assert first.json()["cancelled"] == 2
    assert first.json()["next_cursor"]
    replay = api.operator.post(
        "/v1/tenants/acme/items:cancel", json=body, headers={"Idempotency-Key": key}
    )
    assert replay.json() == first.json()
    assert replay.headers["Idempotent-Replayed"] == "true"

    cancelled = first.json()["cancelled"]
    cursor = first.json()["next_cursor"]
    calls = 1
    while cursor:
        page = api.operator.post(
            "/v1/tenants/acme/items:cancel", json={**body, "cursor": cursor}, headers=_key()
        )
        assert page.status_code == 200, page.text
        cancelled += page.json()["cancelled"]
        cursor = page.json()["next_cursor"]
        calls += 1
    assert cancelled == len(doomed)
    assert calls == 3
    states = {
        str(r["item_id"]): r["state"]
        for r in db.execute("SELECT item_id, state::text AS state FROM work_items").fetchall()
    }
    assert all(states[str(x["item_id"])] == "cancelled" for x in doomed)
    assert all(states[str(x["item_id"])] == "ready" for x in kept)
    # Run again from the start: nothing left to cancel.
    again = api.operator.post("/v1/tenants/acme/items:cancel", json=body, headers=_key())
    assert again.json() == {"cancelled": 0, "item_ids": [], "next_cursor": None}
    refused = api.operator.post(
        "/v1/tenants/acme/items:cancel",
        json={"filter": {"state": "completed"}, "reason": "x"},
        headers=_key(),
    )
    assert refused.status_code == 422
    assert_ledgers_fold_to_rows(db)
    assert_backlog_counter_matches(db)


def test_cancel_racing_complete_lets_exactly_one_win_per_item(api: Api, db: Db) -> None:
    """Real connections: for each leased item an operator cancels while its holder completes.
    Exactly one of the two takes effect; the loser is refused with the reason."""
    total = 24
    api.approve("q", total)
    for i in range(total):
        api.enqueue("q", i)
    leases = api.acquire("q", worker="w1", max_items=total)
    assert len(leases) == total
    outcomes: dict[str, dict[str, httpx.Response]] = {str(x["item_id"]): {} for x in leases}
    barrier = threading.Barrier(2 * total)

    def run(n: int) -> None:
        lease = leases[n // 2]
        item_id = str(lease["item_id"])
        if n % 2 == 0:
            with api.client(api.keys["operator"]) as c:
                barrier.wait()
                outcomes[item_id]["cancel"] = c.post(
                    f"/v1/tenants/acme/items/{item_id}/cancel", json={}, headers=_key()
                )
        else:
            with api.client(api.keys["worker"]) as c:
                barrier.wait()
                outcomes[item_id]["complete"] = c.post(
                    f"/v1/tenants/acme/items/{item_id}/complete",
                    json={"worker": "w1", "fence": lease["fence"], "result": "done"},
                    headers=_key(),
                )

    threads = [threading.Thread(target=run, args=(n,)) for n in range(2 * total)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    winners = {"cancel": 0, "complete": 0}
    for item_id, answers in outcomes.items():
        ok = [name for name, r in answers.items() if r.status_code == 200]
        assert len(ok) == 1, {n: r.text for n, r in answers.items()}
        (winner,) = ok
        winners[winner] += 1
        loser = answers["complete" if winner == "cancel" else "cancel"]
        assert loser.status_code == 409
        expected = "item-cancelled" if winner == "cancel" else "invalid-state"
        assert loser.json()["code"] == expected
        row = db.execute(
            "SELECT state::text AS state FROM work_items WHERE item_id = %s", (item_id,)
        ).fetchone()
        assert row == {"state": "completed" if winner == "complete" else "cancelled"}
    assert winners["cancel"] + winners["complete"] == total
    assert_ledgers_fold_to_rows(db)
    assert_backlog_counter_matches(db)
    # The queue's counters agree with the rows.
    status = api.operator.get("/v1/tenants/acme/queues").json()
    (queue,) = status["queues"]
    assert queue["states"]["completed"] == winners["complete"]
    assert queue["states"]["cancelled"] == winners["cancel"]


def test_a_cancel_of_ready_items_spares_one_leased_while_the_cancel_waited_for_it(
    api: Api, db: Db, database_url: str
) -> None:
    """A filter on `ready` cancels what is still ready when the cancel gets to it: an item a
    worker leased after the page was read, while the cancel waited for its row, keeps its
    lease."""
    item_id = api.enqueue("q", "racing")["item_id"]
    answers: list[httpx.Response] = []

    def cancel_ready() -> None:
        answers.append(
            api.operator.post(
                "/v1/tenants/acme/items:cancel",
                json={"filter": {"state": "ready"}, "reason": "clean-up"},
                headers=_key(),
            )
        )

    with psycopg.connect(database_url) as acquiring:
        # What an acquire writes, its commit held back until the cancel waits on the row.
        acquiring.execute(
            "UPDATE work_items SET state = 'leased', lease_holder = 'w-race', fence = fence + 1,"
            " acquisition_count = acquisition_count + 1,"
            " lease_expires_at = now() + interval '1 minute',"
            " lease_deadline_at = now() + interval '5 minutes'"
            " WHERE item_id = %s",
            (item_id,),
        )
        cancelling = threading.Thread(target=cancel_ready)
        cancelling.start()
        waiting = (
            "SELECT count(*) AS n FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        deadline = time.monotonic() + 10
        while db.execute(waiting).fetchone()["n"] == 0:  # type: ignore[index]
            assert time.monotonic() < deadline, "the cancel never waited for the row"
            time.sleep(0.02)
        acquiring.commit()
    cancelling.join(30)
    [answer] = answers
    assert answer.status_code == 200, answer.text
    assert (answer.json()["cancelled"], answer.json()["item_ids"]) == (0, [])
    row = db.execute(
        "SELECT state::text AS state, lease_holder FROM work_items WHERE item_id = %s", (item_id,)
    ).fetchone()
    assert row == {"state": "leased", "lease_holder": "w-race"}
