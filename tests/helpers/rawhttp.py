"""A scripted HTTP/1.1 server on a loopback socket: each request is recorded and answered
with the raw bytes a script returns, so a test can make the server do what uvicorn does
only sometimes (close an idle connection, answer chunked, say `Connection: close`, never
answer)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.helpers.receiver import parse_head


@dataclass
class Seen:
    """One request as the server read it."""

    method: str
    target: str
    headers: dict[str, str]
    body: bytes
    connection: int  # which accepted connection carried it (0, 1, ...)


@dataclass
class Reply:
    """What the server writes back; `close`: it then closes the connection."""

    data: bytes
    close: bool = False
    # Written in pieces this many bytes long (a body split across reads).
    pieces: int = 0


def answer(
    status: int, body: bytes, *, headers: dict[str, str] | None = None, close: bool = False
) -> Reply:
    reason = {200: "OK", 409: "Conflict", 503: "Service Unavailable"}.get(status, "Status")
    head = {"Content-Type": "application/json", "Content-Length": str(len(body))}
    head.update(headers or {})
    lines = "".join(f"{k}: {v}\r\n" for k, v in head.items())
    return Reply(f"HTTP/1.1 {status} {reason}\r\n{lines}\r\n".encode() + body, close=close)


def chunked(status: int, body: bytes, size: int = 7) -> Reply:
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)
    head = (
        f"HTTP/1.1 {status} OK\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n"
    )
    return Reply(head.encode() + chunks + b"0\r\n\r\n", pieces=5)


@dataclass
class ScriptedServer:
    """Answers each request with `script(seen)`; None: never answers (the connection hangs)."""

    script: Callable[[Seen], Reply | None]
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0
    closed: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            number = self.connections
            self.connections += 1
            self._open.append(conn)
            threading.Thread(target=self._serve, args=(conn, number), daemon=True).start()

    def _serve(self, conn: socket.socket, number: int) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                method, target, headers = parse_head(head)
                length = int(headers.get("content-length", "0"))
                while len(buf) < length:
                    buf += conn.recv(65536)
                body, buf = buf[:length], buf[length:]
                seen = Seen(method, target, headers, body, number)
                self.seen.append(seen)
                reply = self.script(seen)
                if reply is None:
                    self._stop.wait()
                    return
                if reply.pieces:
                    for i in range(0, len(reply.data), reply.pieces):
                        conn.sendall(reply.data[i : i + reply.pieces])
                else:
                    conn.sendall(reply.data)
                if reply.close:
                    return
        except OSError:  # stopped: its connections are closed under it
            return
        finally:
            conn.close()
            self.closed.set()

    def stop(self) -> None:
        self._stop.set()
        self.sock.close()
        for conn in self._open:
            conn.close()
