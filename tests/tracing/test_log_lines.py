"""Logs stay plain text: a line written while a request is handled ends with the trace id
of its span (tracing on) or of the caller's traceparent (the error line, tracing off)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import httpx
import pytest
from fastapi import FastAPI

from queue_server.api import problems
from queue_server.settings import Settings
from tests.helpers.otlp import otlp_receiver

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def _failing_app(settings: Settings) -> FastAPI:
    app = FastAPI()
    app.state.settings = settings
    problems.install(app)

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("the handler broke")

    return app


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_unhandled_error_line_names_the_callers_trace(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    transport = httpx.ASGITransport(app=_failing_app(settings), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        with caplog.at_level(logging.ERROR, logger="queue_server.api.problems"):
            traced = await client.get("/boom", headers={"traceparent": TRACEPARENT})
            untraced = await client.get("/boom", headers={"traceparent": "not-one"})
    assert traced.status_code == untraced.status_code == 500
    first, second = [r.getMessage() for r in caplog.records]
    assert first == f"unhandled error on GET /boom trace_id={TRACE_ID}"
    assert second == "unhandled error on GET /boom"


_IN_A_SPAN = """
import logging, os
from opentelemetry import trace
from queue_server.infra import tracing
assert tracing.configure("test", database=False)
logging.basicConfig(level=logging.INFO, format="%(message)s")
log = logging.getLogger("queue_server.test")
with trace.get_tracer("test").start_as_current_span("request") as span:
    log.info("inside %s", "a request")
    print(trace.format_trace_id(span.get_span_context().trace_id))
log.info("outside")
"""


def test_with_tracing_on_each_line_of_a_span_ends_with_its_trace_id() -> None:
    with otlp_receiver() as (endpoint, _):
        done = subprocess.run(
            [sys.executable, "-c", _IN_A_SPAN],
            env={
                **{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
                "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            },
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 0, done.stderr
    trace_id = done.stdout.strip()
    lines = done.stderr.splitlines()
    assert f"inside a request trace_id={trace_id}" in lines
    assert "outside" in lines
