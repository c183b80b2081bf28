"""Each handler's span, for `Worker`, `AsyncWorker` and `queue-server work`.

OpenTelemetry is optional here: the SDK imports `opentelemetry` (the API only) when a
worker starts, and without it a worker runs exactly as it always did, with no span. With it,
each handler runs inside a span of the application's tracer provider (the global one unless
the worker is given another), a child of the item's enqueue context (the lease's `trace`),
or, for a context enqueued longer ago than `parent_within` seconds, the first span of a new
trace with a link to it. The span records the outcome (`queue_server.outcome`) and the
handler's exception. Without a configured provider the API's spans record nothing, but the
enqueue's context still travels on: `traceparent()` names it for a child process.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from queue_server.client.models import Lease

#: A context enqueued longer ago than this (seconds) is linked to, not a parent.
DEFAULT_PARENT_WITHIN = 3600.0


class HandlerSpans:
    """Starts and ends the span of each handler; `None` from `create` when tracing is
    unavailable (no opentelemetry installed)."""

    def __init__(
        self,
        api: Any,
        propagator: Any,
        tracer: Any,
        parent_within: float,
        *,
        unset: tuple[type, ...] = (),
    ) -> None:
        self._api = api
        self._propagator = propagator
        self._tracer = tracer
        self.parent_within = parent_within
        # The global providers that record nothing (none set yet, or a no-op one): under
        # them an item without a trace gets no span at all. Empty for a worker given a
        # provider of its own.
        self._unset = unset
        self.recording = False
        self.refresh()

    def refresh(self) -> None:
        """Look whether a provider that records is set, once per acquire rather than per
        item (the look reads the environment: a tenth of a no-op item's CPU): a provider
        set while the worker runs is used from the next acquire on. Once set, one stays."""
        if not self.recording:
            self.recording = not isinstance(self._api.get_tracer_provider(), self._unset)

    @classmethod
    def create(
        cls, tracer_provider: Any = None, parent_within: float = DEFAULT_PARENT_WITHIN
    ) -> HandlerSpans | None:
        try:
            from opentelemetry import trace
            from opentelemetry.trace.propagation.tracecontext import (
                TraceContextTextMapPropagator,
            )
        except ImportError:
            return None
        from queue_server.client.version import __version__

        tracer = trace.get_tracer("queue_server.client", __version__, tracer_provider)
        unset = () if tracer_provider is not None else _unset_providers(trace)
        return cls(trace, TraceContextTextMapPropagator(), tracer, parent_within, unset=unset)

    def start(self, lease: Lease, queue: str, worker: str) -> Any:
        """The handler's span, started (not yet current); `None` for an item without a trace
        while no tracer provider is set: such a span would record nothing and carry no
        context on, and making it is most of a no-op item's tracing cost."""
        api = self._api
        if lease.trace is None and not self.recording:
            return None
        attributes: dict[str, Any] = {
            "messaging.system": "queue-server",
            "messaging.operation.type": "process",
            "messaging.destination.name": queue,
            "messaging.message.id": lease.item_id,
            "queue_server.queue": queue,
            "queue_server.item_id": lease.item_id,
            "queue_server.fence": lease.fence,
            "queue_server.acquisition_count": lease.acquisition_count,
            "queue_server.worker": worker,
        }
        parent = None
        links = []
        if lease.trace is not None:
            carrier = {"traceparent": lease.trace.traceparent}
            if lease.trace.tracestate is not None:
                carrier["tracestate"] = lease.trace.tracestate
            enqueued = self._propagator.extract(carrier)
            context = api.get_current_span(enqueued).get_span_context()
            if context.is_valid:
                attributes["queue_server.enqueue_age"] = lease.trace.age
                if lease.trace.age <= self.parent_within:
                    parent = enqueued
                else:
                    links.append(api.Link(context, {"queue_server.enqueue_age": lease.trace.age}))
        return self._tracer.start_span(
            f"process {queue}",
            context=parent if parent is not None else api.set_span_in_context(api.INVALID_SPAN),
            kind=api.SpanKind.CONSUMER,
            attributes=attributes,
            links=links,
        )

    @contextlib.contextmanager
    def current(self, span: Any) -> Iterator[None]:
        """`span` as the current span while the handler runs (its own spans are children)."""
        with self._api.use_span(span, end_on_exit=False, record_exception=False):
            yield

    def end(self, span: Any, outcome: str, failure: BaseException | None) -> None:
        span.set_attribute("queue_server.outcome", outcome)
        if failure is not None:
            span.record_exception(failure)
            span.set_status(self._api.Status(self._api.StatusCode.ERROR, str(failure)[:256]))
        span.end()

    def traceparent(self, span: Any) -> str | None:
        """The W3C traceparent naming `span` (for `TRACEPARENT` of a child process)."""
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=self._api.set_span_in_context(span))
        return carrier.get("traceparent")


def _unset_providers(trace: Any) -> tuple[type, ...]:
    """The API's global tracer providers that record nothing: the proxy before one is set,
    and the no-op one."""
    return tuple(
        t
        for t in (
            getattr(trace, "ProxyTracerProvider", None),
            getattr(trace, "NoOpTracerProvider", None),
        )
        if isinstance(t, type)
    )


def current_context() -> dict[str, str]:
    """The current span's W3C context as `traceparent`/`tracestate` (empty without one, or
    without opentelemetry): what a handler hands a child process as TRACEPARENT."""
    try:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        return {}
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier


@contextlib.contextmanager
def current(spans: HandlerSpans | None, span: Any) -> Iterator[None]:
    """The face's side of a `Run`: the handler's span current while it runs, if any."""
    if spans is None or span is None:
        yield
        return
    with spans.current(span):
        yield
