"""Every route of /openapi.json, with hostile text in every path, query and body string.

NUL, a lone surrogate, digits that are not ASCII (`"²".isdigit()` is true, `int("²")`
raises) and a name IDNA cannot encode, each put in place of one string at a time while
the rest of the request stays valid (real ids, a valid body), so each value reaches
as deep as it can. Also page cursors that decode to such values. No answer may be a
5xx: each is a 4xx problem or a success.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest

from queue_server.settings import Settings
from tests.helpers.api import Api

HOSTILE = ("a\x00b", "\ud800", "\u00b2", "\u0663", "http://xn--/")
#: What a page cursor could be made to decode to: each hostile value beside valid parts.
FILLERS = ("00000000-0000-0000-0000-000000000000", "2024-01-01T00:00:00+00:00")
# Valid bodies for the routes this server documents; a route added later gets one built
# from its schema (`_sample`).
BODIES: dict[tuple[str, str], Any] = {
    ("PUT", "/v1/tenants/{tenant}"): {"backlog_cap": 100, "default_max_acquisitions": 3},
    ("POST", "/v1/tenants/{tenant}/keys"): {"role": "worker"},
    ("POST", "/v1/tenants/{tenant}/queues/{queue}/items"): {"payload": {"k": "v"}},
    ("POST", "/v1/tenants/{tenant}/queues/{queue}/items:batch"): {"items": [{"payload": "v"}]},
    ("POST", "/v1/tenants/{tenant}/queues/{queue}/leases"): {"worker": "w9", "lease_ttl": 5},
    ("POST", "/v1/tenants/{tenant}/items/{item_id}/heartbeat"): {"worker": "w1", "fence": 1},
    ("POST", "/v1/tenants/{tenant}/items/{item_id}/complete"): {
        "worker": "w1",
        "fence": 1,
        "result": {"r": "v"},
    },
    ("POST", "/v1/tenants/{tenant}/completions"): {
        "worker": "w1",
        "completions": [{"item_id": "{item_id}", "fence": 1, "result": "v"}],
    },
    ("POST", "/v1/tenants/{tenant}/items/{item_id}/requeue"): {
        "worker": "w1",
        "fence": 1,
        "reason": "r",
    },
    ("POST", "/v1/tenants/{tenant}/items/{item_id}/triage"): {
        "worker": "w1",
        "fence": 1,
        "failure": {"class": "c", "message": "m", "transient": True},
        "decision": "requeue",
    },
    ("POST", "/v1/tenants/{tenant}/queues/{queue}/spend-approvals"): {
        "max_concurrency": 2,
        "expires_at": (datetime.now(UTC) + timedelta(days=30)).isoformat(),
        "reason": "r",
    },
    ("POST", "/v1/tenants/{tenant}/dead-letters/{dead_letter_id}/discard"): {"reason": "r"},
    ("POST", "/v1/tenants/{tenant}/receipts"): {"idempotency_key": "k2", "outcome_ref": "ref-2"},
    ("PUT", "/v1/tenants/{tenant}/receipts/{ref}"): {"status": "failed", "outcome": "o"},
    ("POST", "/v1/tenants/{tenant}/verification-runs"): {
        "artifact_version": "a-1",
        "verifier_version": "v-1",
        "items": ["x"],
    },
    ("PUT", "/v1/tenants/{tenant}/verification-runs/{run_id}/checkpoints/{item}"): {"result": "ok"},
    ("POST", "/v1/tenants/{tenant}/watchers"): {
        "url": "http://127.0.0.1:9/hook",
        "events": ["item.completed"],
        "queues": ["q"],
    },
}


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path, poll_interval=0.2, lock_timeout_ms=2000, transport_allow=["127.0.0.1"]
    )


def _encode(value: str) -> str:
    """Percent-encoded as a client would send it (a lone surrogate as its WTF-8 bytes)."""
    return quote(value.encode("utf-8", "surrogatepass"), safe="")


def _cursors() -> Iterator[str]:
    for size in (1, 2, 3):
        for position in range(size):
            for filler in FILLERS:
                for value in HOSTILE:
                    parts = [filler] * size
                    parts[position] = value
                    raw = json.dumps(parts).encode()
                    yield base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _resolve(spec: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        schema = spec["components"]["schemas"][name]
    for union in ("anyOf", "oneOf"):
        if union in schema:
            options = [s for s in schema[union] if s.get("type") != "null"]
            return _resolve(spec, options[0]) if options else {}
    return schema


def _sample(spec: dict[str, Any], schema: dict[str, Any]) -> Any:
    """A plausible value for `schema` (strings wherever the schema allows any value)."""
    schema = _resolve(spec, schema)
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        return {name: _sample(spec, sub) for name, sub in props.items()}
    if kind == "array":
        return [_sample(spec, schema.get("items", {}))]
    if kind == "integer":
        return max(int(schema.get("minimum", 1)), 1)
    if kind == "number":
        return max(float(schema.get("minimum", 1)), 1.0)
    if kind == "boolean":
        return True
    if schema.get("format") == "date-time":
        return "2999-01-01T00:00:00Z"
    return "x1"


def _string_slots(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Where a body holds a string: each value, and each key of an object."""
    if isinstance(value, str):
        yield path
    elif isinstance(value, dict):
        for key, child in value.items():
            yield from _string_slots(child, (*path, key))
            yield (*path, ("key", key))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            yield from _string_slots(child, (*path, i))


def _replaced(value: Any, path: tuple[Any, ...], new: str) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(head, tuple):  # an object's key
        return {(new if k == head[1] else k): v for k, v in value.items()}
    if isinstance(value, dict):
        return {k: (_replaced(v, rest, new) if k == head else v) for k, v in value.items()}
    return [_replaced(v, rest, new) if i == head else v for i, v in enumerate(value)]


def _fill(template: str, ids: dict[str, str]) -> str:
    out = template
    for name, value in ids.items():
        out = out.replace("{" + name + "}", _encode(value))
    return out


def _fixtures(api: Api, db: psycopg.Connection[dict[str, Any]]) -> dict[str, str]:
    """Real ids for every path parameter, so a hostile value in one reaches the handler."""
    item_id = str(api.enqueue(payload="held")["item_id"])
    api.acquire(ttl=30)  # the policy's attempt timeout: the longest a lease may be asked for
    api.enqueue("dlq", payload="doomed")
    (doomed,) = api.acquire("dlq")
    api.holder(
        "triage",
        doomed["item_id"],
        worker="w1",
        fence=doomed["fence"],
        failure={"class": "c", "message": "m", "transient": False},
        decision="quarantine",
    )
    letters = api.operator.get(f"/v1/tenants/{api.tenant}/dead-letters").json()["dead_letters"]
    watcher = api.operator.post(
        f"/v1/tenants/{api.tenant}/watchers",
        json={"url": "http://127.0.0.1:9/hook", "events": ["item.enqueued"]},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    ).json()
    api.enqueue(payload="announced")
    delivery = db.execute(
        "SELECT delivery_id::text AS id FROM outbox_deliveries LIMIT 1"
    ).fetchone()
    claim = api.worker.post(
        f"/v1/tenants/{api.tenant}/receipts", json={"idempotency_key": "k1", "outcome_ref": "ref-1"}
    )
    assert claim.status_code == 201, claim.text
    run = api.worker.post(
        f"/v1/tenants/{api.tenant}/verification-runs",
        json={"artifact_version": "a-0", "verifier_version": "v-0", "items": ["x"]},
    )
    assert run.status_code == 201, run.text
    approval = api.approve("q", 2)
    return {
        "tenant": api.tenant,
        "queue": "q",
        "item_id": item_id,
        "dead_letter_id": str(letters[0]["dead_letter_id"]),
        "key_id": api.keys["worker"].split("_")[1],
        "watcher_id": str(watcher["watcher_id"]),
        "delivery_id": delivery["id"] if delivery else str(uuid.uuid4()),
        "ref": "ref-1",
        "run_id": str(run.json()["run_id"]),
        "item": "x",
        "approval_id": str(approval["approval_id"]),
    }


def test_hostile_text_anywhere_in_any_route_never_gets_a_5xx(
    api: Api, db: psycopg.Connection[dict[str, Any]]
) -> None:
    ids = _fixtures(api, db)
    spec = api.admin.get("/openapi.json").json()
    failures: list[str] = []
    sent = 0

    def send(method: str, url: str, body: Any, what: str) -> None:
        nonlocal sent
        sent += 1
        content = None if body is None else json.dumps(body).encode()
        try:
            response = api.admin.request(
                method,
                url,
                content=content,
                headers={"Idempotency-Key": uuid.uuid4().hex, "Content-Type": "application/json"},
            )
        except httpx.HTTPError as exc:
            failures.append(f"{method} {url} ({what}): no answer: {exc!r}")
            return
        if response.status_code >= 500:
            failures.append(f"{method} {url} ({what}): {response.status_code} {response.text}")
        elif response.status_code >= 400:
            assert response.headers["content-type"].startswith("application/problem+json"), what

    for template, operations in spec["paths"].items():
        for method, operation in operations.items():
            method = method.upper()
            params = operation.get("parameters", [])
            path_params = [p["name"] for p in params if p["in"] == "path"]
            query_params = [p["name"] for p in params if p["in"] == "query"]
            body_schema = (
                operation.get("requestBody", {})
                .get("content", {})
                .get("application/json", {})
                .get("schema")
            )
            body: Any = None
            if body_schema is not None:
                body = BODIES.get((method, template))
                body = _sample(spec, body_schema) if body is None else body
                body = json.loads(json.dumps(body).replace("{item_id}", ids["item_id"]))
            url = _fill(template, ids)
            for name in path_params:
                for value in HOSTILE:
                    hostile_path = _fill(template, {**ids, name: value})
                    send(method, hostile_path, body, f"path {name}={value!r}")
            for name in query_params:
                values = [*HOSTILE, *(_cursors() if name == "cursor" else ())]
                for value in values:
                    send(method, f"{url}?{name}={_encode(value)}", body, f"query {name}={value!r}")
            for slot in _string_slots(body):
                for value in HOSTILE:
                    send(method, url, _replaced(body, slot, value), f"body {slot}={value!r}")
    assert sent > 1000
    assert failures == [], "\n".join(failures[:40])


def test_the_reported_hostile_requests_get_4xx_problems(api: Api) -> None:
    cursor = base64.urlsafe_b64encode(
        json.dumps(["\x00", "00000000-0000-0000-0000-000000000000"]).encode()
    ).decode()
    watcher = api.operator.post(
        "/v1/tenants/acme/watchers",
        json={"url": "http://127.0.0.1:9/hook", "events": ["item.enqueued"]},
        headers={"Idempotency-Key": "w"},
    ).json()
    # A page cursor of items made by hand, its instant at an offset PostgreSQL cannot read.
    far = base64.urlsafe_b64encode(
        json.dumps(["2026-12-04T00:00:00+20:00", "00000000-0000-0000-0000-000000000000"]).encode()
    ).decode()
    requests = [
        ("GET", f"/v1/tenants/acme/items?cursor={far}", None),
        ("GET", f"/v1/tenants/acme/ledger-verification?cursor={cursor}", None),
        ("GET", f"/v1/ledger-verification?cursor={cursor}", None),
        (
            "GET",
            f"/v1/tenants/acme/watchers/{watcher['watcher_id']}/deliveries?cursor=%C2%B2",
            None,
        ),
        ("DELETE", "/v1/tenants/acme/keys/abc%00", None),
        ("POST", "/v1/tenants/acme/watchers", {"url": "http://xn--/", "events": ["item.enqueued"]}),
    ]
    for method, url, body in requests:
        response = api.admin.request(
            method, url, json=body, headers={"Idempotency-Key": uuid.uuid4().hex}
        )
        assert 400 <= response.status_code < 500, (url, response.status_code, response.text)
        assert response.headers["content-type"].startswith("application/problem+json")
        # The connection is kept: the next request on it is answered.
        assert api.admin.get("/v1/whoami").status_code == 200
