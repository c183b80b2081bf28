"""Batch heartbeats: one request extends many leases, each under its own fence."""

from __future__ import annotations

import uuid

import psycopg

from queue_server.services.ledgers import mismatches
from tests.helpers.api import Api
from tests.helpers.items import expire

Db = psycopg.Connection[dict[str, object]]
ROUTE = "/v1/tenants/acme/leases:heartbeat"


def test_batch_heartbeat_extends_each_lease_under_its_own_fence(api: Api, db: Db) -> None:
    api.approve("q", 50)
    for n in range(4):
        api.enqueue(payload=n)
    leases = api.acquire(max_items=4, ttl=5)
    expire(db, leases[2]["item_id"])
    entries = [{"item_id": lease["item_id"], "fence": lease["fence"]} for lease in leases]
    entries[1]["fence"] = 0  # stale
    entries.append({"item_id": str(uuid.uuid4()), "fence": 1})
    entries.append({"item_id": "not-an-id", "fence": 1})
    before = {
        str(r["item_id"]): r["lease_expires_at"]
        for r in db.execute("SELECT item_id, lease_expires_at FROM work_items").fetchall()
    }
    response = api.worker.post(ROUTE, json={"worker": "w1", "lease_ttl": 30, "leases": entries})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["extended"] == 2
    codes = [(r["status"], (r.get("problem") or {}).get("code")) for r in body["results"]]
    assert codes == [
        (200, None),
        (409, "stale-fence"),
        (409, "lease-expired"),
        (200, None),
        (404, "item-not-found"),
        (404, "item-not-found"),
    ]
    after = {
        str(r["item_id"]): r["lease_expires_at"]
        for r in db.execute("SELECT item_id, lease_expires_at FROM work_items").fetchall()
    }
    for n in (0, 3):
        item_id = str(leases[n]["item_id"])
        assert after[item_id] > before[item_id]  # type: ignore[operator]
    assert after[str(leases[1]["item_id"])] == before[str(leases[1]["item_id"])]
    beats = db.execute("SELECT count(*) AS n FROM item_events WHERE kind = 'heartbeat'").fetchone()
    assert beats == {"n": 2}
    # Each extended lease's ledger folds to its row, the new expiry included.
    for n in (0, 3):
        item_id = str(leases[n]["item_id"])
        row = db.execute("SELECT * FROM work_items WHERE item_id = %s", (item_id,)).fetchone()
        assert row is not None
        events = db.execute(
            "SELECT seq, kind, fence, actor, data FROM item_events WHERE item_id = %s ORDER BY seq",
            (item_id,),
        ).fetchall()
        assert mismatches(row, events) == []


def test_batch_heartbeat_refuses_another_workers_leases_and_duplicates(api: Api) -> None:
    api.enqueue()
    (lease,) = api.acquire(worker="w1")
    entry = {"item_id": lease["item_id"], "fence": lease["fence"]}
    other = api.worker.post(ROUTE, json={"worker": "w2", "leases": [entry]})
    assert other.status_code == 200
    assert other.json()["results"][0]["problem"]["code"] == "not-lease-holder"
    twice = api.worker.post(ROUTE, json={"worker": "w1", "leases": [entry, entry]})
    assert twice.status_code == 422
    empty = api.worker.post(ROUTE, json={"worker": "w1", "leases": []})
    assert empty.status_code == 422
    operator = api.operator.post(ROUTE, json={"worker": "w1", "leases": [entry]})
    assert operator.status_code == 403
