"""Bulk actions on any item: retry (quarantined or cancelled -> ready now, under the
backlog cap, as a replay) and delete (completed or cancelled, with their ledger, kept in
the queue's ledger), by filter and cursor as items:cancel."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import psycopg

from tests.helpers.api import Api
from tests.helpers.items import quarantine

DB = psycopg.Connection[dict[str, object]]


def _post(api: Api, action: str, key: str | None = None, **body: Any) -> httpx.Response:
    return api.operator.post(
        f"/v1/tenants/acme/items:{action}",
        json=body,
        headers={"Idempotency-Key": key or uuid.uuid4().hex},
    )


def _verified(api: Api) -> dict[str, Any]:
    answer: dict[str, Any] = api.operator.get("/v1/tenants/acme/ledger-verification").json()
    return answer


def test_retry_makes_quarantined_items_ready_now_and_closes_their_dead_letters(
    api: Api, db: DB
) -> None:
    poisoned = [quarantine(api, "q", f"p{n}") for n in range(3)]
    other = quarantine(api, "elsewhere")
    response = _post(api, "retry", filter={"queue": "q", "state": "quarantined"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["retried"], body["over_cap"], body["next_cursor"]) == (3, 0, None)
    assert sorted(body["item_ids"]) == sorted(poisoned)
    for item_id in poisoned:
        item = api.operator.get(f"/v1/tenants/acme/items/{item_id}").json()
        assert (item["state"], item["acquisition_count"], item["fence"]) == ("ready", 0, 1)
        events = api.operator.get(f"/v1/tenants/acme/items/{item_id}/ledger").json()["events"]
        assert events[-1]["kind"] == "retried"
        assert events[-1]["data"]["from"] == "quarantined"
    assert api.operator.get(f"/v1/tenants/acme/items/{other}").json()["state"] == "quarantined"
    letters = db.execute(
        "SELECT resolution, count(*) AS n FROM dead_letters WHERE queue = 'q' GROUP BY 1"
    ).fetchall()
    assert letters == [{"resolution": "retried", "n": 3}]
    tenant = api.admin.get("/v1/tenants/acme").json()
    assert (tenant["backlog"], tenant["ready"], tenant["quarantined"]) == (3, 3, 1)
    # A retried item is leased again under a higher fence: the old holder stays refused.
    (lease,) = api.acquire("q", max_items=1)
    assert lease["fence"] == 2
    assert _verified(api)["mismatches"] == []


def test_retry_of_cancelled_items_puts_them_back_in_the_backlog_and_the_counts(api: Api) -> None:
    ids = [str(api.enqueue("q", n)["item_id"]) for n in range(2)]
    cancelled = _post(api, "cancel", filter={"queue": "q"}, reason="oops")
    assert cancelled.json()["cancelled"] == 2
    assert api.admin.get("/v1/tenants/acme").json()["cancelled"] == 2
    response = _post(api, "retry", filter={"state": "cancelled"})
    assert response.status_code == 200, response.text
    assert sorted(response.json()["item_ids"]) == sorted(ids)
    tenant = api.admin.get("/v1/tenants/acme").json()
    assert (tenant["backlog"], tenant["ready"], tenant["cancelled"]) == (2, 2, 0)
    assert _verified(api)["mismatches"] == []


def test_retry_stops_at_the_backlog_cap_and_resumes_where_it_stopped(api: Api) -> None:
    poisoned = sorted(quarantine(api, "q", f"p{n}") for n in range(3))
    api.enqueue("q", "fills the backlog")
    assert api.admin.put("/v1/tenants/acme", json={"backlog_cap": 2}).status_code == 200
    first = _post(api, "retry", filter={"state": "quarantined"}, limit=10)
    assert first.status_code == 200, first.text
    body = first.json()
    assert (body["retried"], body["over_cap"], body["backlog_cap"]) == (1, 2, 2)
    assert body["next_cursor"] is not None
    refused = _post(api, "retry", filter={"state": "quarantined"}, cursor=body["next_cursor"])
    assert refused.status_code == 429, refused.text
    assert refused.json()["code"] == "backlog-cap-reached"
    states = [api.operator.get(f"/v1/tenants/acme/items/{i}").json()["state"] for i in poisoned]
    assert sorted(states) == ["quarantined", "quarantined", "ready"]
    assert api.admin.get("/v1/tenants/acme").json()["backlog"] == 2  # never past the cap


def test_delete_removes_finished_items_with_their_ledger_and_the_queue_keeps_who(
    api: Api, db: DB
) -> None:
    done = []
    for n in range(3):
        item = api.enqueue("q", n)
        (lease,) = api.acquire("q")
        assert (
            api.holder("complete", item["item_id"], worker="w1", fence=lease["fence"]).status_code
            == 200
        )
        done.append(str(item["item_id"]))
    kept = str(api.enqueue("q", "still ready")["item_id"])
    assert api.admin.get("/v1/tenants/acme").json()["completed"] == 3

    first = _post(api, "delete", filter={"queue": "q", "state": "completed"}, limit=2)
    assert first.status_code == 200, first.text
    assert (first.json()["deleted"], len(first.json()["item_ids"])) == (2, 2)
    second = _post(api, "delete", filter={"queue": "q", "state": "completed"}, limit=2,
                   cursor=first.json()["next_cursor"])  # fmt: skip
    assert (second.json()["deleted"], second.json()["next_cursor"]) == (1, None)
    deleted = first.json()["item_ids"] + second.json()["item_ids"]
    assert sorted(deleted) == sorted(done)
    for item_id in done:
        assert api.operator.get(f"/v1/tenants/acme/items/{item_id}").status_code == 404
    ledger_rows = db.execute(
        "SELECT count(*) AS n FROM item_events WHERE item_id = ANY(%s::uuid[])", (done,)
    ).fetchone()
    assert ledger_rows == {"n": 0}
    assert api.operator.get(f"/v1/tenants/acme/items/{kept}").json()["state"] == "ready"
    tenant = api.admin.get("/v1/tenants/acme").json()
    assert (tenant["completed"], tenant["ready"]) == (0, 1)
    events = db.execute(
        "SELECT kind, actor, data FROM queue_events WHERE queue = 'q' ORDER BY seq"
    ).fetchall()
    assert [e["kind"] for e in events] == ["deleted", "deleted"]
    key_id = api.operator.get("/v1/whoami").json()["key_id"]
    assert {e["actor"] for e in events} == {f"key:{key_id}"}
    assert sorted(i for e in events for i in e["data"]["item_ids"]) == sorted(done)  # type: ignore[index]
    assert _verified(api)["mismatches"] == []


def test_bulk_retry_and_delete_refuse_what_they_do_not_cover(api: Api) -> None:
    item = api.enqueue("q", "x")
    for action, state in (("retry", "ready"), ("retry", "completed"), ("delete", "ready"),
                          ("delete", "quarantined"), ("delete", None), ("retry", None)):  # fmt: skip
        flt = {"queue": "q"} if state is None else {"queue": "q", "state": state}
        refused = _post(api, action, filter=flt)
        assert refused.status_code == 422, (action, state, refused.text)
    worker = api.worker.post(
        "/v1/tenants/acme/items:delete",
        json={"filter": {"state": "completed"}},
        headers={"Idempotency-Key": "w"},
    )
    assert worker.status_code == 403
    assert api.operator.get(f"/v1/tenants/acme/items/{item['item_id']}").json()["state"] == "ready"


def test_a_bulk_action_takes_up_to_a_thousand_items_a_call(api: Api) -> None:
    for action, state in (("retry", "quarantined"), ("delete", "completed")):
        for limit, status in ((1000, 200), (1001, 422), (0, 422)):
            answer = _post(api, action, filter={"state": state}, limit=limit)
            assert answer.status_code == status, (action, limit, answer.text)
    for limit, status in ((1000, 200), (1001, 422)):
        answer = api.operator.post(
            "/v1/tenants/acme/items:cancel",
            json={"filter": {"queue": "q"}, "reason": "a bound", "limit": limit},
            headers={"Idempotency-Key": uuid.uuid4().hex},
        )
        assert answer.status_code == status, (limit, answer.text)


def test_a_repeated_key_replays_the_first_answer(api: Api) -> None:
    quarantine(api, "q")
    first = _post(api, "retry", key="same", filter={"state": "quarantined"})
    again = _post(api, "retry", key="same", filter={"state": "quarantined"})
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json()
    reused = _post(api, "retry", key="same", filter={"state": "cancelled"})
    assert reused.status_code == 422
    assert reused.json()["code"] == "idempotency-key-reuse"


def test_a_delete_counts_each_state_it_removed_and_each_queue_ledgers_its_own(
    api: Api, db: DB
) -> None:
    done = {}
    for queue in ("a", "b"):
        api.enqueue(queue, "x")
        (lease,) = api.acquire(queue)
        assert api.holder("complete", lease["item_id"], worker="w1", fence=lease["fence"])
        done[queue] = str(lease["item_id"])
    cancelled = str(api.enqueue("a", "y")["item_id"])
    assert _post(api, "cancel", filter={"queue": "a"}, reason="x").json()["cancelled"] == 1
    response = _post(api, "delete", filter={"state": "cancelled"})
    assert response.json()["item_ids"] == [cancelled], response.text
    tenant = api.admin.get("/v1/tenants/acme").json()
    assert (tenant["completed"], tenant["cancelled"]) == (2, 0)
    response = _post(api, "delete", filter={"state": "completed"})
    assert sorted(response.json()["item_ids"]) == sorted(done.values())
    rows = db.execute(
        "SELECT queue, data FROM queue_events WHERE kind = 'deleted' AND data->>'state' = 'completed'"
    ).fetchall()
    assert {str(r["queue"]): r["data"]["item_ids"] for r in rows} == {  # type: ignore[index]
        queue: [item_id] for queue, item_id in done.items()
    }
