"""A response's head and body leave in one write (queue_server.infra.http_protocol): uvicorn
writes each as it comes, which costs the server a second send and the client a second
wake-up. On real sockets: the held head goes out with the body, alone at the end of its
turn of the event loop when no body follows (a HEAD answer, an interim `100 Continue`),
and before the connection closes."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import pytest

from queue_server.infra.http_protocol import ProblemHttpToolsProtocol, _HeldHead
from tests.helpers.server import LiveServer

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


class _Writes:
    """A real transport, with each write it is given kept in order."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self.transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


def _on_a_loop(scenario: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """An asyncio scenario as a test (the suite runs no asyncio plugin)."""

    def test() -> None:
        asyncio.run(scenario())

    return test


@asynccontextmanager
async def _connection() -> AsyncIterator[tuple[_Writes, _HeldHead, asyncio.StreamReader]]:
    """A loopback TCP connection: the accepting side's transport (its writes kept), the
    same wrapped for one response, and the connecting side's reader."""
    accepted: asyncio.Future[asyncio.Transport] = asyncio.get_running_loop().create_future()

    class Accept(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            accepted.set_result(transport)  # type: ignore[arg-type]

    server = await asyncio.get_running_loop().create_server(Accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    transport = await accepted
    try:
        raw = _Writes(transport)
        yield raw, _HeldHead(raw), reader  # type: ignore[arg-type]
    finally:
        writer.close()
        transport.close()
        server.close()
        await server.wait_closed()


@_on_a_loop
async def test_the_head_and_the_body_leave_in_one_write() -> None:
    async with _connection() as (raw, held, reader):
        held.write(HEAD)
        held.write(b"{}")
        held.write(b"more")  # a later write goes straight through
        assert raw.writes == [HEAD + b"{}", b"more"]
        assert await reader.readexactly(len(HEAD) + 6) == HEAD + b"{}more"


@_on_a_loop
async def test_a_head_with_no_body_in_its_turn_leaves_at_the_end_of_the_turn() -> None:
    async with _connection() as (raw, held, reader):
        held.write(HEAD)
        assert raw.writes == []
        assert await asyncio.wait_for(reader.readexactly(len(HEAD)), 2) == HEAD
        assert raw.writes == [HEAD]
        held.write(b"{}")
        assert raw.writes == [HEAD, b"{}"]


@_on_a_loop
async def test_closing_writes_a_held_head_first() -> None:
    async with _connection() as (_raw, held, reader):
        held.write(HEAD)
        held.close()
        assert await asyncio.wait_for(reader.read(), 2) == HEAD


def _request(sock: socket.socket, head: bytes) -> tuple[bytes, bytes]:
    """Send `head` (a request without a body) and read one answer: its head and its body."""
    sock.sendall(head)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    answer, _, body = data.partition(b"\r\n\r\n")
    if head.startswith(b"HEAD "):
        return answer, body
    length = next(
        int(line.split(b":", 1)[1])
        for line in answer.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return answer, body


@pytest.mark.live
def test_answers_on_a_kept_alive_connection_stay_whole(live: LiveServer) -> None:
    get = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", live.port), timeout=5) as sock:
        for _ in range(20):
            answer, body = _request(sock, get)
            assert answer.startswith(b"HTTP/1.1 200 ")
            assert body.startswith(b"{")
        # Each answer went out through a held head (the connection's last one shows it).
        [protocol] = [c for c in live.server.server_state.connections]
        assert isinstance(protocol, ProblemHttpToolsProtocol)
        assert isinstance(protocol.cycle.transport, _HeldHead)
        # HEAD: a head and no body, at once; the connection goes on.
        answer, rest = _request(sock, b"HEAD /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 ")
        assert rest == b""
        answer, body = _request(sock, get)
        assert answer.startswith(b"HTTP/1.1 200 ")


@pytest.mark.live
def test_expect_100_continue_is_answered_before_the_body_is_sent(live: LiveServer) -> None:
    body = b'{"payload": {}}'
    head = (
        b"POST /v1/tenants/acme/queues/q/items HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nExpect: 100-continue\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", live.port), timeout=5) as sock:
        sock.sendall(head)
        # The server asks for the body only once the app reads it; no key: it answers 401
        # either way, but it must not hold back an interim answer the client waits for.
        first = sock.recv(65536)
        if first.startswith(b"HTTP/1.1 100 "):
            sock.sendall(body)
            first = first.partition(b"\r\n\r\n")[2] or sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 401 "), first
