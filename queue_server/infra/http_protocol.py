"""uvicorn's httptools protocol, with the limits a reverse proxy would put in front of it.

- A request it cannot parse (a URL over its parser's limit, broken framing) is answered
  with a problem document: every error of this API is `application/problem+json`
  (uvicorn's own answer is plain text).
- Slow and idle clients are cut off: a connection has `header_timeout` seconds to send
  each request's headers (from its first byte, or from the connection's opening: an idle
  new connection is closed then) and `body_timeout` more for its body; between requests,
  `keep_alive` seconds of silence close it. A long poll is not cut: the clock stops once
  the request has arrived.
- At most `max_connections` open connections per process: one more is answered 503
  `server-busy` and closed.

The limits are settings (`QUEUE_SERVER_HEADER_TIMEOUT`, ...), set for the process when its
app is built (`use_limits`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from queue_server import views


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout: float = 20.0
    body_timeout: float = 60.0
    keep_alive: float = 5.0
    max_connections: int = 1024


def _problem(status: int, title: str, detail: str, code: str) -> bytes:
    body = views.dumps(
        {"type": "about:blank", "title": title, "status": status, "detail": detail, "code": code}
    )
    return b"".join(
        [
            STATUS_LINE[status],
            b"content-type: application/problem+json\r\n",
            b"content-length: " + str(len(body)).encode("ascii") + b"\r\n",
            b"connection: close\r\n",
            b"\r\n",
            body,
        ]
    )


MALFORMED = _problem(
    400,
    "Bad Request",
    "The request could not be parsed (for example, its URL is too long).",
    "malformed-request",
)
BUSY = _problem(
    503,
    "Service Unavailable",
    "This server process has as many open connections as it takes; retry shortly.",
    "server-busy",
)


class ProblemHttpToolsProtocol(HttpToolsProtocol):
    limits: ClassVar[ConnectionLimits] = ConnectionLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = int(self.limits.keep_alive) or 1
        self._receiving: asyncio.TimerHandle | None = None

    # -- the receive clock --------------------------------------------------------------

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._receiving = self.loop.call_later(seconds, self._too_slow)

    def _disarm(self) -> None:
        if self._receiving is not None:
            self._receiving.cancel()
            self._receiving = None

    def _too_slow(self) -> None:
        self._receiving = None
        if not self.transport.is_closing():
            self.transport.close()

    # -- uvicorn's callbacks --------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            transport.write(BUSY)
            transport.close()
            return
        self._arm(self.limits.header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._receiving is None:  # a connection's first request: its clock runs already
            self._arm(self.limits.header_timeout)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._arm(self.limits.body_timeout)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()

    def send_400_response(self, msg: str) -> None:
        self.transport.write(MALFORMED)
        self.transport.close()


def use_limits(limits: ConnectionLimits) -> None:
    """The limits of every connection this process accepts from now on."""
    ProblemHttpToolsProtocol.limits = limits
