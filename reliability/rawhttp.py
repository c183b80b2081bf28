"""A raw HTTP/1.1 client over one socket, for requests no well-behaved client sends:
bodies far past the server's limit (with a Content-Length or chunked), headers of
100 KB, bytes that are not UTF-8.

It stops sending as soon as the server answers (a server that refuses a 10 MB
body early answers and closes while the client is still sending), then reads the
answer. Loopback only; one connection per request, ``Connection: close``.
"""

from __future__ import annotations

import contextlib
import select
import socket
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

__all__ = ["RawAnswer", "chunked", "raw_request", "repeat_bytes"]

CHUNK = 64 * 1024


@dataclass
class RawAnswer:
    """What came back: ``status`` is None when the connection ended without an answer."""

    status: int | None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    seconds: float = 0.0
    sent_bytes: int = 0
    #: Why sending stopped early, if it did ("answered", "EPIPE", "ECONNRESET", "timeout").
    stopped: str | None = None
    error: str | None = None

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")

    @property
    def is_problem(self) -> bool:
        return self.content_type.startswith("application/problem+json")


def repeat_bytes(total: int, piece: bytes = b"x", size: int = CHUNK) -> Iterator[bytes]:
    """``total`` bytes of ``piece`` repeated, in pieces of ``size`` (never all in memory)."""
    block = (piece * (size // len(piece) + 1))[:size]
    left = total
    while left > 0:
        n = min(size, left)
        yield block[:n]
        left -= n


def chunked(pieces: Iterable[bytes]) -> Iterator[bytes]:
    """HTTP/1.1 chunked transfer coding of ``pieces`` (with the final empty chunk)."""
    for piece in pieces:
        if piece:
            yield f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    yield b"0\r\n\r\n"


def raw_request(
    host: str,
    port: int,
    method: str,
    path: str,
    *,
    headers: Mapping[str, str | bytes] | None = None,
    body: bytes | Iterable[bytes] = b"",
    content_length: int | None = None,
    is_chunked: bool = False,
    half_close: bool = False,
    timeout: float = 15.0,
) -> RawAnswer:
    """Send one request (``body`` as bytes or an iterable of wire pieces) and read the answer.

    With ``is_chunked`` the pieces must already be chunk-coded (see :func:`chunked`)
    and ``Transfer-Encoding: chunked`` is sent; otherwise ``Content-Length`` is
    ``content_length`` or the length of a bytes body. With ``half_close`` the client
    shuts its sending side once the pieces are sent (a body announced longer than it is
    then never arrives in full), and reads what comes back.
    """
    lines = [f"{method} {path} HTTP/1.1".encode(), f"Host: {host}:{port}".encode()]
    lines.append(b"Connection: close")
    for name, value in (headers or {}).items():
        raw = value if isinstance(value, bytes) else value.encode("latin-1")
        lines.append(name.encode("latin-1") + b": " + raw)
    if is_chunked:
        lines.append(b"Transfer-Encoding: chunked")
    else:
        length = content_length
        if length is None:
            length = len(body) if isinstance(body, bytes) else 0
        lines.append(f"Content-Length: {length}".encode())
    head = b"\r\n".join(lines) + b"\r\n\r\n"
    pieces: Iterable[bytes] = [body] if isinstance(body, bytes) else body
    answer = RawAnswer(status=None)
    start = time.monotonic()
    deadline = start + timeout
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        answer.error = f"connect: {exc}"
        answer.seconds = time.monotonic() - start
        return answer
    with sock:
        try:
            _send(sock, head)
            answer.sent_bytes = len(head)
            for piece in pieces:
                if _readable(sock):
                    answer.stopped = "answered"
                    break
                for offset in range(0, len(piece), CHUNK):
                    _send(sock, piece[offset : offset + CHUNK])
                    answer.sent_bytes += min(CHUNK, len(piece) - offset)
                if time.monotonic() > deadline:
                    answer.stopped = "timeout"
                    break
        except BrokenPipeError:
            answer.stopped = "EPIPE"
        except ConnectionResetError:
            answer.stopped = "ECONNRESET"
        except TimeoutError:
            answer.stopped = "timeout"
        if half_close:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)
        _read_answer(sock, answer, deadline)
    answer.seconds = time.monotonic() - start
    return answer


def _send(sock: socket.socket, data: bytes) -> None:
    sock.sendall(data)


def _readable(sock: socket.socket) -> bool:
    ready, _, _ = select.select([sock], [], [], 0)
    return bool(ready)


def _read_answer(sock: socket.socket, answer: RawAnswer, deadline: float) -> None:
    data = b""
    try:
        while True:
            sock.settimeout(max(0.05, deadline - time.monotonic()))
            part = sock.recv(CHUNK)
            if not part:
                break
            data += part
            if _complete(data):
                break
    except (ConnectionResetError, BrokenPipeError) as exc:
        answer.error = type(exc).__name__
    except TimeoutError:
        answer.error = "read timeout"
    head, sep, rest = data.partition(b"\r\n\r\n")
    if not sep:
        if data and answer.error is None:
            answer.error = f"incomplete answer: {data[:80]!r}"
        return
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        answer.error = f"bad status line: {status_line[:80]!r}"
        return
    answer.status = int(parts[1])
    for line in header_lines:
        name, _, value = line.partition(":")
        answer.headers[name.strip().lower()] = value.strip()
    answer.body = rest


def _complete(data: bytes) -> bool:
    head, sep, rest = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length" and value.strip().isdigit():
            return len(rest) >= int(value.strip())
    return False
