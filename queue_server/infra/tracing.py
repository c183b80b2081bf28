"""OpenTelemetry tracing: on in a process only when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, read once when the process starts serving.

When on, each process sets up its own tracer provider (a server forked by `serve --workers`
does it in each worker, never before the fork), with a batch processor and the OTLP/HTTP
exporter configured by the standard `OTEL_*` variables; psycopg is instrumented (a span per
database round trip) and the app gets the FastAPI instrumentation (a span per request,
also on the lease routes' lean path) plus `SpanAttributes` below. When off, this module
imports nothing of OpenTelemetry's SDK, exporter or instrumentations and installs nothing:
the request path is exactly what it is without tracing. docs/observability.md says what
each span holds.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from fastapi import FastAPI
    from opentelemetry.trace import Span, Tracer

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
# Span attributes of this server's own (docs/observability.md).
TENANT = "queue_server.tenant"
QUEUE = "queue_server.queue"
ITEM_ID = "queue_server.item_id"
FENCE = "queue_server.fence"
ITEM_IDS = "queue_server.item_ids"
FENCES = "queue_server.fences"
# A response body larger than this is not read for attributes (a page of items).
_MAX_ANSWER = 256 * 1024

_configured = False


def enabled() -> bool:
    """Whether this process exports spans: an OTLP endpoint is configured."""
    return any(os.environ.get(name) for name in ENDPOINT_VARIABLES)


def configure(service_name: str, *, database: bool = True) -> bool:
    """Set up this process's tracer provider and (with `database`) the psycopg
    instrumentation, once; False (and nothing imported) when tracing is off.
    `OTEL_SERVICE_NAME` overrides the name."""
    global _configured
    if not enabled():
        return False
    if _configured:
        return True
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: service_name}
    provider = TracerProvider(resource=Resource.create(attributes))
    # The exporter reads the endpoint, headers, timeout and compression from OTEL_*; the
    # processor its batch size and delay (OTEL_BSP_*). Spans left at exit are flushed.
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    if database:
        PsycopgInstrumentor().instrument(tracer_provider=provider)
    _log_trace_ids()
    _configured = True
    return True


def _log_trace_ids() -> None:
    """Every log line written inside a span ends with ` trace_id=<32 hex>`: the logs stay
    plain text, and a line of a request finds its trace (and the trace its lines)."""
    from opentelemetry import trace

    make_record = logging.getLogRecordFactory()

    def with_trace_id(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        context = trace.get_current_span().get_span_context()
        if context.is_valid and "trace_id=" not in str(record.msg):
            record.msg = f"{record.msg} trace_id={trace.format_trace_id(context.trace_id)}"
        return record

    logging.setLogRecordFactory(with_trace_id)


def instrument_app(app: FastAPI) -> None:
    """The FastAPI instrumentation (outermost: it sees every request, the lean path's too)
    and the attributes of this server on each request's span."""
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    app.add_middleware(SpanAttributes)
    # The per-message receive/send spans say nothing the request's span does not.
    FastAPIInstrumentor.instrument_app(app, exclude_spans=["receive", "send"])


def tracer(name: str) -> Tracer | None:
    """A tracer of the process's provider, or None when tracing is off."""
    if not enabled():
        return None
    from opentelemetry import trace

    return trace.get_tracer(name)


@contextlib.contextmanager
def span(tracer: Tracer | None, name: str, **attributes: Any) -> Iterator[Span | None]:
    """A span of `tracer` as the current one, or nothing at all without a tracer."""
    if tracer is None:
        yield None
        return
    with tracer.start_as_current_span(name, attributes=attributes) as current:
        yield current


class SpanAttributes:
    """ASGI middleware (installed only with tracing on): puts the tenant, queue, item id and
    fence of each request on its span, from its path and its JSON answer (an item, a lease
    list, a batch)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from opentelemetry import trace

        current = trace.get_current_span()
        if not current.is_recording():
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        json_answer = [False]

        def annotate() -> None:
            if current.is_recording():
                params = scope.get("path_params") or {}
                current.set_attributes(_attributes(params, b"".join(chunks)))

        async def keep(message: Message) -> None:
            if message["type"] == "http.response.start":
                json_answer[0] = any(
                    name == b"content-type" and value.startswith(b"application/json")
                    for name, value in message.get("headers", ())
                )
            elif message["type"] == "http.response.body":
                if json_answer[0] and sum(map(len, chunks)) < _MAX_ANSWER:
                    chunks.append(message.get("body", b""))
                if not message.get("more_body", False):
                    # Before the last part goes: the instrumentation ends the span with it.
                    annotate()
            await send(message)

        try:
            await self.app(scope, receive, keep)
        finally:
            annotate()  # no answer sent (the client left): what the path says


def _attributes(params: dict[str, Any], body: bytes) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, key in (("tenant", TENANT), ("queue", QUEUE), ("item_id", ITEM_ID)):
        if isinstance(params.get(name), str):
            out[key] = params[name]
    try:
        answer = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict):
        return out
    listed = answer.get("leases", answer.get("items"))
    if isinstance(listed, list):
        rows = [row for row in listed if isinstance(row, dict) and "item_id" in row]
        out[ITEM_IDS] = [str(row["item_id"]) for row in rows]
        out[FENCES] = [int(row.get("fence", 0)) for row in rows]
        if len(rows) == 1:
            out[ITEM_ID], out[FENCE] = out[ITEM_IDS][0], out[FENCES][0]
        if rows and isinstance(rows[0].get("queue"), str):
            out.setdefault(QUEUE, rows[0]["queue"])
        return out
    if "item_id" in answer:
        out[ITEM_ID] = str(answer["item_id"])
    if isinstance(answer.get("fence"), int):
        out[FENCE] = answer["fence"]
    for name, key in (("tenant", TENANT), ("queue", QUEUE)):
        if isinstance(answer.get(name), str):
            out.setdefault(key, answer[name])
    return out
