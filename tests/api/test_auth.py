"""API keys, roles and tenant isolation."""

from __future__ import annotations

import hashlib
import time

import psycopg
import pytest

from tests.helpers.api import Api, client_for, setup_tenant


@pytest.mark.parametrize(
    "authorization",
    [None, "Basic abc", "Bearer", "Bearer nonsense", "Bearer qsk_0123456789abcdef_wrong"],
)
def test_missing_malformed_or_unknown_key_gets_401(api: Api, authorization: str | None) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    response = api.client(None).get("/v1/tenants/acme/items/x", headers=headers)
    assert response.status_code == 401
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["code"] == "unauthorized"
    assert response.headers["www-authenticate"] == 'Bearer realm="queue-server"'


def test_a_valid_key_is_taken_only_as_a_bearer_token(api: Api) -> None:
    path = "/v1/tenants/acme/queues/q/concurrency"
    key = api.keys["worker"]
    for scheme in ("Basic", "Token", "Bearerx"):
        refused = api.client(None).get(path, headers={"Authorization": f"{scheme} {key}"})
        assert refused.status_code == 401, (scheme, refused.text)
    # The scheme's name is case-insensitive (RFC 9110).
    served = api.client(None).get(path, headers={"Authorization": f"bearer {key}"})
    assert served.status_code == 200, served.text


def test_revoked_key_is_refused_from_the_next_request(api: Api) -> None:
    created = api.admin.post("/v1/tenants/acme/keys", json={"role": "worker"}).json()
    worker = api.client(created["secret"])
    assert worker.get("/v1/tenants/acme/queues/q/concurrency").status_code == 200
    revoked = api.admin.delete(f"/v1/tenants/acme/keys/{created['key_id']}")
    assert revoked.status_code == 204
    assert worker.get("/v1/tenants/acme/queues/q/concurrency").status_code == 401
    # Listed no more, unless the revoked keys are asked for too.
    listed = api.admin.get("/v1/tenants/acme/keys").json()["keys"]
    assert created["key_id"] not in {key["key_id"] for key in listed}
    everyone = api.admin.get("/v1/tenants/acme/keys", params={"revoked": "true"}).json()["keys"]
    (shown,) = [key for key in everyone if key["key_id"] == created["key_id"]]
    assert shown["revoked_at"] is not None


def test_keys_are_stored_only_as_hashes(
    api: Api, db: psycopg.Connection[dict[str, object]]
) -> None:
    secret = api.keys["worker"]
    rows = db.execute("SELECT secret_hash FROM api_keys").fetchall()
    stored = {row["secret_hash"] for row in rows}
    assert hashlib.sha256(secret.encode()).hexdigest() in stored
    assert all(secret not in str(value) for value in stored)


def test_worker_key_may_not_manage_tenants(api: Api) -> None:
    response = api.worker.put("/v1/tenants/acme", json={"backlog_cap": 5})
    assert response.status_code == 403
    assert response.json()["code"] == "forbidden-role"
    assert api.worker.get("/v1/tenants/acme").status_code == 403


def test_operator_reads_its_tenant_with_counts(api: Api) -> None:
    api.enqueue()
    body = api.operator.get("/v1/tenants/acme").json()
    assert body["backlog_cap"] == 1000
    assert body["ready"] == 1
    assert body["backlog"] == 1


def test_another_tenants_item_is_404_never_403_or_data(api: Api) -> None:
    other = setup_tenant(api.url, api.admin, "globex")
    item = api.enqueue()
    for response in (
        other.worker.get(f"/v1/tenants/acme/items/{item['item_id']}"),
        other.worker.get(f"/v1/tenants/acme/items/{item['item_id']}/ledger"),
        other.operator.get("/v1/tenants/acme"),
        other.worker.post("/v1/tenants/acme/queues/q/leases", json={"worker": "w"}),
        other.worker.post(
            f"/v1/tenants/acme/items/{item['item_id']}/complete",
            json={"worker": "w", "fence": 1},
            headers={"Idempotency-Key": "k"},
        ),
    ):
        assert response.status_code == 404, response.text
        assert "payload" not in response.text
    # Its own view of the same id: not found either.
    assert other.worker.get(f"/v1/tenants/globex/items/{item['item_id']}").status_code == 404


def test_another_tenants_route_is_404_before_any_validation(api: Api) -> None:
    """The tenant gate runs before the query and the body are read: a malformed request
    about another tenant learns nothing (404), not even which of its fields were wrong."""
    other = setup_tenant(api.url, api.admin, "globex")
    for response in (
        other.worker.delete("/v1/tenants/acme"),
        other.operator.delete("/v1/tenants/acme"),
        other.operator.get("/v1/tenants/acme/receipts"),
        other.operator.get("/v1/tenants/acme/receipts", params={"state": "nonsense"}),
        other.worker.post(
            "/v1/tenants/acme/queues/q/items",
            content=b"{not json",
            headers={"Idempotency-Key": "k", "Content-Type": "application/json"},
        ),
        other.worker.post("/v1/tenants/acme/queues/q/leases", json={"lease_ttl": "x"}),
    ):
        assert response.status_code == 404, response.text
        assert response.json()["code"] == "tenant-not-found"
    # Its own tenant's malformed requests are still told what is wrong.
    assert other.operator.get("/v1/tenants/globex/receipts").status_code == 422
    assert other.worker.delete("/v1/tenants/globex").status_code == 403
    broken = other.worker.post(
        "/v1/tenants/globex/queues/q/items",
        content=b"{not json",
        headers={"Idempotency-Key": "k", "Content-Type": "application/json"},
    )
    assert broken.status_code == 422
    # Without a key, a body that is not JSON is a 401 like any other request.
    anonymous = api.client(None).post(
        "/v1/tenants/acme/queues/q/items",
        content=b"{not json",
        headers={"Idempotency-Key": "k", "Content-Type": "application/json"},
    )
    assert anonymous.status_code == 401


def test_admin_key_creation_requires_an_existing_tenant(api: Api) -> None:
    response = api.admin.post("/v1/tenants/nobody/keys", json={"role": "worker"})
    assert response.status_code == 404
    assert response.json()["code"] == "tenant-not-found"


def test_key_of_a_tenant_works_only_with_its_role(api: Api) -> None:
    operator = client_for(api.url, api.keys["operator"])
    response = operator.post("/v1/tenants/acme/queues/q/leases", json={"worker": "w"})
    assert response.status_code == 403


def test_revocation_reaches_another_api_process_that_cached_the_key(
    api: Api, settings: object, database_url: str
) -> None:
    from queue_server.settings import Settings
    from tests.helpers.server import LiveServer

    assert isinstance(settings, Settings)
    other = LiveServer(settings, database_url)
    other.start()
    try:
        created = api.admin.post("/v1/tenants/acme/keys", json={"role": "worker"}).json()
        via_other = client_for(other.url, created["secret"])
        # Wait until the other process listens, then let it cache the key.
        time.sleep(0.5)
        assert via_other.get("/v1/tenants/acme/queues/q/concurrency").status_code == 200
        assert api.admin.delete(f"/v1/tenants/acme/keys/{created['key_id']}").status_code == 204
        time.sleep(0.2)  # the notification's trip between processes
        assert via_other.get("/v1/tenants/acme/queues/q/concurrency").status_code == 401
    finally:
        other.stop()


def test_admin_routes_about_another_tenant_are_404_for_a_tenant_key(api: Api) -> None:
    other = setup_tenant(api.url, api.admin, "globex")
    for response in (
        other.operator.put("/v1/tenants/acme", json={"backlog_cap": 1}),
        other.operator.post("/v1/tenants/acme/keys", json={"role": "worker"}),
        other.operator.delete("/v1/tenants/acme/keys/0123456789abcdef"),
    ):
        assert response.status_code == 404, response.text
    # About its own tenant, the same key is told it lacks the role.
    assert other.operator.put("/v1/tenants/globex", json={"backlog_cap": 1}).status_code == 403


def test_only_an_admin_lists_the_tenants(api: Api) -> None:
    for name in ("zeta", "beta"):
        assert api.admin.put(f"/v1/tenants/{name}", json={"backlog_cap": 5}).status_code == 200
    page = api.admin.get("/v1/tenants", params={"limit": 2}).json()
    assert [t["tenant"] for t in page["tenants"]] == ["acme", "beta"]
    rest = api.admin.get("/v1/tenants", params={"cursor": page["next_cursor"]}).json()
    assert [t["tenant"] for t in rest["tenants"]] == ["zeta"]
    assert rest["next_cursor"] is None
    assert api.operator.get("/v1/tenants").status_code == 403
    assert api.worker.get("/v1/tenants").status_code == 403


def test_a_tenant_key_deleting_or_changing_another_tenant_learns_nothing(api: Api) -> None:
    other = setup_tenant(api.url, api.admin, "globex")
    for client in (api.operator, api.worker):
        assert client.delete("/v1/tenants/globex").status_code == 404
        assert client.put("/v1/tenants/globex", json={"backlog_cap": 5}).status_code == 404
        assert client.delete("/v1/tenants/nobody").status_code == 404
    assert api.operator.delete("/v1/tenants/acme").status_code == 403  # its own: admin only
    assert other.operator.get("/v1/tenants/globex").status_code == 200
