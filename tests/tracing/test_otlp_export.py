"""With OTEL_EXPORTER_OTLP_ENDPOINT set, `queue-server serve` exports a span per request
(the lease routes' lean path too) and per database round trip over OTLP/HTTP, each worker
process its own; without it, nothing of OpenTelemetry's SDK is loaded or installed."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers import web
from tests.helpers.api import setup_tenant
from tests.helpers.otlp import ReceivedSpan, otlp_receiver
from tests.helpers.serving import cmdline, parent, process_tree

BIN = Path(sys.executable).parent / "queue-server"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
ENQUEUE = "POST /v1/tenants/{tenant}/queues/{queue}/items"
ACQUIRE = "POST /v1/tenants/{tenant}/queues/{queue}/leases"
COMPLETE = "POST /v1/tenants/{tenant}/items/{item_id}/complete"
BATCH = "POST /v1/tenants/{tenant}/queues/{queue}/items:batch"
# Shared objects only the tracing stack brings: protobuf's (the OTLP exporter) and wrapt's
# (the instrumentations). A process that never loaded them has neither mapped.
TRACING_LIBRARIES = ("/google/_upb/", "/wrapt/")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _serving(pids: list[int]) -> set[int]:
    """The processes that answer requests: uvicorn's workers, each forked from the fork
    server (the supervisor's child that imported the app)."""
    forked = {pid for pid in pids if "multiprocessing.forkserver" in cmdline(pid)}
    return {pid for pid in forked if parent(pid) in forked}


def _mapped(pid: int) -> set[str]:
    maps = Path(f"/proc/{pid}/maps").read_text()
    return {library for library in TRACING_LIBRARIES if library in maps}


@pytest.fixture
def serve(database_url: str, tmp_path: Path) -> Iterator[object]:
    """Start `queue-server serve --workers 2` on the test's database with `extra` env."""
    started: list[subprocess.Popen[str]] = []

    def start(extra: dict[str, str]) -> tuple[str, str, subprocess.Popen[str]]:
        port = _free_port()
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
            "QUEUE_SERVER_DATABASE_URL": database_url,
            **extra,
        }
        data_dir = tmp_path / f"data-{port}"
        proc = subprocess.Popen(
            [str(BIN), "serve", "--port", str(port), "--workers", "2", "--data-dir", str(data_dir)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        started.append(proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                if web.get(f"{url}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not become ready"
            time.sleep(0.2)
        key_file = data_dir / "admin.key"
        return url, key_file.read_text().strip() if key_file.exists() else "", proc

    yield start
    for proc in started:
        proc.send_signal(signal.SIGINT)
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()


def _by_name(spans: list[ReceivedSpan], name: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.name == name and s.kind == 2]  # SPAN_KIND_SERVER


@pytest.mark.slow
def test_the_server_exports_spans_of_the_enqueue_acquire_and_complete(serve: object) -> None:
    with otlp_receiver() as (endpoint, receiver):
        url, admin_key, proc = serve(  # type: ignore[operator]
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
                "OTEL_BSP_SCHEDULE_DELAY": "100",
                "OTEL_SERVICE_NAME": "queue-server-under-test",
            }
        )
        with web.client(base_url=url, headers={"Authorization": f"Bearer {admin_key}"}) as admin:
            api = setup_tenant(url, admin, "acme")
        parents = iter(f"{n:016x}" for n in range(1, 10))

        def traced() -> dict[str, str]:
            return {"traceparent": f"00-{TRACE_ID}-{next(parents)}-01"}

        enqueued = api.worker.post(
            "/v1/tenants/acme/queues/q/items",
            json={"payload": {"n": 1}},
            headers={"Idempotency-Key": uuid.uuid4().hex, **traced()},
        )
        assert enqueued.status_code == 201
        item_id = enqueued.json()["item_id"]
        acquired = api.worker.post(
            "/v1/tenants/acme/queues/q/leases",
            json={"worker": "w1", "lease_ttl": 30},
            headers=traced(),
        )
        (lease,) = acquired.json()["leases"]
        assert lease["trace"]["traceparent"] == f"00-{TRACE_ID}-{1:016x}-01"
        completed = api.worker.post(
            f"/v1/tenants/acme/items/{item_id}/complete",
            json={"worker": "w1", "fence": lease["fence"], "result": {"ok": True}},
            headers={"Idempotency-Key": uuid.uuid4().hex, **traced()},
        )
        assert completed.status_code == 200
        batch = api.worker.post(
            "/v1/tenants/acme/queues/b/items:batch",
            json={"items": [{"payload": 1}, {"payload": 2}]},
            headers={"Idempotency-Key": uuid.uuid4().hex, **traced()},
        )
        assert batch.status_code == 201
        batch_ids = [item["item_id"] for item in batch.json()["items"]]

        def all_there(spans: list[ReceivedSpan]) -> bool:
            names = (ENQUEUE, ACQUIRE, COMPLETE, BATCH)
            return all(_by_name(spans, name) for name in names) and any(
                s.attributes.get("db.system.name", s.attributes.get("db.system")) == "postgresql"
                for s in spans
            )

        spans = receiver.wait_for(all_there)
        served = process_tree(proc.pid)
        serving = _serving(served)

    assert receiver.paths
    for name, fence in ((ENQUEUE, 0), (ACQUIRE, 1), (COMPLETE, 1)):
        (span,) = _by_name(spans, name)
        assert span.trace_id == TRACE_ID, name
        assert span.service == "queue-server-under-test"
        assert span.attributes["queue_server.tenant"] == "acme", name
        assert span.attributes["queue_server.queue"] == "q", name
        assert span.attributes["queue_server.item_id"] == item_id, name
        assert span.attributes["queue_server.fence"] == fence, name
    (acquire,) = _by_name(spans, ACQUIRE)
    assert acquire.attributes["queue_server.item_ids"] == [item_id]
    assert acquire.attributes["queue_server.fences"] == [1]
    (batched,) = _by_name(spans, BATCH)
    assert batched.trace_id == TRACE_ID
    assert batched.attributes["queue_server.queue"] == "b"
    assert batched.attributes["queue_server.item_ids"] == batch_ids
    assert batched.attributes["queue_server.fences"] == [0, 0]
    assert "queue_server.item_id" not in batched.attributes
    # Each request's database round trips are its children, in its trace.
    request_ids = {
        s.span_id for name in (ENQUEUE, ACQUIRE, COMPLETE) for s in _by_name(spans, name)
    }
    database = [s for s in spans if s.kind == 3 and s.parent_span_id in request_ids]  # CLIENT
    assert {s.trace_id for s in database} == {TRACE_ID}
    assert len({s.parent_span_id for s in database}) == 3
    # Set up in each worker process after the fork, never in the supervisor.
    supervisor, *children = served
    workers = [pid for pid in children if pid in serving]
    assert len(workers) == 2
    assert _mapped(supervisor) == set()
    for pid in workers:
        assert _mapped(pid) == set(TRACING_LIBRARIES), pid


@pytest.mark.slow
def test_without_an_endpoint_no_process_loads_the_tracing_stack(serve: object) -> None:
    url, _, proc = serve({})  # type: ignore[operator]
    assert web.get(f"{url}/healthz").status_code == 200
    served = process_tree(proc.pid)
    assert len(_serving(served)) == 2
    for pid in served:
        assert _mapped(pid) == set(), pid


_APP_PROBE = """
import json, sys
from queue_server.app import create_app
from queue_server.settings import Settings
app = create_app(Settings(), "postgresql://nobody@127.0.0.1:1/none")
stack, layers = app.build_middleware_stack(), []
while stack is not None and len(layers) < 50:
    layers.append(type(stack).__module__ + "." + type(stack).__name__)
    stack = getattr(stack, "app", None)
print(json.dumps({
    "layers": layers,
    "modules": sorted(m for m in sys.modules if m.startswith("opentelemetry")),
}))
"""

_FASTAPI_PROBE = """
import json, sys
import fastapi
print(json.dumps(sorted(m for m in sys.modules if m.startswith("opentelemetry"))))
"""


def _probe(source: str, env: dict[str, str], tmp_path: Path) -> object:
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", source],
        env={**base, "QUEUE_SERVER_DATA_DIR": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_without_an_endpoint_the_app_has_no_tracing_middleware_and_imports(
    tmp_path: Path,
) -> None:
    off = _probe(_APP_PROBE, {}, tmp_path)
    on = _probe(_APP_PROBE, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}, tmp_path)
    fastapi_alone = _probe(_FASTAPI_PROBE, {}, tmp_path)
    assert isinstance(off, dict)
    assert isinstance(on, dict)
    traced_layers = {
        "opentelemetry.instrumentation.asgi.OpenTelemetryMiddleware",
        "queue_server.infra.tracing.SpanAttributes",
    }
    assert traced_layers <= set(on["layers"])
    assert not any("opentelemetry" in layer or "tracing" in layer for layer in off["layers"])
    # The same middleware as without tracing (the instrumentation nests a second Starlette
    # error middleware inside its own), and the lean path inside the instrumentation.
    untraced = [
        layer
        for layer in on["layers"]
        if not layer.startswith("opentelemetry.") and layer not in traced_layers
    ]
    assert untraced == [off["layers"][0], *off["layers"]]
    assert on["layers"].index("queue_server.api.hot.LeasePath") > on["layers"].index(
        "opentelemetry.instrumentation.asgi.OpenTelemetryMiddleware"
    )
    # Off: no module of OpenTelemetry beyond the API FastAPI itself imports.
    assert off["modules"] == fastapi_alone
    assert any(m.startswith("opentelemetry.sdk") for m in on["modules"])
