"""Triage is a holder operation: only the holder's name, with the fence it was given, on an
unexpired lease of the caller's tenant, requeues or quarantines the item. Every refused
triage still records the reported failure (`triage_rejected`, by its actor) and changes
nothing else; a replay under an accepted key answers the original 200 whoever holds the
item now."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

from tests.helpers.api import Api
from tests.helpers.authority import (
    FAILURE,
    WORKER,
    foreign_lease,
    presentations,
    stored,
)
from tests.helpers.items import dead_letter_of, expire, replay

Db = psycopg.Connection[dict[str, object]]


def _triage(
    api: Api, item_id: object, fence: object, decision: str, key: str | None = None, **more: Any
) -> Any:
    return api.holder(
        "triage",
        item_id,
        key=key,
        worker=more.pop("worker", WORKER),
        fence=fence,
        failure=FAILURE,
        decision=decision,
        **more,
    )


def _refused_triage_changes_nothing_but_its_ledger_row(api: Api, db: Db, decision: str) -> None:
    cases = presentations(api, db, decision)
    before = stored(db, [p.item_id for p in cases.values()])
    for p in cases.values():
        if not p.code:
            continue
        refused = _triage(api, p.item_id, p.fence, decision)
        assert (refused.status_code, refused.json()["code"]) == (409, p.code), p.case
        was, now = before[p.item_id], stored(db, [p.item_id])[p.item_id]
        assert {k: v for k, v in now.items() if k != "events"} == {
            k: v for k, v in was.items() if k != "events"
        }, p.case
        assert now["events"][:-1] == was["events"], p.case
        last = now["events"][-1]
        assert (last["kind"], last["actor"]) == ("triage_rejected", WORKER), p.case
        assert last["data"] == {
            "failure": FAILURE,
            "presented_fence": p.fence,
            "worker": WORKER,
            "reason": p.code,
        }, p.case
    accepted = cases["accepted"]
    done = _triage(api, accepted.item_id, accepted.fence, decision)
    assert done.status_code == 200, done.text
    expected = "ready" if decision == "requeue" else "quarantined"
    assert (done.json()["state"], done.json()["last_failure"]) == (expected, FAILURE)
    (event,) = stored(db, [accepted.item_id])[accepted.item_id]["events"][-1:]
    assert (event["kind"], event["fence"], event["actor"]) == ("triaged", accepted.fence, WORKER)


def test_triage_requeue_without_the_live_holders_authority_is_refused_and_changes_nothing(
    api: Api, db: Db
) -> None:
    _refused_triage_changes_nothing_but_its_ledger_row(api, db, "requeue")


def test_triage_quarantine_without_the_live_holders_authority_is_refused_and_changes_nothing(
    api: Api, db: Db
) -> None:
    _refused_triage_changes_nothing_but_its_ledger_row(api, db, "quarantine")
    # No refused triage opened a dead letter: only the accepted one did.
    letters = db.execute("SELECT count(*) AS n FROM dead_letters").fetchone()
    assert letters == {"n": 1}


def test_a_triage_replayed_under_its_accepted_key_after_a_successor_answers_the_original_200(
    api: Api, db: Db
) -> None:
    api.enqueue("again")
    (first,) = api.acquire("again", worker=WORKER)
    original = _triage(api, first["item_id"], first["fence"], "requeue", key="t-requeue")
    assert original.status_code == 200, original.text
    (successor,) = api.acquire("again", worker="w2")
    assert successor["fence"] == int(str(first["fence"])) + 1
    # Quarantined, replayed from its dead letter by an operator, then leased by another worker.
    api.enqueue("poison")
    (doomed,) = api.acquire("poison", worker=WORKER)
    quarantined = _triage(api, doomed["item_id"], doomed["fence"], "quarantine", key="t-q")
    assert quarantined.status_code == 200, quarantined.text
    back = replay(api, dead_letter_of(api, str(doomed["item_id"])))
    assert back.status_code == 200, back.text
    (taken,) = api.acquire("poison", worker="w2")
    ids = [str(first["item_id"]), str(doomed["item_id"])]
    before = stored(db, ids)
    for lease, key, decision, answer in (
        (first, "t-requeue", "requeue", original),
        (doomed, "t-q", "quarantine", quarantined),
    ):
        again = _triage(api, lease["item_id"], lease["fence"], decision, key=key)
        assert again.status_code == 200, again.text
        assert again.headers["Idempotent-Replayed"] == "true"
        assert again.content == answer.content
    # The replays changed nothing: the successors hold their leases, nothing was ledgered.
    assert stored(db, ids) == before
    for lease in (successor, taken):
        row = before[str(lease["item_id"])]
        assert (row["state"], row["lease_holder"], row["fence"]) == ("leased", "w2", lease["fence"])


def test_a_refused_triage_replayed_under_its_key_answers_the_same_409_and_ledgers_once(
    api: Api, db: Db
) -> None:
    api.enqueue()
    (lease,) = api.acquire(worker=WORKER)
    expire(db, lease["item_id"])
    refused = _triage(api, lease["item_id"], lease["fence"], "requeue", key="late")
    assert (refused.status_code, refused.json()["code"]) == (409, "lease-expired")
    again = _triage(api, lease["item_id"], lease["fence"], "requeue", key="late")
    assert again.content == refused.content
    assert again.headers["Idempotent-Replayed"] == "true"
    kinds = [
        e["kind"] for e in stored(db, [str(lease["item_id"])])[str(lease["item_id"])]["events"]
    ]
    assert kinds == ["enqueued", "acquired", "triage_rejected"]


def test_triage_of_an_unleased_item_by_any_key_of_the_tenant_is_refused_and_ledgered_by_its_actor(
    api: Api, db: Db
) -> None:
    item_id = str(api.enqueue()["item_id"])
    operator_key = api.operator.get("/v1/whoami").json()["key_id"]
    for client, actor in ((api.worker, "w9"), (api.operator, f"key:{operator_key}")):
        refused = client.post(
            f"/v1/tenants/acme/items/{item_id}/triage",
            json={"worker": "w9", "fence": 0, "failure": FAILURE, "decision": "requeue"},
            headers={"Idempotency-Key": uuid.uuid4().hex},
        )
        assert (refused.status_code, refused.json()["code"]) == (409, "item-not-leased")
        last = stored(db, [item_id])[item_id]["events"][-1]
        assert (last["kind"], last["actor"]) == ("triage_rejected", actor)
        assert last["data"]["failure"] == FAILURE
        assert last["data"]["worker"] == "w9"
    row = stored(db, [item_id])[item_id]
    assert (row["state"], row["last_failure"]) == ("ready", None)
    assert [e["kind"] for e in row["events"]] == ["enqueued", "triage_rejected", "triage_rejected"]


def test_an_operator_key_holds_no_lease_its_triage_of_a_leased_item_is_refused_and_ledgered(
    api: Api, db: Db
) -> None:
    api.enqueue()
    (lease,) = api.acquire(worker=WORKER)
    item_id = str(lease["item_id"])
    before = stored(db, [item_id])[item_id]
    # The holder's own name and fence (or any other fence), presented by an operator's key.
    fence = int(str(lease["fence"]))
    for decision, presented in (("requeue", fence), ("quarantine", fence), ("requeue", fence + 1)):
        refused = api.operator.post(
            f"/v1/tenants/acme/items/{item_id}/triage",
            json={
                "worker": WORKER,
                "fence": presented,
                "failure": FAILURE,
                "decision": decision,
            },
            headers={"Idempotency-Key": uuid.uuid4().hex},
        )
        assert (refused.status_code, refused.json()["code"]) == (409, "not-lease-holder")
    now = stored(db, [item_id])[item_id]
    assert {k: v for k, v in now.items() if k != "events"} == {
        k: v for k, v in before.items() if k != "events"
    }
    assert [e["kind"] for e in now["events"][len(before["events"]) :]] == ["triage_rejected"] * 3
    assert all(e["actor"].startswith("key:") for e in now["events"][len(before["events"]) :])
    done = _triage(api, item_id, lease["fence"], "requeue")
    assert (done.status_code, done.json()["state"]) == (200, "ready")


def test_another_tenants_key_cannot_triage_an_item_nor_ledger_a_failure_on_it(
    api: Api, db: Db
) -> None:
    other, theirs, their_fence = foreign_lease(api)
    before = stored(db, [theirs])
    for client in (api.worker, api.operator, other.worker):
        for decision in ("requeue", "quarantine"):
            refused = client.post(
                f"/v1/tenants/acme/items/{theirs}/triage",
                json={
                    "worker": WORKER,
                    "fence": their_fence,
                    "failure": FAILURE,
                    "decision": decision,
                },
                headers={"Idempotency-Key": uuid.uuid4().hex},
            )
            expected = "tenant-not-found" if client is other.worker else "item-not-found"
            assert (refused.status_code, refused.json()["code"]) == (404, expected), decision
    assert stored(db, [theirs]) == before
