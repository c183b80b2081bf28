"""The batch holder routes (`completions`, `leases:heartbeat`) hold each entry to the guard a
single holder operation has: the holder's name, its fence (neither stale nor ahead), an
unexpired lease before its deadline, a leased item of the caller's tenant. A refused entry
answers its own problem and leaves its item as it was; the other entries go on."""

from __future__ import annotations

import uuid
from datetime import datetime

import psycopg

from tests.helpers.api import Api
from tests.helpers.authority import (
    WORKER,
    Presented,
    codes,
    foreign_lease,
    presentations,
    stored,
)

Db = psycopg.Connection[dict[str, object]]
COMPLETIONS = "/v1/tenants/acme/completions"
HEARTBEATS = "/v1/tenants/acme/leases:heartbeat"


def _expected(cases: dict[str, Presented]) -> list[tuple[int, str]]:
    return [(409, p.code) if p.code else (200, "") for p in cases.values()]


def test_batch_complete_completes_only_the_live_holders_entry_and_leaves_the_refused_unchanged(
    api: Api, db: Db
) -> None:
    cases = presentations(api, db, "c")
    _, foreign, foreign_fence = foreign_lease(api, db=db)
    ids = [p.item_id for p in cases.values()] + [foreign]
    before = stored(db, ids)
    entries = [{**p.entry, "result": p.case} for p in cases.values()]
    entries.append({"item_id": foreign, "fence": foreign_fence, "result": "not ours"})
    response = api.worker.post(
        COMPLETIONS,
        json={"worker": WORKER, "completions": entries},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert codes(body["results"]) == [*_expected(cases), (404, "item-not-found")]
    assert body["completed"] == 1
    after = stored(db, ids)
    for item_id in ids:
        if item_id != cases["accepted"].item_id:
            assert after[item_id] == before[item_id], item_id
    accepted = cases["accepted"]
    done = after[accepted.item_id]
    assert (done["state"], done["result"], done["lease_holder"]) == ("completed", "accepted", None)
    assert done["events"][:-1] == before[accepted.item_id]["events"]
    last = done["events"][-1]
    assert (last["kind"], last["fence"], last["actor"]) == ("completed", accepted.fence, WORKER)


def test_batch_heartbeat_extends_only_the_live_holders_lease_and_leaves_the_refused_unchanged(
    api: Api, db: Db
) -> None:
    cases = presentations(api, db, "h")
    _, foreign, foreign_fence = foreign_lease(api, db=db)
    ids = [p.item_id for p in cases.values()] + [foreign]
    before = stored(db, ids)
    entries = [p.entry for p in cases.values()]
    entries.append({"item_id": foreign, "fence": foreign_fence})
    response = api.worker.post(
        HEARTBEATS, json={"worker": WORKER, "lease_ttl": 30, "leases": entries}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert codes(body["results"]) == [*_expected(cases), (404, "item-not-found")]
    assert body["extended"] == 1
    after = stored(db, ids)
    for item_id in ids:
        if item_id != cases["accepted"].item_id:
            assert after[item_id] == before[item_id], item_id
    accepted = cases["accepted"]
    was, now = before[accepted.item_id], after[accepted.item_id]
    assert (now["state"], now["lease_holder"], now["fence"]) == ("leased", WORKER, accepted.fence)
    assert now["lease_expires_at"] > was["lease_expires_at"]
    assert now["lease_deadline_at"] == was["lease_deadline_at"]
    assert [e["kind"] for e in now["events"]] == [*(e["kind"] for e in was["events"]), "heartbeat"]


def test_heartbeats_single_and_batch_never_extend_a_lease_past_its_deadline(
    api: Api, db: Db
) -> None:
    leases = []
    for queue in ("one", "many"):
        api.enqueue(queue)
        (lease,) = api.acquire(queue, worker=WORKER, ttl=1)
        leases.append(lease)
    # Both leases reach their deadline two seconds from now.
    db.execute(
        "UPDATE work_items SET lease_deadline_at = now() + interval '2 seconds'"
        " WHERE item_id = ANY(%s::uuid[])",
        ([str(lease["item_id"]) for lease in leases],),
    )
    single = api.worker.post(
        f"/v1/tenants/acme/items/{leases[0]['item_id']}/heartbeat",
        json={"worker": WORKER, "fence": leases[0]["fence"], "lease_ttl": 30},
    )
    assert single.status_code == 200, single.text
    batch = api.worker.post(
        HEARTBEATS,
        json={
            "worker": WORKER,
            "lease_ttl": 30,
            "leases": [{"item_id": leases[1]["item_id"], "fence": leases[1]["fence"]}],
        },
    )
    assert batch.status_code == 200, batch.text
    (result,) = batch.json()["results"]
    for answer in (single.json(), result):
        expires = datetime.fromisoformat(answer["lease_expires_at"])
        assert expires == datetime.fromisoformat(answer["lease_deadline_at"]), answer
    rows = db.execute(
        "SELECT lease_expires_at = lease_deadline_at AS at_deadline FROM work_items"
        " WHERE item_id = ANY(%s::uuid[])",
        ([str(lease["item_id"]) for lease in leases],),
    ).fetchall()
    assert rows == [{"at_deadline": True}] * 2


def test_the_batch_routes_refuse_an_operator_key_and_another_tenants_key_and_change_nothing(
    api: Api, db: Db
) -> None:
    other, _, _ = foreign_lease(api)
    api.enqueue()
    (lease,) = api.acquire(worker=WORKER)
    entry = {"item_id": lease["item_id"], "fence": lease["fence"]}
    before = stored(db, [str(lease["item_id"])])
    for client, status, code in (
        (api.operator, 403, "forbidden-role"),
        (other.worker, 404, "tenant-not-found"),
        (other.operator, 404, "tenant-not-found"),
    ):
        done = client.post(
            COMPLETIONS,
            json={"worker": WORKER, "completions": [entry]},
            headers={"Idempotency-Key": uuid.uuid4().hex},
        )
        assert (done.status_code, done.json()["code"]) == (status, code)
        beat = client.post(HEARTBEATS, json={"worker": WORKER, "leases": [entry]})
        assert (beat.status_code, beat.json()["code"]) == (status, code)
    assert stored(db, [str(lease["item_id"])]) == before
    # Another tenant's worker, on its own tenant's path, finds no such item.
    theirs = other.worker.post(
        "/v1/tenants/globex/completions",
        json={"worker": WORKER, "completions": [entry]},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    ).json()
    assert codes(theirs["results"]) == [(404, "item-not-found")]
    assert stored(db, [str(lease["item_id"])]) == before
