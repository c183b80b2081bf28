"""ASGI middleware: the request-body limit (also for chunked bodies), bodies that never
fully arrived, and request metrics."""

from __future__ import annotations

import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from queue_server import errors, views
from queue_server.infra.metrics import Metrics

_PROBLEM_HEADERS = [(b"content-type", b"application/problem+json")]
# Generous for any client, small enough that headers cannot be used to exhaust memory.
MAX_HEADER_BYTES = 32 * 1024
MAX_HEADERS = 100


class _Truncated:
    """The client went away before its body was complete."""


TRUNCATED = _Truncated()


class Replay:
    """A request's receive that first hands out a body message already read from it."""

    __slots__ = ("_message", "_receive")

    def __init__(self, message: Message, receive: Receive) -> None:
        self._message: Message | None = message
        self._receive = receive

    async def __call__(self) -> Message:
        message = self._message
        if message is not None:
            self._message = None
            return message
        return await self._receive()


class BodyLimitAndMetrics:
    """Reads the whole body first (at most `max_body` bytes), so an oversized one is refused
    with 413 before any handler runs, whether or not it declared a Content-Length.

    A body that never fully arrived (the connection ended before its last byte) reaches
    no handler: a prefix of it may well be valid JSON, and acting on it would store what
    the client never finished sending. Nobody is left to answer; nothing is written.
    """

    def __init__(self, app: ASGIApp, *, max_body: int, metrics: Metrics, base_uri: str) -> None:
        self.app = app
        self.max_body = max_body
        self.metrics = metrics
        self.base_uri = base_uri
        # The labelled series of each (route, method, status), looked up once per process.
        self._series: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = [500]

        async def send_and_record(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            header_bytes = sum(len(name) + len(value) for name, value in scope["headers"])
            if header_bytes > MAX_HEADER_BYTES or len(scope["headers"]) > MAX_HEADERS:
                await self._refuse(
                    scope,
                    send_and_record,
                    errors.HeadersTooLargeError(
                        f"The request headers exceed {MAX_HEADER_BYTES} bytes or"
                        f" {MAX_HEADERS} fields."
                    ),
                )
                return
            body = await self._read_body(scope, receive)
            if isinstance(body, _Truncated):
                status[0] = errors.ClientDisconnectedError.status
                return
            if body is None:
                await self._refuse(
                    scope,
                    send_and_record,
                    errors.PayloadTooLargeError(
                        f"The request body exceeds {self.max_body} bytes.", max_bytes=self.max_body
                    ),
                )
                return
            message: Message = {"type": "http.request", "body": body, "more_body": False}
            await self.app(scope, Replay(message, receive), send_and_record)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", "unmatched")
            key = (template, scope["method"], status[0])
            series = self._series.get(key)
            if series is None:
                series = (
                    self.metrics.requests.labels(template, scope["method"], str(status[0])),
                    self.metrics.request_seconds.labels(template),
                )
                self._series[key] = series
            series[0].inc()
            series[1].observe(time.perf_counter() - started)

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes | _Truncated | None:
        """The whole body; None past the limit; TRUNCATED if the client left before its end."""
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    if int(value) > self.max_body:
                        return None
                except ValueError:
                    return None
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return TRUNCATED
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    async def _refuse(self, scope: Scope, send: Send, exc: errors.QueueServerError) -> None:
        """Answer before any handler runs (and close: the rest of the request is not read)."""
        body = views.dumps(errors.problem(exc, base_uri=self.base_uri, instance=scope["path"]))
        headers = [*_PROBLEM_HEADERS, (b"content-length", str(len(body)).encode())]
        headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": exc.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
