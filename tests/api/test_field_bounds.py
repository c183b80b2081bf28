"""Each bounded request field of the API's contract at its bound is taken, and one step
past it is refused as 422 `invalid-request` naming the field: what a client generated from
the OpenAPI document is told, and where a slip of one bound would let a value through."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from tests.helpers.api import Api

DAYS = 24 * 3600
ITEM = "0190f3c2-5b1e-7a44-9c1d-2f6e8a1b3c4d"  # no such item: a holder call answers 404/409
LEASE = {"worker": "w1", "fence": 1}


def entries(n: int) -> list[dict[str, Any]]:
    return [{"item_id": str(uuid.uuid4()), "fence": 1} for _ in range(n)]


# (route, field, taken, refused): bodies sent to the route; `field` is the error's loc.
CASES: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = [
    ("items", "priority", {"priority": 1_000_000}, {"priority": 1_000_001}),
    ("items", "priority", {"priority": -1_000_000}, {"priority": -1_000_001}),
    ("items", "delay", {"delay": 0}, {"delay": -1}),
    ("items", "delay", {"delay": 365 * DAYS}, {"delay": 365 * DAYS + 1}),
    ("items", "max_acquisitions", {"max_acquisitions": 1}, {"max_acquisitions": 0}),
    ("items", "unique_for", {"unique_key": "k", "unique_for": 0.5}, {"unique_key": "k", "unique_for": 0}),
    ("items", "unique_for", {"unique_key": "k", "unique_for": 366 * DAYS}, {"unique_key": "k", "unique_for": 366 * DAYS + 1}),
    ("items", "depends_on", {"depends_on": [ITEM] * 100}, {"depends_on": [ITEM] * 101}),
    ("items", "depends_on", {"depends_on": [ITEM]}, {"depends_on": []}),
    ("batch", "items", {"items": [{"payload": n} for n in range(500)]}, {"items": [{"payload": n} for n in range(501)]}),
    ("batch", "items", {"items": [{"payload": 1}]}, {"items": []}),
    ("leases", "lease_ttl", {"lease_ttl": 1}, {"lease_ttl": 0.5}),
    ("leases", "max_items", {"max_items": 100}, {"max_items": 101}),
    ("leases", "max_items", {"max_items": 1}, {"max_items": 0}),
    ("leases", "wait", {"wait": 0}, {"wait": 31}),
    ("complete", "fence", {"fence": 0}, {"fence": -1}),
    ("complete", "fence", {"fence": 2**63 - 1}, {"fence": 2**63}),
    ("requeue", "delay", {"delay": 0}, {"delay": -1}),
    ("requeue", "reason", {"reason": "r" * 4096}, {"reason": "r" * 4097}),
    ("heartbeats", "leases", {"leases": entries(500)}, {"leases": entries(501)}),
    ("completions", "completions", {"completions": entries(500)}, {"completions": entries(501)}),
]  # fmt: skip


def send(api: Api, route: str, fields: dict[str, Any]) -> Any:
    tenant = "/v1/tenants/acme"
    routes: dict[str, tuple[str, dict[str, Any]]] = {
        "items": (f"{tenant}/queues/q/items", {"payload": 1}),
        "batch": (f"{tenant}/queues/q/items:batch", {}),
        "leases": (f"{tenant}/queues/q/leases", {"worker": "w1"}),
        "complete": (f"{tenant}/items/{ITEM}/complete", LEASE),
        "requeue": (f"{tenant}/items/{ITEM}/requeue", LEASE),
        "heartbeats": (f"{tenant}/leases:heartbeat", {"worker": "w1"}),
        "completions": (f"{tenant}/completions", {"worker": "w1"}),
    }
    at, body = routes[route]
    return api.worker.post(at, json=body | fields, headers={"Idempotency-Key": uuid.uuid4().hex})


def named(answered: Any) -> set[str]:
    """The request fields a 422 names (none for another status)."""
    if answered.status_code != 422:
        return set()
    return {str(e["loc"][1]) for e in answered.json().get("errors", [])}


@pytest.mark.parametrize(("route", "field", "taken", "refused"), CASES)
def test_a_field_at_its_bound_is_taken_and_one_past_it_refused_naming_it(
    api: Api, route: str, field: str, taken: dict[str, Any], refused: dict[str, Any]
) -> None:
    answered = send(api, route, taken)
    assert field not in named(answered), answered.text
    answered = send(api, route, refused)
    assert answered.status_code == 422, answered.text
    assert answered.json()["code"] == "invalid-request"
    assert field in named(answered), answered.text
