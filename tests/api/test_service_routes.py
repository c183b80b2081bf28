"""Health, readiness, metrics and the OpenAPI document."""

from __future__ import annotations

from queue_server.app import create_app
from queue_server.settings import Settings
from tests.helpers import web
from tests.helpers.api import Api
from tests.helpers.server import LiveServer


def test_healthz_and_readyz_answer_when_the_database_is_at_head(api: Api) -> None:
    assert api.client(None).get("/healthz").json() == {"status": "ok"}
    assert api.client(None).get("/readyz").status_code == 200


def test_readyz_is_503_problem_when_the_database_is_unreachable(settings: Settings) -> None:
    server = LiveServer(settings, "postgresql://postgres@/nope?host=/nonexistent&connect_timeout=1")
    server.start()
    try:
        # Liveness first (it needs no database): the process answers, its first request paid.
        assert web.get(f"{server.url}/healthz").status_code == 200
        response = web.get(f"{server.url}/readyz", timeout=30)
        assert response.status_code == 503
        # Readiness probes have short timeouts: the answer comes within about a second.
        assert response.elapsed.total_seconds() < 2.5
        assert response.headers["content-type"] == "application/problem+json"
    finally:
        server.stop()


def test_metrics_count_requests_by_route_and_items_by_state(api: Api) -> None:
    api.enqueue()
    api.acquire()
    text = api.admin.get("/metrics").text
    assert (
        'queue_server_requests_total{method="POST",route="/v1/tenants/{tenant}/queues/{queue}/items",status="201"} 1.0'
        in text
    )
    assert 'queue_server_items{state="leased",tenant="acme"} 1.0' in text
    assert "queue_server_acquire_seconds_count 1.0" in text


def test_openapi_describes_every_route(api: Api) -> None:
    document = api.client(None).get("/openapi.json").json()
    app = create_app(Settings(), "postgresql://unused")
    described = {
        (path, method.upper()) for path, ops in document["paths"].items() for method in ops
    }
    for route in app.routes:
        methods = getattr(route, "methods", None)
        path = getattr(route, "path_format", "")  # {item}, not {item:path}
        # The docs, and the console's HTML pages (not the REST API: tests/api/test_openapi_docs.py)
        if not methods or path.startswith(("/docs", "/redoc", "/openapi", "/console")):
            continue
        for method in methods - {"HEAD"}:
            assert (path, method) in described, f"{method} {path} missing from /openapi.json"


def test_openapi_marks_the_idempotency_key_required_on_effecting_routes(api: Api) -> None:
    document = api.client(None).get("/openapi.json").json()
    operation = document["paths"]["/v1/tenants/{tenant}/items/{item_id}/complete"]["post"]
    (header,) = [p for p in operation["parameters"] if p["name"] == "Idempotency-Key"]
    assert header["required"] is True


def test_method_not_allowed_names_every_method_of_the_path(api: Api) -> None:
    response = api.admin.patch("/v1/tenants/acme")
    assert response.status_code == 405
    assert response.headers["content-type"] == "application/problem+json"
    assert set(response.headers["Allow"].split(", ")) == {"GET", "PUT", "DELETE"}
