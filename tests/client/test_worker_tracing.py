"""Each handler runs in its own span, on both worker faces: a child of the item's enqueue
context (a link when that context is too old), with the outcome and the exception; and
without opentelemetry installed a worker still works."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import uuid
from typing import Any

import psycopg
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode, format_span_id, format_trace_id

from queue_server.client import QueueClient
from tests.helpers.api import Api
from tests.helpers.faces import AnyJob, Face, wait_for_stop

Db = psycopg.Connection[dict[str, object]]

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


def enqueue_traced(api: Api, payload: object = None, **fields: object) -> str:
    response = api.worker.post(
        "/v1/tenants/acme/queues/q/items",
        json={"payload": payload, **fields},
        headers={"Idempotency-Key": uuid.uuid4().hex, "traceparent": TRACEPARENT},
    )
    assert response.status_code == 201, response.text
    item_id: str = response.json()["item_id"]
    return item_id


def spans_of(handler: Any, api: Api, face: Face) -> tuple[list[ReadableSpan], TracerProvider]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    worker = face.worker(api, "q", handler, name="w1", wait=0, tracer_provider=provider)
    worker.run(drain=True, handle_signals=False)
    return list(exporter.get_finished_spans()), provider


def process_span(spans: list[ReadableSpan]) -> ReadableSpan:
    (span,) = [s for s in spans if s.name == "process q"]
    return span


def test_a_handlers_span_is_a_child_of_the_enqueue_context(api: Api, face: Face) -> None:
    item_id = enqueue_traced(api, {"n": 1})
    tracer_of: list[TracerProvider] = []

    def handler(job: AnyJob) -> Any:
        # The handler's own spans are children of its span.
        with tracer_of[0].get_tracer("app").start_as_current_span("inside"):
            return {"ok": True}

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer_of.append(provider)
    worker = face.worker(api, "q", handler, name="w1", wait=0, tracer_provider=provider)
    assert worker.run(drain=True, handle_signals=False) == 1
    spans = list(exporter.get_finished_spans())
    span = process_span(spans)
    assert format_trace_id(span.context.trace_id) == TRACE_ID
    assert span.parent is not None
    assert format_span_id(span.parent.span_id) == PARENT_ID
    assert span.kind is SpanKind.CONSUMER
    assert span.links == ()
    attributes = dict(span.attributes or {})
    assert attributes["queue_server.item_id"] == item_id
    assert attributes["queue_server.fence"] == 1
    assert attributes["queue_server.outcome"] == "completed"
    assert attributes["messaging.destination.name"] == "q"
    (inside,) = [s for s in spans if s.name == "inside"]
    assert inside.parent is not None
    assert inside.parent.span_id == span.context.span_id


def test_a_handlers_span_carries_the_enqueue_contexts_tracestate(api: Api, face: Face) -> None:
    response = api.worker.post(
        "/v1/tenants/acme/queues/q/items",
        json={"payload": None},
        headers={
            "Idempotency-Key": uuid.uuid4().hex,
            "traceparent": TRACEPARENT,
            "tracestate": "vendor=abc,other=1",
        },
    )
    assert response.status_code == 201, response.text
    spans, _ = spans_of(lambda job: None, api, face)
    span = process_span(spans)
    assert format_trace_id(span.context.trace_id) == TRACE_ID
    assert dict(span.context.trace_state) == {"vendor": "abc", "other": "1"}


def test_a_failing_handlers_span_records_its_exception_and_outcome(api: Api, face: Face) -> None:
    enqueue_traced(api, max_acquisitions=1)  # one run: then quarantined

    def handler(job: AnyJob) -> Any:
        raise ValueError("the disk is full")

    spans, _ = spans_of(handler, api, face)
    span = process_span(spans)
    assert format_trace_id(span.context.trace_id) == TRACE_ID
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description == "the disk is full"  # the exception's own words
    assert (span.attributes or {})["queue_server.outcome"] == "triaged"
    (event,) = [e for e in span.events if e.name == "exception"]
    assert (event.attributes or {})["exception.type"] == "ValueError"
    assert (event.attributes or {})["exception.message"] == "the disk is full"


def test_a_context_enqueued_too_long_ago_is_linked_not_a_parent(
    api: Api, face: Face, db: Db
) -> None:
    item_id = enqueue_traced(api)
    # Enqueued two hours before its acquisition: past the worker's one hour.
    db.execute(
        "UPDATE work_items SET created_at = created_at - interval '2 hours' WHERE item_id = %s",
        [item_id],
    )
    spans, _ = spans_of(lambda job: None, api, face)
    span = process_span(spans)
    assert span.parent is None
    assert format_trace_id(span.context.trace_id) != TRACE_ID
    (link,) = span.links
    assert format_trace_id(link.context.trace_id) == TRACE_ID
    assert format_span_id(link.context.span_id) == PARENT_ID
    age = (span.attributes or {})["queue_server.enqueue_age"]
    assert isinstance(age, float)
    assert age >= 7200
    assert (link.attributes or {})["queue_server.enqueue_age"] == age  # the link says how old


def test_an_item_without_a_trace_context_gets_a_span_of_a_new_trace(api: Api, face: Face) -> None:
    api.enqueue()
    spans, _ = spans_of(lambda job: None, api, face)
    span = process_span(spans)
    assert span.parent is None
    assert span.links == ()
    assert (span.attributes or {})["queue_server.outcome"] == "completed"


_WITHOUT_OPENTELEMETRY = """
import sys
# As if opentelemetry were not installed: every import of it fails.
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError(f"no module named {name!r}")
        return None
sys.meta_path.insert(0, Refuse())
from queue_server.client import QueueClient, Worker
with QueueClient(sys.argv[1], sys.argv[2], tenant="acme") as qs:
    worker = Worker(qs, "q", lambda job: {"seen": job.payload}, wait=0)
    assert worker.spans is None
    handled = worker.run(drain=True, handle_signals=False)
assert not any(m.startswith("opentelemetry") for m in sys.modules), sorted(sys.modules)
print(handled)
"""


def test_a_worker_without_opentelemetry_installed_still_works(api: Api) -> None:
    item_id = enqueue_traced(api, {"n": 7})
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            textwrap.dedent(_WITHOUT_OPENTELEMETRY),
            api.url,
            api.keys["worker"],
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"
    item = api.worker.get(f"/v1/tenants/acme/items/{item_id}").json()
    assert item["state"] == "completed"
    assert item["result"] == {"seen": {"n": 7}}


def test_a_lost_leases_span_says_lost(api: Api, face: Face, db: Db) -> None:
    item_id = enqueue_traced(api)
    started = threading.Event()

    def handler(job: AnyJob) -> Any:
        started.set()
        wait_for_stop(job, 10)
        return "late result"

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    worker = face.worker(
        api, "q", handler, name="w1", lease_ttl=2, heartbeat_fraction=0.25, tracer_provider=provider
    )
    with QueueClient(api.url, api.keys["worker"], tenant=api.tenant) as qs:
        (lease,) = qs.acquire("q", worker="w1", lease_ttl=2)
        runner = threading.Thread(target=worker.process, args=(lease,))
        runner.start()
        assert started.wait(5)
        # The lease runs out and another worker takes it over: the heartbeat is refused.
        db.execute(
            "UPDATE work_items SET lease_expires_at = now() - interval '1 second'"
            " WHERE item_id = %s",
            (item_id,),
        )
        qs.acquire("q", worker="w2", lease_ttl=30)
        runner.join(10)
    span = process_span(list(exporter.get_finished_spans()))
    assert format_trace_id(span.context.trace_id) == TRACE_ID
    assert (span.attributes or {})["queue_server.outcome"] == "lost"


_UNSET_PROVIDER = """
import sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from queue_server.client import QueueClient, Worker, tracing

made = []
original = tracing.HandlerSpans.start
def start(self, *args, **kwargs):
    span = original(self, *args, **kwargs)
    made.append(span)
    return span
tracing.HandlerSpans.start = start

with QueueClient(sys.argv[1], sys.argv[2], tenant="acme") as qs:
    worker = Worker(qs, "q", lambda job: None, wait=0)
    if sys.argv[3] == "late":
        # A provider set after the worker was made: its items are recorded.
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
    handled = worker.run(drain=True, handle_signals=False)
if sys.argv[3] == "late":
    print(handled, len([s for s in exporter.get_finished_spans() if s.name == "process q"]))
else:
    print(handled, sum(s is None for s in made), sum(s is not None for s in made))
"""


def _run_unset(api: Api, mode: str) -> list[int]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_UNSET_PROVIDER), api.url, api.keys["worker"], mode],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
    )
    assert done.returncode == 0, done.stderr
    return [int(n) for n in done.stdout.split()]


def test_without_a_tracer_provider_only_a_traced_item_gets_a_span(api: Api) -> None:
    # Nothing would record an untraced item's span and no context continues through it:
    # none is made (most of a no-op item's tracing cost). A traced item's span still
    # carries its enqueue context on (TRACEPARENT of `queue-server work`'s command).
    api.enqueue()
    enqueue_traced(api, {"n": 2})
    assert _run_unset(api, "unset") == [2, 1, 1]
    # A provider set after the worker was made is used for the next untraced item.
    api.enqueue()
    assert _run_unset(api, "late") == [1, 1]
