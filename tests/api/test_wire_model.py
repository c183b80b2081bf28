"""One wire model: each resource's answer has exactly the fields of its `queue_server.wire`
class, the OpenAPI document describes that class, and the SDK returns that class."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
from pydantic import BaseModel

from queue_server import client, wire
from tests.helpers.api import Api

WIRE_MODELS = (
    wire.WhoAmI,
    wire.Tenant,
    wire.ApiKey,
    wire.ApiKeyInfo,
    wire.Item,
    wire.LedgerEvent,
    wire.Lease,
    wire.Heartbeat,
    wire.SpendApproval,
    wire.Concurrency,
    wire.DeadLetter,
)


def fields(model: type[BaseModel]) -> set[str]:
    return set(model.model_fields)


def exactly(model: type[BaseModel], body: dict[str, Any]) -> None:
    assert set(body) == fields(model), f"{model.__name__}: {sorted(set(body) ^ fields(model))}"
    model.model_validate(body)


def test_every_answer_has_exactly_its_wire_fields(api: Api) -> None:
    exactly(wire.WhoAmI, api.worker.get("/v1/whoami").json())
    exactly(wire.Tenant, api.operator.get("/v1/tenants/acme").json())
    created = api.admin.post("/v1/tenants/acme/keys", json={"role": "worker"}).json()
    exactly(wire.ApiKey, created)
    for key in api.admin.get("/v1/tenants/acme/keys").json()["keys"]:
        exactly(wire.ApiKeyInfo, key)
    exactly(wire.Item, api.enqueue())
    api.approve("q", 4)
    [lease] = api.acquire()
    exactly(wire.Lease, lease)
    beat = api.holder("heartbeat", lease["item_id"], worker="w1", fence=lease["fence"])
    exactly(wire.Heartbeat, beat.json())
    item = api.worker.get(f"/v1/tenants/acme/items/{lease['item_id']}").json()
    exactly(wire.Item, item)
    for event in api.worker.get(f"/v1/tenants/acme/items/{lease['item_id']}/ledger").json()[
        "events"
    ]:
        exactly(wire.LedgerEvent, event)
    exactly(wire.Concurrency, api.worker.get("/v1/tenants/acme/queues/q/concurrency").json())
    approval = api.approve("q", 2)
    exactly(wire.SpendApproval, approval)
    revoked = api.operator.delete(
        f"/v1/tenants/acme/queues/q/spend-approvals/{approval['approval_id']}",
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    exactly(wire.SpendApproval, revoked.json())
    exactly(
        wire.SpendApprovals, api.operator.get("/v1/tenants/acme/queues/q/spend-approvals").json()
    )
    # Quarantined by its handler: a dead letter.
    triaged = api.holder(
        "triage",
        lease["item_id"],
        worker="w1",
        fence=lease["fence"],
        decision="quarantine",
        failure={"class": "Broken", "message": "broken"},
    )
    assert triaged.status_code == 200, triaged.text
    exactly(wire.Item, triaged.json())
    [dead] = api.operator.get("/v1/tenants/acme/dead-letters").json()["dead_letters"]
    exactly(wire.DeadLetter, dead)


def test_the_outbox_item_is_the_wire_item(
    api: Api, db: psycopg.Connection[dict[str, object]]
) -> None:
    """Webhook bodies carry the item the database renders (item_json): the same fields."""
    api.enqueue()
    row = db.execute("SELECT item_json(w) AS item FROM work_items w").fetchone()
    assert row is not None
    body = row["item"]
    assert isinstance(body, dict)
    exactly(wire.Item, body)


def test_the_openapi_document_and_the_sdk_use_the_wire_classes(api: Api) -> None:
    spec = api.worker.get("/openapi.json").json()
    schemas = spec["components"]["schemas"]
    for model in WIRE_MODELS:
        # The document describes the class itself: its name and every one of its fields.
        assert model.__name__ in schemas, model.__name__
        assert set(schemas[model.__name__]["properties"]) == fields(model)
        # The SDK's typed result is the same class, not a copy.
        assert getattr(client, model.__name__, model) is model
        assert getattr(client.models, model.__name__) is model
    item_route = spec["paths"]["/v1/tenants/{tenant}/items/{item_id}"]["get"]
    answer = item_route["responses"]["200"]["content"]["application/json"]["schema"]
    assert answer == {"$ref": "#/components/schemas/Item"}
