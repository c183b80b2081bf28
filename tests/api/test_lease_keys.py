"""A lease belongs to the key that took it: a second worker key of the tenant presenting the
holder's own name and fence is refused 409 `not-lease-holder` on every holder route, single
and batch, and changes nothing; the key that took the lease still acts on it."""

from __future__ import annotations

import uuid

import httpx
import psycopg

from tests.helpers.api import Api, client_for
from tests.helpers.authority import stored

Db = psycopg.Connection[dict[str, object]]


def _second_worker(api: Api) -> httpx.Client:
    created = api.admin.post("/v1/tenants/acme/keys", json={"role": "worker"})
    assert created.status_code == 201, created.text
    return client_for(api.url, created.json()["secret"])


def _post(client: httpx.Client, path: str, body: object) -> httpx.Response:
    return client.post(
        f"/v1/tenants/acme{path}", json=body, headers={"Idempotency-Key": uuid.uuid4().hex}
    )


def test_another_worker_key_with_the_holders_name_and_fence_is_not_the_holder(
    api: Api, db: Db
) -> None:
    other = _second_worker(api)
    api.enqueue()
    (lease,) = api.acquire(worker="w1")
    item_id, fence = str(lease["item_id"]), lease["fence"]
    before = stored(db, [item_id])
    holder = {"worker": "w1", "fence": fence}
    refused = [
        _post(other, f"/items/{item_id}/heartbeat", holder),
        _post(other, f"/items/{item_id}/complete", holder),
        _post(other, f"/items/{item_id}/requeue", holder),
        _post(
            other,
            f"/items/{item_id}/triage",
            {**holder, "decision": "quarantine", "failure": {"class": "X", "message": "m"}},
        ),
    ]
    for answer in refused:
        assert (answer.status_code, answer.json()["code"]) == (409, "not-lease-holder"), answer.text
    batch = _post(
        other,
        "/completions",
        {"worker": "w1", "completions": [{"item_id": item_id, "fence": fence}]},
    )
    assert batch.status_code == 200, batch.text
    (entry,) = batch.json()["results"]
    assert (entry["status"], entry["problem"]["code"]) == (409, "not-lease-holder")
    beats = _post(
        other,
        "/leases:heartbeat",
        {"worker": "w1", "leases": [{"item_id": item_id, "fence": fence}]},
    )
    assert beats.status_code == 200, beats.text
    (entry,) = beats.json()["results"]
    assert (entry["status"], entry["problem"]["code"]) == (409, "not-lease-holder")
    after = stored(db, [item_id])[item_id]
    # Nothing changed but the triage's own ledger row of the refused report.
    assert {k: v for k, v in after.items() if k != "events"} == {
        k: v for k, v in before[item_id].items() if k != "events"
    }
    kinds = [e["kind"] for e in after["events"][len(before[item_id]["events"]) :]]
    assert kinds == ["triage_rejected"]
    # The key that took the lease completes it.
    done = api.holder("complete", item_id, worker="w1", fence=fence)
    assert done.status_code == 200, done.text


def test_the_acquiring_key_is_kept_with_the_lease_and_replaced_by_the_next(
    api: Api, db: Db
) -> None:
    other = _second_worker(api)
    api.enqueue()
    (lease,) = api.acquire(worker="w1", ttl=1)
    key_id = api.keys["worker"].split("_")[1]
    row = db.execute("SELECT lease_key_id FROM work_items").fetchone()
    assert row == {"lease_key_id": key_id}
    db.execute("UPDATE work_items SET lease_expires_at = now() - interval '1 s'")
    taken = other.post("/v1/tenants/acme/queues/q/leases", json={"worker": "w1"})
    assert taken.status_code == 200, taken.text
    (successor,) = taken.json()["leases"]
    # The first key, with the same name and the new fence, is no longer the holder.
    stale = api.holder("complete", lease["item_id"], worker="w1", fence=successor["fence"])
    assert (stale.status_code, stale.json()["code"]) == (409, "not-lease-holder")
    done = _post(
        other, f"/items/{lease['item_id']}/complete", {"worker": "w1", "fence": successor["fence"]}
    )
    assert done.status_code == 200, done.text


def test_a_worker_key_sees_only_its_own_leases_in_the_status(api: Api) -> None:
    other = _second_worker(api)
    api.approve("q", 2)  # two leases of the queue at once
    api.enqueue()
    api.enqueue()
    (mine,) = api.acquire(worker="w1")
    taken = other.post("/v1/tenants/acme/queues/q/leases", json={"worker": "w2"})
    (theirs,) = taken.json()["leases"]
    seen = {
        lease["item_id"] for lease in api.worker.get("/v1/tenants/acme/queues").json()["leases"]
    }
    assert seen == {mine["item_id"]}
    seen = {lease["item_id"] for lease in other.get("/v1/tenants/acme/queues").json()["leases"]}
    assert seen == {theirs["item_id"]}
    everyone = api.operator.get("/v1/tenants/acme/queues").json()["leases"]
    assert {lease["worker"] for lease in everyone} == {"w1", "w2"}
