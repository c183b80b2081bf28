"""The receipts API: one-shot claim, settle once, same identity replays, kept in PostgreSQL."""

from __future__ import annotations

import psycopg

from tests.helpers.api import Api

Db = psycopg.Connection[dict[str, object]]
BASE = "/v1/tenants/acme/receipts"


def _claim(api: Api, key: str, ref: str, token: str | None = None) -> tuple[int, dict[str, object]]:
    body: dict[str, object] = {"idempotency_key": key, "outcome_ref": ref}
    if token is not None:
        body["claim_token"] = token
    response = api.worker.post(BASE, json=body)
    return response.status_code, response.json()


def test_claim_creates_a_pending_receipt_stored_in_postgres(api: Api, db: Db) -> None:
    status, body = _claim(api, "k-1", "ref-1")
    assert status == 201
    assert body["status"] == "pending"
    assert body["outcome"] is None
    row = db.execute(
        "SELECT tenant_id, idempotency_key, status FROM confirmation_receipts"
        " WHERE outcome_ref = 'ref-1'"
    ).fetchone()
    assert row == {"tenant_id": "acme", "idempotency_key": "k-1", "status": "pending"}


def test_same_identity_claimed_again_returns_the_retained_receipt_without_a_grant(api: Api) -> None:
    _claim(api, "k-1", "ref-1")
    response = api.worker.post(BASE, json={"idempotency_key": "k-1", "outcome_ref": "ref-1"})
    assert response.status_code == 200
    assert response.headers["Idempotent-Replayed"] == "true"
    assert response.json()["status"] == "pending"


def test_claim_retried_with_its_own_token_is_granted_again(api: Api) -> None:
    assert _claim(api, "k-1", "ref-1", token="t-1")[0] == 201
    assert _claim(api, "k-1", "ref-1", token="t-1")[0] == 201
    assert _claim(api, "k-1", "ref-1", token="someone-else")[0] == 200


def test_claim_refuses_a_reference_bound_to_another_key(api: Api) -> None:
    _claim(api, "k-1", "ref-1")
    status, body = _claim(api, "k-2", "ref-1")
    assert status == 409
    assert body["code"] == "receipt-conflict"


def test_claim_refuses_a_key_bound_to_another_reference(api: Api) -> None:
    _claim(api, "k-1", "ref-1")
    status, body = _claim(api, "k-1", "ref-2")
    assert status == 409
    assert body["outcome_ref"] == "ref-1"


def test_claim_without_identity_is_refused_before_anything_is_stored(api: Api, db: Db) -> None:
    response = api.worker.post(BASE, json={"idempotency_key": "", "outcome_ref": "ref-1"})
    assert response.status_code == 422
    response = api.worker.post(BASE, json={"idempotency_key": "k"})
    assert response.status_code == 422
    assert db.execute("SELECT count(*) AS n FROM confirmation_receipts").fetchone() == {"n": 0}


def test_settle_records_the_outcome_once_and_replays_the_same_settlement(api: Api) -> None:
    _claim(api, "k-1", "ref-1")
    settle = {"status": "succeeded", "outcome": {"refund": 42}}
    first = api.worker.put(f"{BASE}/ref-1", json=settle)
    assert first.status_code == 200
    assert first.json()["status"] == "succeeded"
    assert first.json()["settled_at"] is not None
    again = api.worker.put(f"{BASE}/ref-1", json=settle)
    assert again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    other = api.worker.put(f"{BASE}/ref-1", json={"status": "failed", "outcome": {"e": 1}})
    assert other.status_code == 409
    assert other.json()["code"] == "receipt-conflict"
    # The same status with another outcome is another settlement, not a replay.
    other = api.worker.put(f"{BASE}/ref-1", json={"status": "succeeded", "outcome": {"refund": 43}})
    assert other.status_code == 409
    assert other.json()["code"] == "receipt-conflict"
    got = api.worker.get(f"{BASE}/ref-1").json()
    assert (got["status"], got["outcome"]) == ("succeeded", {"refund": 42})


def test_claim_after_settlement_returns_the_retained_outcome(api: Api) -> None:
    _claim(api, "k-1", "ref-1", token="t-1")
    api.worker.put(f"{BASE}/ref-1", json={"status": "failed", "outcome": {"error": "declined"}})
    # Its own token, retried once the effect was settled, is granted nothing again either.
    for token in (None, "t-1"):
        status, body = _claim(api, "k-1", "ref-1", token=token)
        assert status == 200
        assert (body["status"], body["outcome"]) == ("failed", {"error": "declined"})


def test_settle_refuses_pending_as_a_settlement(api: Api) -> None:
    _claim(api, "k-1", "ref-1")
    response = api.worker.put(f"{BASE}/ref-1", json={"status": "pending", "outcome": None})
    assert response.status_code == 422


def test_settle_and_get_of_an_unknown_reference_are_not_found(api: Api) -> None:
    settle = api.worker.put(f"{BASE}/nope", json={"status": "succeeded", "outcome": {}})
    assert settle.status_code == 404
    assert settle.json()["code"] == "receipt-not-found"
    assert api.worker.get(f"{BASE}/nope").status_code == 404


def test_receipts_are_scoped_to_their_tenant(api: Api) -> None:
    from tests.helpers.api import setup_tenant

    other = setup_tenant(api.url, api.admin, "globex")
    _claim(api, "k-1", "ref-1")
    assert other.worker.get("/v1/tenants/globex/receipts/ref-1").status_code == 404
    assert other.worker.get(f"{BASE}/ref-1").status_code == 404
    response = other.worker.post(
        "/v1/tenants/globex/receipts", json={"idempotency_key": "k-1", "outcome_ref": "ref-1"}
    )
    assert response.status_code == 201


def test_receipts_need_a_key(api: Api) -> None:
    from tests.helpers.api import client_for

    with client_for(api.url, None) as anonymous:
        assert anonymous.get(f"{BASE}/ref-1").status_code == 401
