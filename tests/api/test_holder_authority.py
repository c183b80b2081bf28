"""The single holder routes (heartbeat, complete, requeue) refuse every presentation but the live
holder's with its fence, each with its own problem code, and a refusal changes nothing; a
requeue replayed under its accepted key answers the original 200 after a successor."""

from __future__ import annotations

import uuid

import psycopg

from tests.helpers.api import Api
from tests.helpers.authority import WORKER, presentations, stored

Db = psycopg.Connection[dict[str, object]]


def test_heartbeat_complete_and_requeue_without_the_live_holders_authority_change_nothing(
    api: Api, db: Db
) -> None:
    for action, state in (("heartbeat", "leased"), ("complete", "completed"), ("requeue", "ready")):
        cases = presentations(api, db, action)
        before = stored(db, [p.item_id for p in cases.values()])
        for p in cases.values():
            if not p.code:
                continue
            refused = api.holder(action, p.item_id, worker=WORKER, fence=p.fence)
            assert (refused.status_code, refused.json()["code"]) == (409, p.code), (action, p)
            assert stored(db, [p.item_id]) == {p.item_id: before[p.item_id]}, (action, p)
        accepted = cases["accepted"]
        done = api.holder(action, accepted.item_id, worker=WORKER, fence=accepted.fence)
        assert done.status_code == 200, done.text
        row = stored(db, [accepted.item_id])[accepted.item_id]
        assert row["state"] == state
        assert len(row["events"]) == len(before[accepted.item_id]["events"]) + 1


def test_a_requeue_replayed_under_its_accepted_key_after_a_successor_answers_the_original_200(
    api: Api,
) -> None:
    api.enqueue()
    (first,) = api.acquire(worker=WORKER)
    original = api.holder("requeue", first["item_id"], key="r", worker=WORKER, fence=first["fence"])
    assert original.status_code == 200, original.text
    (successor,) = api.acquire(worker="w2")
    again = api.holder("requeue", first["item_id"], key="r", worker=WORKER, fence=first["fence"])
    assert (again.status_code, again.content) == (200, original.content)
    assert again.headers["Idempotent-Replayed"] == "true"
    row = api.worker.get(f"/v1/tenants/acme/items/{first['item_id']}").json()
    assert (row["state"], row["lease_holder"], row["fence"]) == ("leased", "w2", successor["fence"])


def test_an_operator_key_may_not_complete_or_requeue_a_lease_and_changes_nothing(
    api: Api, db: Db
) -> None:
    api.enqueue()
    (lease,) = api.acquire(worker=WORKER)
    item_id = str(lease["item_id"])
    before = stored(db, [item_id])
    for action in ("complete", "requeue", "heartbeat"):
        refused = api.operator.post(
            f"/v1/tenants/acme/items/{item_id}/{action}",
            json={"worker": WORKER, "fence": lease["fence"]},
            headers={"Idempotency-Key": uuid.uuid4().hex},
        )
        assert (refused.status_code, refused.json()["code"]) == (403, "forbidden-role"), action
    assert stored(db, [item_id]) == before
