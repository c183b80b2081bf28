"""A real HTTP/1.1 receiver on 127.0.0.1 whose behaviour is chosen by the request path."""

from __future__ import annotations

import socket
import ssl
import struct
import threading
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

CHUNK = 16 * 1024


@dataclass(frozen=True)
class Seen:
    """One request as the receiver parsed it."""

    method: str
    target: str
    headers: dict[str, str]
    body: bytes


class Receiver:
    """Accepts real TCP connections and answers by path; counts every connection it accepts.

    /ok 200, /fail 500, /gone 410, /status?code=N, /redirect 302, /slow (stall before headers),
    /hold?s= (a 200 after s seconds),
    /reset (RST), /huge?n= (chunked body), /drip?n= (n bytes of a longer body, then stall).
    """

    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        """Bind to a random port and start accepting (over TLS when given a context)."""
        self._tls = tls
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.05)
        self.port: int = self._sock.getsockname()[1]
        self.connections = 0
        self.requests: list[Seen] = []
        # Set on shutdown so stalled handlers finish promptly.
        self.release = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept_loop, daemon=True)
        self._accepting.start()

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        """A URL on this receiver."""
        return f"http://{host}:{self.port}{path}"

    def close(self) -> None:
        """Stop accepting and release every stalled handler."""
        self.release.set()
        self._accepting.join(timeout=2)
        self._sock.close()
        for t in self._threads:
            t.join(timeout=2)

    def _accept_loop(self) -> None:
        """Accept until released; each connection gets its own thread."""
        while not self.release.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.connections += 1
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        """Read one request and answer it."""
        conn.settimeout(5)
        if self._tls is not None:
            try:
                conn = self._tls.wrap_socket(conn, server_side=True)
            except OSError:
                conn.close()
                return
        with conn:
            try:
                seen = _read_request(conn)
            except (OSError, ValueError):
                return
            with self._lock:
                self.requests.append(seen)
            try:
                self._answer(conn, seen)
            except OSError:
                return

    def _answer(self, conn: socket.socket, seen: Seen) -> None:
        """Behave as the path says."""
        split = urlsplit(seen.target)
        query = {k: v[0] for k, v in parse_qs(split.query).items()}
        size = int(query.get("n", "0"))
        match split.path:
            case "/ok":
                conn.sendall(_response(200, b"ok"))
            case "/fail":
                conn.sendall(_response(500, b"boom"))
            case "/gone":
                conn.sendall(_response(410, b"gone"))
            case "/status":
                conn.sendall(_response(int(query.get("code", "200")), b"status"))
            case "/redirect":
                conn.sendall(_response(302, b"", [("Location", self.url("/ok"))]))
            case "/slow":
                self.release.wait(5)
                conn.sendall(_response(200, b"late"))
            case "/hold":
                self.release.wait(float(query.get("s", "1")))
                conn.sendall(_response(200, b"held"))
            case "/reset":
                # SO_LINGER with a zero timeout turns close() into a TCP reset.
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            case "/huge":
                _send_chunked(conn, size)
            case "/drip":
                head = (
                    f"HTTP/1.1 200 OK\r\nContent-Length: {size * 10}\r\nConnection: close\r\n\r\n"
                )
                conn.sendall(head.encode() + b"d" * size)
                self.release.wait(5)
            case _:
                conn.sendall(_response(404, b"no"))


def parse_head(head: bytes) -> tuple[str, str, dict[str, str]]:
    """A request's method, target and headers (names in lower case) from its head."""
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return method, target, headers


def _read_request(conn: socket.socket) -> Seen:
    """Parse the request line, headers and a Content-Length body."""
    data = b""
    while b"\r\n\r\n" not in data:
        part = conn.recv(65536)
        if not part:
            raise ValueError("closed before the headers ended")
        data += part
    head, _, body = data.partition(b"\r\n\r\n")
    method, target, headers = parse_head(head)
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        part = conn.recv(65536)
        if not part:
            break
        body += part
    return Seen(method=method, target=target, headers=headers, body=body)


def _response(status: int, body: bytes, extra: list[tuple[str, str]] | None = None) -> bytes:
    """A complete HTTP/1.1 response that closes the connection."""
    lines = [f"HTTP/1.1 {status} X", f"Content-Length: {len(body)}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in extra or []]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _send_chunked(conn: socket.socket, size: int) -> None:
    """A 200 with a chunked body of `size` bytes."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n")
    left = size
    while left > 0:
        n = min(CHUNK, left)
        conn.sendall(f"{n:x}\r\n".encode() + b"h" * n + b"\r\n")
        left -= n
    conn.sendall(b"0\r\n\r\n")


def closed_port() -> int:
    """A local port with nothing listening (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port
