"""Watchers are configuration: an operator's, like every other. A worker key gets 403 on every
watcher and delivery route (and another tenant's key 404, never 403)."""

from __future__ import annotations

import uuid

from tests.helpers.api import Api, setup_tenant
from tests.helpers.watchers import ModeReceiver, register


def test_a_worker_key_gets_403_on_every_watcher_route(api: Api, receiver: ModeReceiver) -> None:
    watcher = register(api, receiver.url("/hook"))
    spec = api.admin.get("/openapi.json").json()
    routes = [
        (method.upper(), path)
        for path, operations in spec["paths"].items()
        if "/watchers" in path or "/deliveries" in path
        for method in operations
    ]
    assert len(routes) >= 9
    ids = {
        "{tenant}": "acme",
        "{watcher_id}": str(watcher["watcher_id"]),
        "{delivery_id}": str(uuid.uuid4()),
    }
    body = {"url": receiver.url("/hook"), "events": ["item.completed"]}
    other = setup_tenant(api.url, api.admin, "globex")
    for method, template in routes:
        path = template
        for name, value in ids.items():
            path = path.replace(name, value)
        kwargs = {"json": body} if method == "POST" else {}
        headers = {"Idempotency-Key": uuid.uuid4().hex}
        answer = api.worker.request(method, path, headers=headers, **kwargs)  # type: ignore[arg-type]
        assert answer.status_code == 403, (method, template, answer.text)
        assert answer.json()["code"] == "forbidden-role"
        intruder = other.operator.request(method, path, headers=headers, **kwargs)  # type: ignore[arg-type]
        assert intruder.status_code == 404, (method, template, intruder.text)
    listed = api.operator.get("/v1/tenants/acme/watchers").json()["watchers"]
    assert [w["watcher_id"] for w in listed] == [watcher["watcher_id"]]
    assert (
        api.operator.get(f"/v1/tenants/acme/watchers/{watcher['watcher_id']}").json()["state"]
        == "active"
    )
