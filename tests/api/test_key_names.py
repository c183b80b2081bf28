"""A key may carry a name, and every ledger that names the key that acted shows it: the
item's ledger, a queue's events and the console's timeline; a key without one, or another
tenant's, shows its id alone."""

from __future__ import annotations

import uuid

import httpx

from tests.helpers.api import Api, client_for
from tests.helpers.console import sign_in


def _named(api: Api, role: str, name: str) -> tuple[str, httpx.Client]:
    created = api.admin.post(f"/v1/tenants/{api.tenant}/keys", json={"role": role, "name": name})
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["name"] == name
    return body["key_id"], client_for(api.url, body["secret"])


def test_the_ledgers_name_the_key_that_acted(api: Api) -> None:
    billing_id, billing = _named(api, "worker", "billing-worker")
    on_call_id, on_call = _named(api, "operator", "on-call · Ada")
    enqueued = billing.post(
        f"/v1/tenants/{api.tenant}/queues/mail/items",
        json={"payload": {"to": "ada"}},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert enqueued.status_code == 201, enqueued.text
    item_id = enqueued.json()["item_id"]
    anonymous = api.enqueue("mail")  # the fixture's worker key has no name

    (first,) = billing.get(f"/v1/tenants/{api.tenant}/items/{item_id}/ledger").json()["events"]
    assert (first["actor"], first["actor_name"]) == (f"key:{billing_id}", "billing-worker")
    (other,) = api.worker.get(
        f"/v1/tenants/{api.tenant}/items/{anonymous['item_id']}/ledger"
    ).json()["events"]
    assert other["actor"].startswith("key:")
    assert other["actor_name"] is None

    paused = on_call.post(
        f"/v1/tenants/{api.tenant}/queues/mail/pause",
        json={"reason": "provider down"},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert paused.status_code == 200, paused.text
    events = on_call.get(f"/v1/tenants/{api.tenant}/queues/mail").json()["events"]
    assert [(e["kind"], e["actor"], e["actor_name"]) for e in events] == [
        ("paused", f"key:{on_call_id}", "on-call · Ada")
    ]

    listed = api.admin.get(f"/v1/tenants/{api.tenant}/keys").json()["keys"]
    names = {k["key_id"]: k["name"] for k in listed}
    assert names[billing_id] == "billing-worker"
    assert names[on_call_id] == "on-call · Ada"

    client, _ = sign_in(api.url, api.keys["operator"])
    page = client.get(f"/console/tenants/{api.tenant}/items/{item_id}").text
    assert f"billing-worker (key:{billing_id}) enqueued it on mail" in page


def test_a_key_name_is_printable_and_at_most_64_characters(api: Api) -> None:
    for name in ("", "x" * 65, "tab\there", "bell\x07"):
        refused = api.admin.post(
            f"/v1/tenants/{api.tenant}/keys", json={"role": "worker", "name": name}
        )
        assert refused.status_code == 422, (name, refused.text)
        assert refused.json()["code"] == "invalid-request"
    kept = api.admin.post(
        f"/v1/tenants/{api.tenant}/keys", json={"role": "worker", "name": "x" * 64}
    )
    assert kept.status_code == 201, kept.text
