"""The SDK's one connection to the server: the only SDK module that opens connections, to the
queue server's own API at the client's base URL.

The clients (`QueueClient`, `AsyncQueueClient`) get their connection pool from
`connect` / `connect_async` and name the HTTP library's types through this module;
no other module of the SDK imports it. Outbound HTTP to anything else (webhooks,
dependencies) goes through the transport broker, `queue_server.transport`.

A worker's hot calls (acquire, the batched complete and heartbeat, an item's own
outcome) take a lean path: `LeanPool` / `AsyncLeanPool`, keep-alive HTTP/1.1
connections to the same base URL that write one prebuilt request and read one
`Content-Length` (or chunked) answer. httpx costs about 200 us of CPU per request
(its request and response models, headers, h11's state machine, cookies, the pool's
locks); a no-op worker item cost a third of its CPU there, on the same cores the
server and PostgreSQL need. Everything unusual goes through httpx: a proxy from
the environment, a URL with credentials, a path or header that needs escaping, a
caller's own client, an event loop that is not asyncio's; an error answer is
handed on as an httpx response. Failures are httpx's own exception types, so the
retry rules and `ConnectionFailedError` are the same on both paths.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import os
import select
import socket
import ssl
from collections.abc import Callable, Coroutine, Iterator, Mapping
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx
import orjson

#: An answer of the queue server (httpx's response, or the lean path's `LeanResponse`).


class Response(Protocol):
    """What the SDK reads of an answer."""

    @property
    def status_code(self) -> int: ...

    @property
    def reason_phrase(self) -> str: ...

    @property
    def content(self) -> bytes: ...

    @property
    def text(self) -> str: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    def json(self, **kwargs: Any) -> Any: ...


# httpx logs every request it sends at INFO ("HTTP Request: POST ..."): an application that
# logs at INFO would log every lease, heartbeat and completion of its workers. The SDK's own
# requests are logged at DEBUG instead (shown only where httpx's DEBUG is on); the
# application's other httpx requests keep their INFO line.
_SDK_REQUEST: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "queue_server_sdk_request", default=False
)


class _SdkRequestsAtDebug(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or not _SDK_REQUEST.get():
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


_HTTPX_LOG = logging.getLogger("httpx")
if not any(isinstance(f, _SdkRequestsAtDebug) for f in _HTTPX_LOG.filters):
    _HTTPX_LOG.addFilter(_SdkRequestsAtDebug())


@contextlib.contextmanager
def sdk_request() -> Iterator[None]:
    """Marks the requests sent within it as the SDK's (logged at DEBUG, see above)."""
    token = _SDK_REQUEST.set(True)
    try:
        yield
    finally:
        _SDK_REQUEST.reset(token)


#: A connection pool to the queue server (the caller may pass one of their own).
HttpClient = httpx.Client
AsyncHttpClient = httpx.AsyncClient
#: The queue server could not be reached, or the connection failed mid-request.
TransportFailure = httpx.TransportError


def connect(url: str, *, timeout: float) -> HttpClient:
    """A connection pool to the queue server whose base URL is `url`."""
    return httpx.Client(base_url=url, timeout=timeout, verify=tls_context())


def connect_async(url: str, *, timeout: float) -> AsyncHttpClient:
    """The asyncio connection pool to the queue server whose base URL is `url`."""
    return httpx.AsyncClient(base_url=url, timeout=timeout, verify=tls_context())


def in_process(url: str, handle: Callable[[httpx.Request], httpx.Response]) -> HttpClient:
    """A client whose requests `handle` answers in this process, with no connection at all
    (the SDK's test double, client/testing.py)."""
    return httpx.Client(base_url=url, transport=httpx.MockTransport(handle))


def in_process_async(
    url: str, handle: Callable[[httpx.Request], Coroutine[None, None, httpx.Response]]
) -> AsyncHttpClient:
    """The asyncio client of `in_process`."""
    return httpx.AsyncClient(base_url=url, transport=httpx.MockTransport(handle))


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The verifying TLS context every client of this process shares (it is read-only).

    httpx would otherwise load the CA bundle for each new client (about 20 ms each); the
    environment's SSL_CERT_FILE and SSL_CERT_DIR are honoured as httpx's default does.
    """
    return httpx.create_ssl_context(trust_env=True)


# -- the lean path -------------------------------------------------------------------

# httpx honours these (trust_env); with any of them set, every call goes through httpx.
_PROXY_ENV = ("http_proxy", "https_proxy", "all_proxy")
# What a path may hold to be sent as written (httpx would escape anything else).
_PLAIN_PATH = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~/:@!$&'()*+,;=%"
)
# Idle connections kept per pool (httpx keeps 20).
_KEEP_IDLE = 20
_MAX_HEAD = 64 * 1024
_BODIED = frozenset({"POST", "PUT", "PATCH"})


class LeanResponse:
    """A successful answer read by the lean path: its status, headers and body."""

    __slots__ = ("content", "headers", "reason_phrase", "status_code")

    def __init__(
        self, status_code: int, reason_phrase: str, headers: dict[str, str], content: bytes
    ) -> None:
        self.status_code = status_code
        self.reason_phrase = reason_phrase
        self.headers = headers  # names in lower case
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self, **kwargs: Any) -> Any:
        return orjson.loads(self.content)


def _proxied() -> bool:
    return any(os.environ.get(name) or os.environ.get(name.upper()) for name in _PROXY_ENV)


class _Target:
    """Where the lean path connects, and the request head it repeats."""

    def __init__(self, url: str, headers: Mapping[str, str]) -> None:
        parts = urlsplit(url)
        self.tls = parts.scheme == "https"
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if self.tls else 80)
        self.prefix = parts.path.rstrip("/")
        common = {"Host": parts.netloc, "Accept": "*/*", **headers}
        self.head = "".join(f"{k}: {v}\r\n" for k, v in common.items()).encode("latin-1")

    @staticmethod
    def of(url: str, headers: Mapping[str, str]) -> _Target | None:
        """The target of `url`, or None when its calls must go through httpx."""
        try:
            parts = urlsplit(url)
            if (
                parts.scheme not in ("http", "https")
                or not parts.hostname
                or parts.username is not None
                or parts.query
                or parts.fragment
                or not _plain(parts.path)
                or any(not _plain_value(v) for v in (parts.netloc, *headers.values()))
                or _proxied()
            ):
                return None
            parts.port  # noqa: B018 - raises ValueError on a malformed port
        except ValueError:
            return None
        return _Target(url, headers)

    def request(
        self, method: str, path: str, body: Any, headers: Mapping[str, str] | None
    ) -> bytes | None:
        """The request's bytes, or None when it needs what only httpx does (escaping)."""
        if not _plain(path):
            return None
        extra = ""
        if headers:
            if not all(_plain_value(v) and _plain_value(k) for k, v in headers.items()):
                return None
            extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        start = f"{method} {self.prefix}{path} HTTP/1.1\r\n".encode("ascii")
        if body is None:
            data = b""
            tail = f"{extra}Content-Length: 0\r\n\r\n" if method in _BODIED else f"{extra}\r\n"
        else:
            data = _dumps(body)
            tail = f"{extra}Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
        return b"".join((start, self.head, tail.encode("latin-1"), data))


def _plain(path: str) -> bool:
    return path.isascii() and _PLAIN_PATH.issuperset(path)


def _plain_value(value: str) -> bool:
    return value.isascii() and value.isprintable()


def _dumps(body: Any) -> bytes:
    """The body as httpx writes it (compact, NaN refused); orjson when it can."""
    try:
        return orjson.dumps(body)
    except (TypeError, orjson.JSONEncodeError):
        import json

        return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


class _Head:
    """A response's status line and headers as read."""

    __slots__ = ("close", "headers", "length", "raw", "reason", "status")

    def __init__(self, block: bytes) -> None:
        lines = block.decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code, _, self.reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise httpx.RemoteProtocolError(f"not an HTTP/1.1 answer: {lines[0][:80]!r}")
        self.status = int(code)
        self.raw: list[tuple[str, str]] = []
        self.headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise httpx.RemoteProtocolError("a malformed header line")
            value = value.strip()
            self.raw.append((name, value))
            self.headers[name.lower()] = value
        connection = self.headers.get("connection", "").lower()
        self.close = "close" in connection or (
            version == "HTTP/1.0" and "keep-alive" not in connection
        )
        chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        length = self.headers.get("content-length")
        if chunked:
            self.length = -1
        elif length is not None and length.isdigit():
            self.length = int(length)
        elif self.status in (204, 304) or 100 <= self.status < 200:
            self.length = 0
        else:
            self.length = -2  # until the server closes

    def answer(self, body: bytes) -> Response:
        if self.status < 400:
            return LeanResponse(self.status, self.reason, self.headers, body)
        # An error answer: httpx's own response, so its problem is read as any other.
        return httpx.Response(self.status, headers=self.raw, content=body)


def _chunks(buf: bytearray, more: Any) -> tuple[bytes, bytearray]:
    """A chunked body from `buf` (read on with `more()`); what is left after it."""
    body = bytearray()
    while True:
        while b"\r\n" not in buf:
            buf += more()
        line, _, rest = bytes(buf).partition(b"\r\n")
        size = int(line.split(b";", 1)[0].strip() or b"0", 16)
        buf = bytearray(rest)
        if size == 0:
            while b"\r\n\r\n" not in b"\r\n" + buf:  # the trailers, then the blank line
                buf += more()
            _, _, rest = (b"\r\n" + bytes(buf)).partition(b"\r\n\r\n")
            return bytes(body), bytearray(rest)
        while len(buf) < size + 2:
            buf += more()
        body += buf[:size]
        buf = buf[size + 2 :]


class _Conn:
    __slots__ = ("buf", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def more(self) -> bytes:
        data = self.sock.recv(65536)
        if not data:
            raise httpx.RemoteProtocolError("the server closed the connection mid-answer")
        return data

    def stale(self) -> bool:
        """An idle connection the server closed (or wrote to) is not reused."""
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable) or bool(self.buf)


class LeanPool:
    """Keep-alive connections to the queue server for the blocking client's hot calls."""

    def __init__(self, target: _Target) -> None:
        self.target = target
        self._idle: list[_Conn] = []
        self._pid = os.getpid()

    @staticmethod
    def open(url: str, headers: Mapping[str, str]) -> LeanPool | None:
        target = _Target.of(url, headers)
        return None if target is None else LeanPool(target)

    def _connect(self, timeout: float) -> _Conn:
        target = self.target
        try:
            sock = socket.create_connection((target.host, target.port), timeout=timeout)
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(str(exc) or "connect timed out") from exc
        except OSError as exc:
            raise httpx.ConnectError(str(exc)) from exc
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if target.tls:
                sock = tls_context().wrap_socket(sock, server_hostname=target.host)
        except TimeoutError as exc:
            sock.close()
            raise httpx.ConnectTimeout(str(exc) or "TLS handshake timed out") from exc
        except OSError as exc:
            sock.close()
            raise httpx.ConnectError(str(exc)) from exc
        return _Conn(sock)

    def _take(self, timeout: float) -> _Conn:
        if os.getpid() != self._pid:
            # A forked child: the idle connections are its parent's; it opens its own.
            self._idle, self._pid = [], os.getpid()
        idle = self._idle
        while idle:
            try:
                conn = idle.pop()
            except IndexError:
                break
            if not conn.stale():
                conn.sock.settimeout(timeout)
                return conn
            conn.sock.close()
        return self._connect(timeout)

    def request(
        self,
        method: str,
        path: str,
        body: Any,
        headers: Mapping[str, str] | None,
        timeout: float,
    ) -> Response | None:
        """Send one request and read its answer; None when it must go through httpx."""
        data = self.target.request(method, path, body, headers)
        if data is None:
            return None
        conn = self._take(timeout)
        reusable = False
        try:
            try:
                conn.sock.sendall(data)
            except TimeoutError as exc:
                raise httpx.WriteTimeout(str(exc) or "write timed out") from exc
            except OSError as exc:
                raise httpx.WriteError(str(exc)) from exc
            try:
                head, body_bytes = self._read(conn, method)
            except TimeoutError as exc:
                raise httpx.ReadTimeout(str(exc) or "read timed out") from exc
            except (OSError, ValueError) as exc:
                raise httpx.ReadError(str(exc)) from exc
            reusable = not head.close and head.length != -2 and not conn.buf
        finally:
            if reusable and len(self._idle) < _KEEP_IDLE:
                self._idle.append(conn)
            else:
                conn.sock.close()
        return head.answer(body_bytes)

    @staticmethod
    def _read(conn: _Conn, method: str) -> tuple[_Head, bytes]:
        buf = conn.buf
        while True:
            end = buf.find(b"\r\n\r\n")
            while end < 0:
                if len(buf) > _MAX_HEAD:
                    raise httpx.RemoteProtocolError("the answer's head is too large")
                data = conn.sock.recv(65536)
                if not data:
                    raise httpx.RemoteProtocolError(
                        "Server disconnected without sending a response."
                    )
                buf += data
                end = buf.find(b"\r\n\r\n")
            head = _Head(bytes(buf[:end]))
            del buf[: end + 4]
            if head.status >= 200 or head.status == 101:
                break  # an interim 1xx answer is skipped
        if method == "HEAD":
            head.length = 0
        if head.length >= 0:
            while len(buf) < head.length:
                buf += conn.more()
            body = bytes(buf[: head.length])
            del buf[: head.length]
        elif head.length == -1:
            body, conn.buf = _chunks(buf, conn.more)
        else:
            while data := conn.sock.recv(65536):
                buf += data
            body = bytes(buf)
            buf.clear()
        return head, body

    def close(self) -> None:
        while self._idle:
            self._idle.pop().sock.close()


class _AsyncConn:
    __slots__ = ("loop", "reader", "writer")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.loop = loop
        self.reader = reader
        self.writer = writer

    async def more(self) -> bytes:
        data = await self.reader.read(65536)
        if not data:
            raise httpx.RemoteProtocolError("the server closed the connection mid-answer")
        return data

    def close(self) -> None:
        self.writer.close()


class AsyncLeanPool:
    """Keep-alive connections to the queue server for the asyncio client's hot calls."""

    def __init__(self, target: _Target) -> None:
        self.target = target
        self._idle: list[_AsyncConn] = []

    @staticmethod
    def open(url: str, headers: Mapping[str, str]) -> AsyncLeanPool | None:
        target = _Target.of(url, headers)
        return None if target is None else AsyncLeanPool(target)

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> _AsyncConn:
        target = self.target
        try:
            reader, writer = await asyncio.open_connection(
                target.host,
                target.port,
                ssl=tls_context() if target.tls else None,
                server_hostname=target.host if target.tls else None,
                limit=_MAX_HEAD,
            )
        except OSError as exc:
            raise httpx.ConnectError(str(exc)) from exc
        return _AsyncConn(loop, reader, writer)

    async def request(
        self,
        method: str,
        path: str,
        body: Any,
        headers: Mapping[str, str] | None,
        timeout: float,
    ) -> Response | None:
        """Send one request and read its answer; None when it must go through httpx."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # another event loop library (trio): httpx serves it
            return None
        data = self.target.request(method, path, body, headers)
        if data is None:
            return None
        conn: _AsyncConn | None = None
        reusable = False
        step = "connect"
        try:
            async with asyncio.timeout(timeout):
                conn = self._take(loop)
                if conn is None:
                    conn = await self._connect(loop)
                step = "write"
                conn.writer.write(data)
                step = "read"
                head, content = await self._read(conn, method)
            reusable = not head.close and head.length != -2
        except TimeoutError as exc:
            kind = {"connect": httpx.ConnectTimeout, "write": httpx.WriteTimeout}
            raise kind.get(step, httpx.ReadTimeout)(f"{step} timed out") from exc
        except asyncio.IncompleteReadError as exc:
            raise httpx.RemoteProtocolError(
                "Server disconnected without sending a response."
            ) from exc
        except asyncio.LimitOverrunError as exc:
            raise httpx.RemoteProtocolError("the answer's head is too large") from exc
        except (OSError, ValueError) as exc:
            error = httpx.WriteError if step == "write" else httpx.ReadError
            raise error(str(exc)) from exc
        finally:
            if conn is not None:
                if reusable and len(self._idle) < _KEEP_IDLE:
                    self._idle.append(conn)
                else:
                    conn.close()
        return head.answer(content)

    def _take(self, loop: asyncio.AbstractEventLoop) -> _AsyncConn | None:
        while self._idle:
            conn = self._idle.pop()
            if conn.loop is loop and not conn.reader.at_eof() and not conn.writer.is_closing():
                return conn
            if conn.loop is loop:  # one of another loop is only let go
                with contextlib.suppress(RuntimeError, OSError):
                    conn.close()
        return None

    @staticmethod
    async def _read(conn: _AsyncConn, method: str) -> tuple[_Head, bytes]:
        reader = conn.reader
        while True:
            head = _Head((await reader.readuntil(b"\r\n\r\n"))[:-4])
            if head.status >= 200 or head.status == 101:
                break
        if method == "HEAD":
            head.length = 0
        if head.length >= 0:
            return head, await reader.readexactly(head.length) if head.length else b""
        if head.length == -1:
            body = bytearray()
            while True:
                line = await reader.readuntil(b"\r\n")
                size = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if size == 0:
                    while (await reader.readuntil(b"\r\n")) != b"\r\n":
                        pass  # trailers
                    return head, bytes(body)
                body += await reader.readexactly(size)
                await reader.readexactly(2)
        return head, await reader.read()

    def close(self) -> None:
        while self._idle:
            conn = self._idle.pop()
            with contextlib.suppress(RuntimeError, OSError):
                conn.close()
