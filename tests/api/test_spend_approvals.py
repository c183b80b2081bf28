"""Spend approvals: made by a key, bounded by the policy and a year, revocable; what they
change is shown with real acquires: the largest live approval sets the limit, only while it
is live (not revoked, not past its expiry by the database clock), at most max-approved."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import psycopg

from queue_server.settings import Settings
from tests.helpers.api import Api, live_api, policy_file

Db = psycopg.Connection[dict[str, object]]
PATH = "/v1/tenants/acme/queues/q/spend-approvals"


def post(api: Api, client: httpx.Client | None = None, **fields: object) -> httpx.Response:
    body: dict[str, object] = {
        "max_concurrency": 3,
        "expires_at": (datetime.now(UTC) + timedelta(days=7)).isoformat(),
        "reason": "launch week",
        **fields,
    }
    return (client or api.operator).post(
        PATH, json=body, headers={"Idempotency-Key": uuid.uuid4().hex}
    )


def revoke(
    api: Api, approval_id: object, key: str | None = None, client: httpx.Client | None = None
) -> httpx.Response:
    return (client or api.operator).delete(
        f"{PATH}/{approval_id}", headers={"Idempotency-Key": key or uuid.uuid4().hex}
    )


def key_id(client: httpx.Client) -> str:
    who: dict[str, str] = client.get("/v1/whoami").json()
    return who["key_id"]


def lease_one_at_a_time(api: Api) -> None:
    """With no live approval: one lease, then none until it is finished."""
    (lease,) = api.acquire(max_items=5, worker="w1")
    assert api.acquire(max_items=5, worker="w2") == []
    done = api.holder("complete", lease["item_id"], worker="w1", fence=lease["fence"])
    assert done.status_code == 200, done.text
    assert len(api.acquire(max_items=5, worker="w2")) == 1


def finish(api: Api, leases: list[dict[str, object]], worker: str = "w1") -> None:
    for lease in leases:
        done = api.holder("complete", lease["item_id"], worker=worker, fence=lease["fence"])
        assert done.status_code == 200, done.text


def test_an_approval_records_the_operator_key_and_gives_three_leases_at_once(api: Api) -> None:
    for n in range(6):
        api.enqueue(payload=n)
    made = post(api)
    assert made.status_code == 201, made.text
    approval = made.json()
    operator = key_id(api.operator)
    assert approval["approved_by"] == operator
    assert approval["approved_by_key"] == operator
    assert approval["approved_by_role"] == "operator"
    assert (approval["live"], approval["revoked_at"], approval["revoked_by"]) == (True, None, None)
    # Three separate acquires get one each; the fourth gets none.
    got = [api.acquire(worker=f"w{n}", max_items=1) for n in range(4)]
    assert [len(g) for g in got] == [1, 1, 1, 0]
    info = api.operator.get("/v1/tenants/acme/queues/q/concurrency").json()
    assert (info["limit"], info["active_leases"]) == (3, 3)
    assert info["approval"]["approved_by_key_id"] == operator


def test_an_admin_key_approves_under_its_own_id_and_role(api: Api) -> None:
    made = post(api, api.admin)
    assert made.status_code == 201, made.text
    assert made.json()["approved_by"] == key_id(api.admin)
    assert made.json()["approved_by_role"] == "admin"


def test_approved_by_naming_someone_else_is_refused_and_the_callers_own_id_is_accepted(
    api: Api,
) -> None:
    refused = post(api, approved_by="ops@example.com")
    assert refused.status_code == 422, refused.text
    assert refused.json()["code"] == "invalid-request"
    assert [e["loc"] for e in refused.json()["errors"]] == [["body", "approved_by"]]
    assert api.operator.get(PATH).json()["approvals"] == []
    own = post(api, approved_by=key_id(api.operator))
    assert own.status_code == 201, own.text


def test_max_concurrency_above_the_policys_max_approved_is_refused_naming_the_cell(
    api: Api,
) -> None:
    refused = post(api, max_concurrency=1001)
    assert refused.status_code == 422, refused.text
    (error,) = refused.json()["errors"]
    assert error["loc"] == ["body", "max_concurrency"]
    assert (error["cell"], error["limit"]) == ("durable-leased-work/concurrency", 1000)
    assert "durable-leased-work/concurrency" in refused.json()["detail"]
    assert post(api, max_concurrency=1000).status_code == 201


def test_an_approval_lasts_at_most_a_year_and_not_into_the_past(api: Api) -> None:
    now = datetime.now(UTC)
    for when in (now + timedelta(days=366), now - timedelta(minutes=1)):
        refused = post(api, expires_at=when.isoformat())
        assert refused.status_code == 422, (when, refused.text)
        assert [e["loc"] for e in refused.json()["errors"]] == [["body", "expires_at"]]
    assert api.operator.get(PATH).json()["approvals"] == []
    year = post(api, expires_at=(now + timedelta(days=364)).isoformat())
    assert year.status_code == 201, year.text


def test_after_revoke_the_queue_leases_one_at_a_time_again(api: Api) -> None:
    for n in range(6):
        api.enqueue(payload=n)
    approval = post(api).json()
    leases = api.acquire(max_items=5)
    assert len(leases) == 3
    revoked = revoke(api, approval["approval_id"])
    assert revoked.status_code == 200, revoked.text
    body = revoked.json()
    assert body["revoked_by"] == key_id(api.operator)
    assert body["revoked_at"] is not None
    assert body["live"] is False
    # Three leases are still held: nothing more while they live.
    assert api.acquire(max_items=5, worker="w2") == []
    finish(api, leases)
    lease_one_at_a_time(api)
    info = api.operator.get("/v1/tenants/acme/queues/q/concurrency").json()
    assert (info["limit"], info["approval"]) == (1, None)


def test_an_expired_approval_falls_back_to_one_lease_at_a_time(api: Api, db: Db) -> None:
    for n in range(6):
        api.enqueue(payload=n)
    post(api)
    leases = api.acquire(max_items=5)
    assert len(leases) == 3
    db.execute("UPDATE spend_approvals SET expires_at = now() - interval '1 second'")
    finish(api, leases)
    lease_one_at_a_time(api)
    (listed,) = api.operator.get(PATH).json()["approvals"]
    assert (listed["live"], listed["revoked_at"]) == (False, None)


def test_revoking_twice_answers_the_first_revocation_and_an_unknown_id_is_404(api: Api) -> None:
    approval = post(api).json()
    first = revoke(api, approval["approval_id"]).json()
    # Again, by another operator: the first revocation stands, with its key.
    created = api.admin.post("/v1/tenants/acme/keys", json={"role": "operator"})
    again = revoke(api, approval["approval_id"], client=api.client(created.json()["secret"]))
    assert again.status_code == 200
    assert again.headers.get("Idempotent-Replayed") is None
    assert (again.json()["revoked_at"], again.json()["revoked_by"]) == (
        first["revoked_at"],
        first["revoked_by"],
    )
    for unknown in (uuid.uuid4(), "not-a-uuid"):
        missing = revoke(api, unknown)
        assert missing.status_code == 404, missing.text
        assert missing.json()["code"] == "spend-approval-not-found"


def test_a_revoke_replays_under_its_idempotency_key_and_needs_one(api: Api) -> None:
    approval = post(api).json()
    first = revoke(api, approval["approval_id"], key="revoke-1")
    replay = revoke(api, approval["approval_id"], key="revoke-1")
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json() == first.json()
    keyless = api.operator.delete(f"{PATH}/{approval['approval_id']}")
    assert keyless.status_code == 400


def test_revoking_needs_an_operator_and_another_queues_approval_is_404(api: Api) -> None:
    approval = post(api).json()
    refused = api.worker.delete(
        f"{PATH}/{approval['approval_id']}", headers={"Idempotency-Key": "w"}
    )
    assert refused.status_code == 403
    other = api.operator.delete(
        f"/v1/tenants/acme/queues/other/spend-approvals/{approval['approval_id']}",
        headers={"Idempotency-Key": "o"},
    )
    assert other.status_code == 404
    (listed,) = api.operator.get(PATH).json()["approvals"]
    assert listed["live"] is True


def test_the_list_shows_live_and_revoked_approvals_newest_first(api: Api) -> None:
    older = post(api, max_concurrency=2).json()
    newer = post(api, max_concurrency=4).json()
    revoke(api, older["approval_id"])
    listed = api.operator.get(PATH).json()["approvals"]
    assert [(a["approval_id"], a["live"]) for a in listed] == [
        (newer["approval_id"], True),
        (older["approval_id"], False),
    ]
    assert api.worker.get(PATH).status_code == 403


def limit_of(api: Api) -> int:
    info: dict[str, int] = api.operator.get("/v1/tenants/acme/queues/q/concurrency").json()
    return info["limit"]


def leases_at_once(api: Api) -> int:
    """How many leases the queue hands out at once now; they are then finished."""
    leases = api.acquire(max_items=10, worker="w1")
    assert api.acquire(max_items=10, worker="w2") == []  # nothing more while they live
    finish(api, leases)
    return len(leases)


def test_the_largest_live_approval_sets_the_limit_and_a_revoked_or_expired_one_none(
    api: Api, db: Db
) -> None:
    for n in range(40):
        api.enqueue(payload=n)
    largest = post(api, max_concurrency=5).json()
    expiring = post(api, max_concurrency=4).json()
    smallest = post(api, max_concurrency=2).json()
    assert (leases_at_once(api), limit_of(api)) == (5, 5)
    assert revoke(api, largest["approval_id"]).status_code == 200
    assert (leases_at_once(api), limit_of(api)) == (4, 4)
    db.execute(
        "UPDATE spend_approvals SET expires_at = now() - interval '1 second'"
        " WHERE approval_id = %s",
        (expiring["approval_id"],),
    )
    assert (leases_at_once(api), limit_of(api)) == (2, 2)
    assert revoke(api, smallest["approval_id"]).status_code == 200
    assert (leases_at_once(api), limit_of(api)) == (1, 1)


def test_an_approval_ends_at_its_expiry_by_the_database_clock(api: Api, db: Db) -> None:
    for n in range(6):
        api.enqueue(payload=n)
    row = db.execute("SELECT now() + interval '1.5 seconds' AS at").fetchone()
    assert row is not None
    expires_at = row["at"]
    assert isinstance(expires_at, datetime)
    made = post(api, expires_at=expires_at.isoformat())
    assert made.status_code == 201, made.text
    assert leases_at_once(api) == 3
    while db.execute("SELECT now() <= %s AS live", (expires_at,)).fetchone() == {"live": True}:
        time.sleep(0.05)
    assert (leases_at_once(api), limit_of(api)) == (1, 1)


def test_an_approval_stored_above_the_loaded_max_approved_is_held_to_it(
    tmp_path: Path, database_url: str, db: Db
) -> None:
    concurrency = {"limit": 1, "scope": "local", "max-approved": 3}
    policy = policy_file(
        tmp_path / "narrow.json",
        {"durable-leased-work": {"concurrency": concurrency}},
        version="test.narrow-approvals",
    )
    settings = Settings(data_dir=tmp_path, poll_interval=0.2, policy=str(policy))
    with live_api(settings, database_url) as api:
        for n in range(10):
            api.enqueue(payload=n)
        refused = post(api, max_concurrency=4)
        assert refused.status_code == 422, refused.text
        (error,) = refused.json()["errors"]
        assert (error["cell"], error["limit"]) == ("durable-leased-work/concurrency", 3)
        made = post(api, max_concurrency=3)
        assert made.status_code == 201, made.text
        assert (leases_at_once(api), limit_of(api)) == (3, 3)
        # Stored under a looser policy: an approval the loaded one would refuse.
        db.execute("UPDATE spend_approvals SET max_concurrency = 8")
        assert (leases_at_once(api), limit_of(api)) == (3, 3)
