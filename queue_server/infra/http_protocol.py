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
  `server-busy` and closed. One client address holds at most its share of them
  (`max_connections_per_address`, by default a quarter, at least 8): past it, that
  address's new connections are answered the same, while other addresses are still
  served. Behind a reverse proxy every connection comes from the proxy: raise the share
  to `max_connections` there (the proxy limits its clients).
- A request head (its request line and headers) is counted while it arrives: past
  `max_head_bytes` it is answered 431 `headers-too-large` and the connection closed.
  The parser grows a header's value by concatenation as its bytes come, so a head of tens
  of megabytes held to the end would exhaust the process (the ASGI limit on the headers,
  `api/middleware.py`, sees them only once all have arrived).
- A response's head and its body leave in one write: uvicorn writes each as it comes,
  which costs a second send(2) here and a second wake-up for the client that reads it
  (profiled: an eighth of the lease routes' CPU in the server was those two writes).

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
    # Open connections one client address may hold; None: max(8, max_connections // 4).
    max_connections_per_address: int | None = None
    # The headers' own limit (api/middleware.py: 32 KiB of names and values, 100 fields)
    # with room for the request line and the separators: anything larger is refused
    # while it arrives, before the parser has held it.
    max_head_bytes: int = 64 * 1024

    @property
    def address_share(self) -> int:
        if self.max_connections_per_address is not None:
            return self.max_connections_per_address
        return max(8, self.max_connections // 4)


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
HEAD_TOO_LARGE = _problem(
    431,
    "Request header fields too large",
    "The request line and headers exceed the bytes this server reads before a body.",
    "headers-too-large",
)
BUSY = _problem(
    503,
    "Service Unavailable",
    "This server process has as many open connections as it takes; retry shortly.",
    "server-busy",
)
ADDRESS_BUSY = _problem(
    503,
    "Service Unavailable",
    "This client address has as many open connections as one address may hold here;"
    " close some or retry shortly.",
    "server-busy",
)


class _HeldHead:
    """A connection's transport for one response: its first write (the head) is held
    until the next (the body), and both go out in one write.

    A head with no body write in the same turn of the event loop (a streamed response
    waiting for its first chunk) leaves at the end of that turn; closing writes it first.
    Everything else is the connection's transport itself.
    """

    __slots__ = ("_held", "_transport", "_wrote")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._held: bytes | None = None
        self._wrote = False

    def write(self, data: bytes) -> None:
        if self._held is not None:
            data = self._held + data
            self._held = None
        elif not self._wrote:
            self._wrote = True
            self._held = bytes(data)
            asyncio.get_running_loop().call_soon(self._release)
            return
        self._transport.write(data)

    def _release(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            if not self._transport.is_closing():
                self._transport.write(held)

    def close(self) -> None:
        self._release()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class ProblemHttpToolsProtocol(HttpToolsProtocol):
    limits: ClassVar[ConnectionLimits] = ConnectionLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = int(self.limits.keep_alive) or 1
        self._receiving: asyncio.TimerHandle | None = None
        # Bytes received since the current request head began; None once it is complete.
        self._head_bytes: int | None = 0
        # A head ended in the chunk being read.
        self._head_ended = False

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

    def data_received(self, data: bytes) -> None:
        # A chunk is counted as a head's when a head was awaited or arriving as it came, and
        # no head ended in it: a chunk that ends a head and carries a body (or a whole
        # request, whose end makes the next head awaited) is not the head's, nor is the
        # chunk that ends a body and may begin the next head. A head past the limit grew by
        # at most two chunks.
        heading = self._head_bytes is not None
        self._head_ended = False
        super().data_received(data)
        if heading and not self._head_ended and self._head_bytes is not None:
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_head_bytes and not self.transport.is_closing():
                self._head_bytes = None
                self.transport.write(HEAD_TOO_LARGE)
                self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            transport.write(BUSY)
            transport.close()
            return
        # Counted over the process's open connections (this one included), not kept in a
        # table of its own: nothing to leak, and a scan of at most max_connections.
        host = self.client[0] if self.client else None
        if host is not None:
            share = self.limits.address_share
            same = sum(
                1 for c in self.connections if (getattr(c, "client", None) or (None,))[0] == host
            )
            if same > share:
                transport.write(ADDRESS_BUSY)
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
        self._head_bytes = None
        self._head_ended = True
        self._arm(self.limits.body_timeout)
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope:  # an upgrade makes no cycle
            cycle.transport = _HeldHead(self.transport)  # type: ignore[assignment]

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()
        self._head_bytes = 0

    def send_400_response(self, msg: str) -> None:
        self.transport.write(MALFORMED)
        self.transport.close()


def use_limits(limits: ConnectionLimits) -> None:
    """The limits of every connection this process accepts from now on."""
    ProblemHttpToolsProtocol.limits = limits
