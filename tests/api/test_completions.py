"""Batch completion: one receipt per batch, one guard per item."""

from __future__ import annotations

import uuid

import psycopg

from tests.helpers.api import Api
from tests.helpers.items import expire

Db = psycopg.Connection[dict[str, object]]


def test_batch_completion_completes_each_item_under_its_own_fence(api: Api, db: Db) -> None:
    api.approve("q", 50)
    api.worker.post(
        "/v1/tenants/acme/queues/q/items:batch",
        json={"items": [{"payload": i} for i in range(5)]},
        headers={"Idempotency-Key": "five"},
    )
    leases = api.acquire(max_items=5)
    assert len(leases) == 5
    expire(db, leases[3]["item_id"])
    unknown = str(uuid.uuid4())
    entries = [
        {"item_id": lease["item_id"], "fence": lease["fence"], "result": n}
        for n, lease in enumerate(leases)
    ]
    entries[1]["fence"] = 0  # stale
    entries.append({"item_id": unknown, "fence": 1, "result": None})
    entries.append({"item_id": "not-an-id", "fence": 1, "result": None})
    response = api.worker.post(
        "/v1/tenants/acme/completions",
        json={"worker": "w1", "completions": entries},
        headers={"Idempotency-Key": "batch-1"},
    )
    assert response.status_code == 200
    body = response.json()
    assert body["completed"] == 3
    statuses = [(r["status"], (r.get("problem") or {}).get("code")) for r in body["results"]]
    assert statuses == [
        (200, None),
        (409, "stale-fence"),
        (200, None),
        (409, "lease-expired"),
        (200, None),
        (404, "item-not-found"),
        (404, "item-not-found"),
    ]
    assert body["results"][0]["item"]["state"] == "completed"
    assert body["results"][2]["item"]["result"] == 2
    completed = db.execute(
        "SELECT count(*) AS n FROM item_events WHERE kind = 'completed'"
    ).fetchone()
    assert completed == {"n": 3}
    replay = api.worker.post(
        "/v1/tenants/acme/completions",
        json={"worker": "w1", "completions": entries},
        headers={"Idempotency-Key": "batch-1"},
    )
    assert replay.content == response.content
    assert replay.headers["Idempotent-Replayed"] == "true"


def test_batch_completion_refuses_duplicate_items(api: Api) -> None:
    item_id = str(uuid.uuid4())
    response = api.worker.post(
        "/v1/tenants/acme/completions",
        json={
            "worker": "w1",
            "completions": [{"item_id": item_id, "fence": 1}, {"item_id": item_id, "fence": 2}],
        },
        headers={"Idempotency-Key": "dup"},
    )
    assert response.status_code == 422
    assert response.json()["code"] == "invalid-request"
