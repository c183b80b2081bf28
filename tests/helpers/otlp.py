"""A local OTLP/HTTP receiver: what an OpenTelemetry collector would be, on 127.0.0.1 in a
thread. It decodes each `/v1/traces` export (protobuf `ExportTraceServiceRequest`) into
plain `ReceivedSpan`s."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]
    service: str
    status_code: int
    links: list[str]  # the trace ids linked to


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, which) if which else None


class Receiver:
    """The spans received so far, in arrival order."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.paths: list[str] = []
        self._lock = threading.Lock()

    def add(self, path: str, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        received = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            kind=span.kind,
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            service=str(resource.get("service.name", "")),
                            status_code=span.status.code,
                            links=[link.trace_id.hex() for link in span.links],
                        )
                    )
        with self._lock:
            self.paths.append(path)
            self.spans.extend(received)

    def wait_for(
        self, found: Callable[[list[ReceivedSpan]], bool], timeout: float = 20
    ) -> list[ReceivedSpan]:
        """The spans once `found` says they are all there (else AssertionError)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                spans = list(self.spans)
            if found(spans):
                return spans
            if time.monotonic() > deadline:
                raise AssertionError(f"spans not received in time: {[s.name for s in spans]}")
            time.sleep(0.05)


@contextmanager
def otlp_receiver() -> Iterator[tuple[str, Receiver]]:
    """(its base URL for OTEL_EXPORTER_OTLP_ENDPOINT, the receiver)."""
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path == "/v1/traces":
                receiver.add(self.path, body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
