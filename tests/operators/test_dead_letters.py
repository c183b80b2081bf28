"""Dead-letter routes: list, show, replay, discard, bulk replay; roles, tenants, idempotency."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from tests.helpers.api import Api, setup_tenant
from tests.helpers.items import (
    complete_leases,
    dead_letter_of,
    dead_letters,
    ledger_mismatches,
    quarantine,
    replay,
)

DB = psycopg.Connection[dict[str, object]]


def _key() -> dict[str, str]:
    return {"Idempotency-Key": uuid.uuid4().hex}


def test_budget_exhaustion_and_triage_both_leave_a_dead_letter(api: Api) -> None:
    poisoned = quarantine(api, payload={"n": 1})
    item = api.enqueue("q", {"n": 2}, max_acquisitions=1)
    (lease,) = api.acquire("q")
    requeued = api.holder("requeue", item["item_id"], worker="w1", fence=lease["fence"])
    assert requeued.status_code == 200, requeued.text
    assert api.acquire("q") == []  # past its budget: quarantined, not handed out

    listed = dead_letters(api.operator)["dead_letters"]
    assert [d["item_id"] for d in listed] == [poisoned, item["item_id"]]
    assert [d["reason"] for d in listed] == [
        "quarantined by triage",
        "acquisition budget exhausted",
    ]
    assert listed[0]["last_failure"]["message"] == "poisoned"
    assert set(listed[0]) >= {
        "dead_letter_id",
        "kind",
        "item_id",
        "queue",
        "reason",
        "last_failure",
        "created_at",
    }
    assert dead_letters(api.operator)["next_cursor"] is None


def test_list_filters_by_queue_and_kind_and_pages_in_a_stable_order(api: Api) -> None:
    ids = [quarantine(api, "a") for _ in range(3)] + [quarantine(api, "b") for _ in range(2)]
    assert [d["item_id"] for d in dead_letters(api.operator, queue="b")["dead_letters"]] == ids[3:]
    assert dead_letters(api.operator, kind="delivery")["dead_letters"] == []
    assert len(dead_letters(api.operator, kind="item")["dead_letters"]) == 5

    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = dead_letters(api.operator, **params)
        seen += [d["item_id"] for d in page["dead_letters"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids
    assert pages == 3
    # A page that holds the last of them says so: no cursor to an empty page.
    whole = dead_letters(api.operator, queue="a", limit=3)
    assert (len(whole["dead_letters"]), whole["next_cursor"]) == (3, None)

    bad = api.operator.get("/v1/tenants/acme/dead-letters", params={"cursor": "nonsense"})
    assert bad.status_code == 422
    assert bad.json()["code"] == "invalid-request"


def test_show_returns_the_item_and_its_whole_ledger(api: Api) -> None:
    item_id = quarantine(api, payload={"x": 1})
    dead_letter_id = dead_letter_of(api, item_id)
    response = api.operator.get(f"/v1/tenants/acme/dead-letters/{dead_letter_id}")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["dead_letter"]["dead_letter_id"] == dead_letter_id
    assert body["item"]["item_id"] == item_id
    assert body["item"]["state"] == "quarantined"
    assert [e["kind"] for e in body["events"]] == ["enqueued", "acquired", "triaged"]

    missing = api.operator.get(f"/v1/tenants/acme/dead-letters/{uuid.uuid4()}")
    assert missing.status_code == 404
    assert missing.json()["code"] == "dead-letter-not-found"


def test_replay_puts_the_item_back_with_a_renewed_budget_and_a_rising_fence(
    api: Api, db: DB
) -> None:
    item = api.enqueue("q", {"n": 1}, max_acquisitions=1)
    (lease,) = api.acquire("q")
    api.holder("requeue", item["item_id"], worker="w1", fence=lease["fence"])
    assert api.acquire("q") == []
    dead_letter_id = dead_letter_of(api, str(item["item_id"]))

    response = replay(api, dead_letter_id, max_acquisitions=3)
    assert response.status_code == 200, response.text
    replayed = response.json()
    assert replayed["state"] == "ready"
    assert replayed["acquisition_count"] == 0
    assert replayed["max_acquisitions"] == 3
    assert replayed["fence"] == lease["fence"]

    (again,) = api.acquire("q", worker="w2")
    assert again["item_id"] == item["item_id"]
    assert again["fence"] == int(str(lease["fence"])) + 1
    ledger = api.operator.get(f"/v1/tenants/acme/items/{item['item_id']}/ledger").json()
    kinds = [e["kind"] for e in ledger["events"]]
    assert kinds[-2:] == ["replayed", "acquired"]
    assert ledger["events"][-2]["data"]["dead_letter_id"] == dead_letter_id

    assert dead_letters(api.operator)["dead_letters"] == []
    closed = dead_letters(api.operator, status="closed")["dead_letters"]
    assert [(d["dead_letter_id"], d["resolution"]) for d in closed] == [
        (dead_letter_id, "replayed")
    ]
    row = db.execute(
        "SELECT closed_at FROM dead_letters WHERE dead_letter_id = %s", (dead_letter_id,)
    ).fetchone()
    assert row is not None
    assert row["closed_at"] is not None


def test_replay_is_idempotent_and_a_second_replay_is_refused(api: Api) -> None:
    dead_letter_id = dead_letter_of(api, quarantine(api))
    first = replay(api, dead_letter_id, key="replay-1")
    again = replay(api, dead_letter_id, key="replay-1")
    assert first.status_code == again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()

    other = replay(api, dead_letter_id, key="replay-2")
    assert other.status_code == 409
    assert other.json()["code"] == "dead-letter-closed"

    reuse = replay(api, dead_letter_id, key="replay-1", max_acquisitions=4)
    assert reuse.status_code == 422
    assert reuse.json()["code"] == "idempotency-key-reuse"

    no_key = api.operator.post(f"/v1/tenants/acme/dead-letters/{dead_letter_id}/replay")
    assert no_key.status_code == 400
    assert no_key.json()["code"] == "idempotency-key-required"


def test_discard_cancels_the_item_and_closes_the_dead_letter(api: Api) -> None:
    item_id = quarantine(api)
    dead_letter_id = dead_letter_of(api, item_id)
    response = api.operator.post(
        f"/v1/tenants/acme/dead-letters/{dead_letter_id}/discard",
        json={"reason": "bad data"},
        headers=_key(),
    )
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "cancelled"
    assert dead_letters(api.operator)["dead_letters"] == []
    ledger = api.operator.get(f"/v1/tenants/acme/items/{item_id}/ledger").json()
    assert ledger["events"][-1]["kind"] == "cancelled"
    assert ledger["events"][-1]["data"]["reason"] == "bad data"

    refused = replay(api, dead_letter_id)
    assert refused.status_code == 409
    assert refused.json()["code"] == "dead-letter-closed"


def test_each_status_lists_its_own_dead_letters(api: Api) -> None:
    closed_id = dead_letter_of(api, quarantine(api))
    assert replay(api, closed_id).status_code == 200
    open_id = dead_letter_of(api, quarantine(api, "other"))

    def listed(status: str, **filters: str) -> list[str]:
        page = dead_letters(api.operator, status=status, **filters)
        return [d["dead_letter_id"] for d in page["dead_letters"]]

    assert listed("open") == [open_id]
    assert listed("closed") == [closed_id]
    assert sorted(listed("all")) == sorted([open_id, closed_id])
    # Each status keeps the queue and kind filters.
    assert listed("closed", queue="other") == []
    assert listed("all", queue="other") == [open_id]
    assert listed("closed", kind="delivery") == listed("all", kind="delivery") == []


def test_bulk_replay_is_bounded_per_call_and_reports_counts(api: Api, db: DB) -> None:
    ids = [quarantine(api, "bulk") for _ in range(5)]
    quarantine(api, "other")
    # A dead letter whose item is no longer quarantined is skipped, untouched.
    stale = dead_letter_of(api, ids[0])
    db.execute(
        "UPDATE work_items SET state = 'cancelled' WHERE item_id = %s",
        (ids[0],),
    )

    def bulk(limit: int) -> dict[str, Any]:
        response = api.operator.post(
            "/v1/tenants/acme/queues/bulk/dead-letters:replay",
            json={"limit": limit},
            headers=_key(),
        )
        assert response.status_code == 200, response.text
        body: dict[str, Any] = response.json()
        return body

    first = bulk(3)
    assert (first["replayed"], first["skipped"], first["remaining"]) == (2, 1, 3)
    assert first["skipped_dead_letter_ids"] == [stale]
    assert first["item_ids"] == ids[1:3]
    second = bulk(100)
    assert (second["replayed"], second["skipped"], second["remaining"]) == (2, 1, 1)
    states = {
        str(r["item_id"]): r["state"]
        for r in db.execute("SELECT item_id, state::text FROM work_items WHERE queue = 'bulk'")
    }
    assert states == {ids[0]: "cancelled", **{i: "ready" for i in ids[1:]}}
    assert len(dead_letters(api.operator, queue="other")["dead_letters"]) == 1

    too_many = api.operator.post(
        "/v1/tenants/acme/queues/bulk/dead-letters:replay", json={"limit": 101}, headers=_key()
    )
    assert too_many.status_code == 422


def test_worker_key_is_forbidden_and_another_tenant_is_not_found(api: Api) -> None:
    dead_letter_id = dead_letter_of(api, quarantine(api))
    base = f"/v1/tenants/acme/dead-letters/{dead_letter_id}"
    for response in (
        api.worker.get("/v1/tenants/acme/dead-letters"),
        api.worker.get(base),
        api.worker.post(f"{base}/replay", json={}, headers=_key()),
        api.worker.post(f"{base}/discard", json={}, headers=_key()),
        api.worker.post("/v1/tenants/acme/queues/q/dead-letters:replay", json={}, headers=_key()),
    ):
        assert response.status_code == 403, response.text
        assert response.json()["code"] == "forbidden-role"

    other = setup_tenant(api.url, api.admin, "globex")
    for client in (other.operator, other.worker):
        for response in (
            client.get("/v1/tenants/acme/dead-letters"),
            client.get(base),
            client.post(f"{base}/replay", json={}, headers=_key()),
            client.post(f"{base}/discard", json={}, headers=_key()),
        ):
            assert response.status_code == 404, response.text
    # Nor does globex's operator see acme's dead letter under its own tenant.
    mine = other.operator.get(f"/v1/tenants/globex/dead-letters/{dead_letter_id}")
    assert mine.status_code == 404
    assert dead_letters(other.operator, tenant="globex")["dead_letters"] == []
    # The admin may act on any tenant.
    assert api.admin.get(base).status_code == 200


def test_a_tenants_ledger_verification_checks_its_own_items_only(api: Api, db: DB) -> None:
    other = setup_tenant(api.url, api.admin, "globex")
    api.enqueue("q", 1)
    theirs = other.enqueue("q", 2)["item_id"]
    db.execute("UPDATE work_items SET fence = 9 WHERE item_id = %s", (theirs,))
    verified = api.operator.get("/v1/tenants/acme/ledger-verification").json()
    assert (verified["checked"], verified["mismatches"]) == (1, [])
    found = other.operator.get("/v1/tenants/globex/ledger-verification").json()
    assert found["checked"] == 1
    assert [m["item_id"] for m in found["mismatches"]] == [theirs]


def test_status_counts_queues_and_ledger_verification_finds_tampering(api: Api, db: DB) -> None:
    quarantine(api, "a")
    api.enqueue("a", 1)
    api.enqueue("b", 2)
    status = api.operator.get("/v1/tenants/acme/queues").json()
    assert status["backlog"] == 2
    assert status["backlog_cap"] == 1000
    assert status["open_dead_letters"] == 1
    by_queue = {q["queue"]: q for q in status["queues"]}
    assert (by_queue["a"]["ready"], by_queue["a"]["quarantined"]) == (1, 1)
    assert by_queue["b"]["ready"] == 1
    assert by_queue["b"]["concurrency_limit"] == 1
    assert by_queue["a"]["oldest_ready_age"] >= 0

    clean = api.operator.get("/v1/tenants/acme/ledger-verification").json()
    assert (clean["checked"], clean["mismatches"]) == (3, [])
    item_id = api.enqueue("c", 3)["item_id"]
    db.execute("UPDATE work_items SET fence = 9 WHERE item_id = %s", (item_id,))
    paged: list[dict[str, Any]] = []
    cursor = None
    checked = 0
    while True:
        params: dict[str, Any] = {"limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = api.admin.get("/v1/ledger-verification", params=params).json()
        paged += page["mismatches"]
        checked += page["checked"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert checked == 4
    assert [m["item_id"] for m in paged] == [item_id]
    assert "fence" in paged[0]["problems"][0]
    assert api.operator.get("/v1/ledger-verification").status_code == 403

    who = api.worker.get("/v1/whoami").json()
    assert (who["tenant"], who["role"]) == ("acme", "worker")


def test_ledger_verification_names_a_missing_event_a_changed_state_and_a_miscounted_ledger(
    api: Api, db: DB
) -> None:
    done = api.enqueue("q", "done")["item_id"]
    complete_leases(api, api.acquire("q"))
    changed = api.enqueue("q", "changed")["item_id"]
    miscounted = api.enqueue("q", "miscounted")["item_id"]
    assert ledger_mismatches(api) == []
    # The completed item's `acquired` event is lost; a ready item is said to be cancelled;
    # another row counts one event more than its ledger holds.
    db.execute("DELETE FROM item_events WHERE item_id = %s AND kind = 'acquired'", (done,))
    db.execute("UPDATE work_items SET state = 'cancelled' WHERE item_id = %s", (changed,))
    db.execute("UPDATE work_items SET event_seq = event_seq + 1 WHERE item_id = %s", (miscounted,))
    found = {m["item_id"]: m["problems"] for m in ledger_mismatches(api)}
    assert set(found) == {done, changed, miscounted}
    assert found[done] == ["ledger gap: expected seq 1, found 2"]
    assert found[changed] == ["state: row has 'cancelled', ledger folds to 'ready'"]
    assert found[miscounted] == ["event_seq: row has 2, ledger has 1 events"]


def test_a_deleted_tenant_takes_its_dead_letters_ledgers_and_receipts_and_no_other_tenants(
    api: Api, db: DB
) -> None:
    quarantine(api)
    other = setup_tenant(api.url, api.admin, "globex")
    quarantine(other)
    counts = (
        "SELECT (SELECT count(*) FROM dead_letters WHERE tenant_id = %(t)s) AS letters,"
        " (SELECT count(*) FROM item_events WHERE tenant_id = %(t)s) > 0 AS events,"
        " (SELECT count(*) FROM idempotency_receipts WHERE tenant_id = %(t)s) > 0 AS receipts"
    )
    assert db.execute(counts, {"t": "acme"}).fetchone() == {
        "letters": 1,
        "events": True,
        "receipts": True,
    }
    assert api.admin.delete("/v1/tenants/acme").status_code == 204
    assert db.execute(counts, {"t": "acme"}).fetchone() == {
        "letters": 0,
        "events": False,
        "receipts": False,
    }
    # globex keeps its own; an acme made again starts with no dead letter of the old one.
    assert len(dead_letters(other.operator, tenant="globex")["dead_letters"]) == 1
    again = setup_tenant(api.url, api.admin, "acme")
    assert dead_letters(again.operator)["dead_letters"] == []
