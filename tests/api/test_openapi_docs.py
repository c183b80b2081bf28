"""/docs serves Swagger UI from the installed package; the OpenAPI document declares bearer
auth and an example on each request body that the server accepts as valid."""

from __future__ import annotations

import re
import uuid
from typing import Any

from tests.helpers.api import Api

# Routes a caller needs no key for: probes and the published reliability policy.
OPEN = {"/healthz", "/readyz", "/v1/policy"}


def _document(api: Api) -> dict[str, Any]:
    document: dict[str, Any] = api.client(None).get("/openapi.json").json()
    return document


def _schema(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """A request body's schema, its $ref (or the non-null branch of an optional one) resolved."""
    if "anyOf" in schema:
        (schema,) = [s for s in schema["anyOf"] if s.get("type") != "null"]
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        resolved: dict[str, Any] = document["components"]["schemas"][name]
        return resolved
    return schema


def test_openapi_declares_bearer_auth_on_every_route_that_needs_a_key(api: Api) -> None:
    document = _document(api)
    scheme = document["components"]["securitySchemes"]["apiKey"]
    assert scheme["type"] == "http"
    assert scheme["scheme"] == "bearer"
    keyed = 0
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            if path in OPEN:
                assert operation["security"] == [], f"{method} {path}"
                continue
            assert operation.get("security") == [{"apiKey": []}], f"{method} {path}"
            keyed += 1
    assert keyed > 30
    assert "/metrics" in document["paths"]
    # The console's pages (HTML, a session cookie) are not the REST API's.
    assert not [path for path in document["paths"] if path.startswith("/console")]


def test_every_request_body_has_an_example_the_server_takes_as_valid(api: Api) -> None:
    document = _document(api)
    ids = {
        "tenant": "acme",
        "queue": "emails",
        "key_id": "0123456789abcdef",
        "item": "checksum",
        "ref": "refund-4711",
    }
    checked = 0
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            body = operation.get("requestBody")
            if body is None:
                continue
            schema = _schema(document, body["content"]["application/json"]["schema"])
            examples = schema.get("examples")
            assert examples, f"{method.upper()} {path}: no example on its request body"
            url = re.sub(r"\{(\w+)\}", lambda m: ids.get(m.group(1), str(uuid.uuid4())), path)
            response = api.admin.request(
                method.upper(),
                url,
                json=examples[0],
                headers={"Idempotency-Key": uuid.uuid4().hex},
            )
            # Refused for what it names (no such item, ...) perhaps, never as malformed.
            assert response.status_code != 422 or response.json().get("errors") is None, (
                f"{method.upper()} {path}: {response.text}"
            )
            checked += 1
    assert checked >= 20


def test_docs_serve_swagger_ui_from_the_package_without_a_cdn(api: Api) -> None:
    page = api.client(None).get("/docs")
    assert page.status_code == 200
    assert "swagger-ui" in page.text
    # Nothing is loaded from another host.
    assert re.findall(r"""(?:src|href)=["']https?://""", page.text) == []
    assets = re.findall(r"""(?:src|href)=["'](/[^"']+)["']""", page.text)
    assert any(a.endswith("swagger-ui-bundle.js") for a in assets)
    assert any(a.endswith("swagger-ui.css") for a in assets)
    for asset in assets:
        served = api.client(None).get(f"{asset}")
        assert served.status_code == 200, asset
        if asset.endswith(".js"):
            assert len(served.content) > 100_000
            assert "javascript" in served.headers["content-type"]
    assert "'/openapi.json'" in page.text or '"/openapi.json"' in page.text


def test_every_error_is_described_as_the_problem_document_the_server_sends(api: Api) -> None:
    document = _document(api)
    assert document["servers"] == [{"url": "/", "description": "this server"}]
    problem = document["components"]["schemas"]["Problem"]
    # An open string: a client generated today still reads a code added later.
    code = problem["properties"]["code"]
    assert code["type"] == "string"
    assert "enum" not in code
    codes = set(re.findall(r"`([a-z-]+)`", code["description"]))
    assert {"backlog-cap-reached", "item-not-leased", "not-found"} <= codes
    described = 0
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for status, response in operation["responses"].items():
                if status[:1] in "45":
                    assert response["content"] == {
                        "application/problem+json": {
                            "schema": {"$ref": "#/components/schemas/Problem"}
                        }
                    }, f"{method} {path} {status}"
                    described += 1
    assert described > 100
    # What the server answers: every code is one the description lists.
    api.enqueue("q")
    (lease,) = api.acquire("q")
    answers = [
        api.client(None).get("/v1/tenants/acme/items"),  # 401
        api.operator.get("/v1/tenants/globex/items"),  # 404
        api.worker.post(  # 409: another worker's lease
            f"/v1/tenants/acme/items/{lease['item_id']}/complete",
            json={"worker": "not-the-holder", "fence": lease["fence"]},
            headers={"Idempotency-Key": uuid.uuid4().hex},
        ),
        api.worker.post("/v1/tenants/acme/queues/q/leases", json={"worker": 5}),  # 422
        api.worker.put("/healthz"),  # 405
    ]
    for answer in answers:
        assert answer.headers["content-type"] == "application/problem+json", answer.text
        body = answer.json()
        assert body["code"] in codes, body
        assert set(problem["required"]) <= set(body)
    assert [a.status_code for a in answers] == [401, 404, 409, 422, 405]


def test_operations_are_named_by_their_route_functions_and_request_defaults_are_words(
    api: Api,
) -> None:
    """Generated clients call `enqueue`, `acquire`, `complete`; a defaulted request field is
    optional for them (no `default` a generator would make the caller send)."""
    document = _document(api)
    ids = [
        operation["operationId"]
        for operations in document["paths"].values()
        for operation in operations.values()
    ]
    assert len(ids) == len(set(ids))
    assert all(re.fullmatch(r"[a-z][a-z_]{2,30}", i) for i in ids), ids
    named = {
        (path, method): operation["operationId"]
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
    }
    items = "/v1/tenants/{tenant}/items/{item_id}"
    assert named[("/v1/tenants/{tenant}/queues/{queue}/items", "post")] == "enqueue"
    assert named[("/v1/tenants/{tenant}/queues/{queue}/leases", "post")] == "acquire"
    assert named[(f"{items}/complete", "post")] == "complete"
    schemas = document["components"]["schemas"]
    acquire = schemas["AcquireIn"]
    assert acquire["required"] == ["worker"]
    assert "default" not in acquire["properties"]["max_items"]
    assert "Default: `1`." in acquire["properties"]["max_items"]["description"]
    bodies = {
        media["schema"]["$ref"].rsplit("/", 1)[-1]
        for operations in document["paths"].values()
        for operation in operations.values()
        for media in operation.get("requestBody", {}).get("content", {}).values()
        if "$ref" in media.get("schema", {})
    }
    assert len(bodies) > 20
    for name in bodies:
        for field, spec in schemas[name].get("properties", {}).items():
            assert "default" not in spec, (name, field)
