"""Slow and idle clients are cut off (queue_server.infra.http_protocol), on a real socket:
a connection that sends nothing, its headers a byte at a time, or its body a byte at a time
is closed at its limit; a request that has arrived may wait as long as its long poll; at the
process's connection limit one more connection is answered 503 and closed."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator

import pytest

from queue_server.infra.http_protocol import ConnectionLimits, ProblemHttpToolsProtocol, use_limits
from tests.helpers import web
from tests.helpers.server import LiveServer, make_admin_key

LIMITS = ConnectionLimits(header_timeout=1.0, body_timeout=1.5, keep_alive=1.0, max_connections=8)


@pytest.fixture
def bounded(live: LiveServer) -> Iterator[LiveServer]:
    before = ProblemHttpToolsProtocol.limits
    use_limits(LIMITS)
    yield live
    use_limits(before)


def _connect(server: LiveServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def _closed_after(
    sock: socket.socket, *, trickle: bytes = b"", every: float = 0.0, since: float | None = None
) -> float:
    """Seconds until the server closes `sock` (counted from `since`, else from now), sending
    `trickle` a byte at a time meanwhile."""
    began = time.monotonic() if since is None else since
    sock.settimeout(every or 10)
    pending = list(trickle)
    while time.monotonic() - began < 10:
        try:
            if sock.recv(4096) == b"":
                return time.monotonic() - began
        except TimeoutError:
            pass
        except ConnectionResetError:
            return time.monotonic() - began
        if pending:
            try:
                sock.send(bytes([pending.pop(0)]))
            except (BrokenPipeError, ConnectionResetError):
                return time.monotonic() - began
    raise AssertionError("the server kept the connection open")


def test_an_idle_new_connection_is_closed_at_the_header_timeout(bounded: LiveServer) -> None:
    with _connect(bounded) as sock:
        waited = _closed_after(sock)
    assert 0.8 <= waited < 3


def test_headers_sent_a_byte_at_a_time_are_cut_at_the_header_timeout(bounded: LiveServer) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200 + b"\r\n\r\n"
    with _connect(bounded) as sock:
        waited = _closed_after(sock, trickle=request, every=0.2)
    assert 0.8 <= waited < 3  # long before the 230 bytes could arrive


def test_a_body_sent_a_byte_at_a_time_is_cut_at_the_body_timeout(bounded: LiveServer) -> None:
    body = json.dumps({"payload": "x" * 200}).encode()
    head = (
        b"POST /v1/tenants/t/queues/q/items HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
    )
    with _connect(bounded) as sock:
        sock.sendall(head)
        waited = _closed_after(sock, trickle=body, every=0.2)
    assert 1.2 <= waited < 4


def test_between_requests_silence_closes_at_the_keep_alive_limit(bounded: LiveServer) -> None:
    with _connect(bounded) as sock:
        # Counted from before the request: the server's idle time starts when it has answered,
        # which this thread may see late on a busy machine (it once counted 0.78 s of 1.0).
        asked = time.monotonic()
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        waited = _closed_after(sock, since=asked)
    assert 0.8 <= waited < 3


def test_a_request_that_has_arrived_is_not_cut_while_it_waits(bounded: LiveServer) -> None:
    # A long poll: the request arrived at once; its answer comes after the header and body
    # limits have both passed.
    admin = web.client(base_url=bounded.url, headers={"Authorization": f"Bearer {_admin(bounded)}"})
    assert admin.put("/v1/tenants/slow", json={"backlog_cap": 10}).status_code == 200
    began = time.monotonic()
    polled = admin.post(
        "/v1/tenants/slow/queues/q/leases",
        json={"worker": "w", "max_items": 1, "wait": 3},
        timeout=10,
    )
    assert polled.status_code == 200, polled.text
    assert polled.json()["leases"] == []
    assert time.monotonic() - began >= 2.5


def _served(sock: socket.socket) -> None:
    """A GET /healthz on the open connection is answered 200, which keeps it open."""
    sock.settimeout(5)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 200"), answer


def test_one_connection_past_the_limit_is_answered_503_and_closed(bounded: LiveServer) -> None:
    held = [_connect(bounded) for _ in range(LIMITS.max_connections)]
    try:
        for sock in held:  # every connection up to the limit is served
            _served(sock)
        with _connect(bounded) as extra:
            extra.settimeout(5)
            answer = extra.recv(4096)
            assert answer.startswith(b"HTTP/1.1 503"), answer
            assert b'"code":"server-busy"' in answer.replace(b" ", b"")
            assert b"client address" not in answer  # the process's limit, not the address's
            assert extra.recv(4096) == b""
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.1)
    assert web.get(f"{bounded.url}/healthz").status_code == 200  # room again


def _get_healthz_from(server: LiveServer, source: str) -> bytes:
    """A raw GET /healthz from the loopback address `source` (127.0.0.0/8 is all ours)."""
    with socket.create_connection(
        ("127.0.0.1", server.port), timeout=5, source_address=(source, 0)
    ) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return sock.recv(4096)


def test_one_address_past_its_share_is_refused_while_another_address_is_served(
    live: LiveServer,
) -> None:
    before = ProblemHttpToolsProtocol.limits
    use_limits(ConnectionLimits(max_connections=64, max_connections_per_address=4))
    held = [_connect(live) for _ in range(4)]
    try:
        for sock in held:  # its whole share is served
            _served(sock)
        with _connect(live) as extra:
            extra.settimeout(5)
            answer = extra.recv(4096)
            assert answer.startswith(b"HTTP/1.1 503"), answer
            assert b'"code":"server-busy"' in answer.replace(b" ", b"")
            assert b"client address" in answer
        # Far from the process's limit: another client is served while the first waits.
        assert _get_healthz_from(live, "127.0.0.2").startswith(b"HTTP/1.1 200"), "refused"
    finally:
        for sock in held:
            sock.close()
        use_limits(before)
    time.sleep(0.1)
    assert _get_healthz_from(live, "127.0.0.1").startswith(b"HTTP/1.1 200")  # its share back


def test_the_default_share_of_an_address_is_a_quarter_and_at_least_8() -> None:
    assert ConnectionLimits().address_share == 256
    assert ConnectionLimits(max_connections=10).address_share == 8
    assert ConnectionLimits(max_connections=10, max_connections_per_address=10).address_share == 10


def _admin(server: LiveServer) -> str:
    return make_admin_key(server.settings, server.database_url)


def _send_until_refused(sock: socket.socket, head: bytes, filler: bytes, limit: int) -> int:
    """Bytes sent of `head` and then `filler` repeated, up to `limit`, before the server
    stopped reading (it closed, or its answer arrived)."""
    sent = 0
    sock.sendall(head)
    sock.settimeout(0)
    while sent < limit:
        try:
            if sock.recv(1, socket.MSG_PEEK):
                break
        except BlockingIOError:
            pass
        except ConnectionResetError:
            break
        try:
            sent += sock.send(filler)
        except BlockingIOError:
            time.sleep(0.001)
        except (BrokenPipeError, ConnectionResetError):
            break
    return sent


def test_a_huge_request_head_is_refused_431_while_it_arrives(live: LiveServer) -> None:
    # 64 MB in one header value, with no key: the parser would hold every byte of it (a
    # 60 MB head aborted the process). It is refused once past the head limit, long before
    # its end, and the process goes on answering.
    limit = 64 * 1024 * 1024
    with _connect(live) as sock:
        sent = _send_until_refused(
            sock, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: ", b"a" * 65536, limit
        )
        sock.settimeout(10)
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                answer += chunk
    # What was sent includes what the kernel's socket buffers took (several MB on loopback).
    assert sent < 16 * 1024 * 1024, f"the server read {sent} bytes of one head"
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    assert b'"code":"headers-too-large"' in answer.replace(b" ", b"")
    for _ in range(3):
        assert web.get(f"{live.url}/healthz").status_code == 200


def test_a_head_within_the_limit_and_its_body_in_one_write_are_served(live: LiveServer) -> None:
    # A request whose head, near the headers' own 32 KiB limit, and body arrive in one send
    # is not counted as one over-long head.
    body = json.dumps({"payload": "x" * 200_000}).encode()
    request = (
        b"POST /v1/tenants/t/queues/q/items HTTP/1.1\r\nHost: x\r\n"
        + b"X-Pad: "
        + b"p" * 30_000
        + b"\r\n"
        + b"Content-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )
    with _connect(live) as sock:
        sock.sendall(request)
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]  # read whole, then no key


@pytest.mark.parametrize("size", [100_000, 400_000, 900_000])
def test_a_large_body_is_not_counted_as_a_request_head(live: LiveServer, size: int) -> None:
    # A body of 100 kB to 900 kB (a batch of large payloads, a fan-in naming thousands of
    # items), in the chunks the socket gives: the chunk that ends the request is the body's,
    # not the start of a next head (it was answered 431).
    for _ in range(2):  # the next request on the connection is counted from its own start
        answer = web.post(
            f"{live.url}/v1/tenants/t/queues/q/items",
            content=json.dumps({"payload": "x" * size}),
            headers={"Content-Type": "application/json"},
        )
        assert answer.status_code == 401, answer.text[:200]  # read whole, then no key


def _first_answer(server: LiveServer, sent: bytes) -> bytes:
    """What the server answers within 5 s to `sent`, sent and then nothing more."""
    with _connect(server) as sock:
        sock.sendall(sent)
        sock.settimeout(5)
        return sock.recv(4096)


def test_a_head_past_the_limit_is_answered_at_once_not_at_the_header_timeout(
    live: LiveServer,
) -> None:
    # 80 KiB of one header, the head not ended: the server does not wait for the rest of
    # it (the header timeout is 20 s) but answers 431 as soon as the limit is passed.
    answer = _first_answer(live, b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 80 * 1024)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]


def test_a_declared_length_past_the_body_limit_is_refused_before_the_body_is_sent(
    live: LiveServer,
) -> None:
    # The head alone: the server answers 413 from its Content-Length, without waiting for
    # (or reading) a megabyte it would refuse anyway.
    head = (
        b"POST /v1/tenants/t/queues/q/items HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: "
        + str(1024 * 1024 + 1).encode()
        + b"\r\n\r\n"
    )
    answer = _first_answer(live, head)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]


def test_a_chunked_body_one_byte_past_the_limit_is_413_and_at_the_limit_is_read(
    live: LiveServer,
) -> None:
    # No length declared: the body is counted as it arrives. A one-byte payload padded with
    # whitespace, so that only the body's limit can refuse it; no key, so a body read whole
    # is answered 401.
    limit = 1024 * 1024

    def chunks(size: int) -> Iterator[bytes]:
        data = b'{"payload": 1' + b" " * (size - 14) + b"}"
        return (data[i : i + 65536] for i in range(0, len(data), 65536))

    url = f"{live.url}/v1/tenants/t/queues/q/items"
    headers = {"Content-Type": "application/json"}
    with web.client(timeout=30) as client:
        at = client.post(url, content=chunks(limit), headers=headers)
        over = client.post(url, content=chunks(limit + 1), headers=headers)
    assert at.status_code == 401, at.text[:200]
    assert over.status_code == 413, over.text[:200]
    assert over.json()["code"] == "payload-too-large"
