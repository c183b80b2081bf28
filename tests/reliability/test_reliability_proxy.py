"""The fault-injecting proxy against tiny local servers on 127.0.0.1."""

from __future__ import annotations

import contextlib
import json
import socket
import socketserver
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from reliability.proxy import ProxyMode, TcpProxy
from tests.helpers import web

pytestmark = pytest.mark.timeout(20)


class _LineServer(socketserver.ThreadingTCPServer):
    """Reads lines; records each one, then answers ``echo:<line>``."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _LineHandler)
        self.received: list[bytes] = []
        self.lock = threading.Lock()
        self.seen = threading.Event()

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class _LineHandler(socketserver.StreamRequestHandler):
    server: _LineServer

    def handle(self) -> None:
        for line in self.rfile:
            with self.server.lock:
                self.server.received.append(line)
            self.server.seen.set()
            try:
                self.wfile.write(b"echo:" + line)
                self.wfile.flush()
            except OSError:
                return


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _HttpHandler)
        self.bodies: list[bytes] = []
        self.lock = threading.Lock()

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class _HttpHandler(BaseHTTPRequestHandler):
    server: _HttpServer
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        with self.server.lock:
            self.server.bodies.append(body)  # "committed"
        reply = json.dumps({"stored": len(body)}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, format: str, *args: object) -> None:
        return


def _serve(server: socketserver.BaseServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    return thread


@pytest.fixture
def line_server() -> Iterator[_LineServer]:
    server = _LineServer()
    thread = _serve(server)
    yield server
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.fixture
def http_server() -> Iterator[_HttpServer]:
    server = _HttpServer()
    thread = _serve(server)
    yield server
    server.shutdown()
    server.server_close()
    thread.join(5)


@pytest.fixture
def proxy(line_server: _LineServer) -> Iterator[TcpProxy]:
    with TcpProxy("127.0.0.1", line_server.port, lifetime=60) as p:
        yield p
    assert not p.running


def _connect(proxy: TcpProxy, timeout: float = 3.0) -> socket.socket:
    return socket.create_connection(proxy.address, timeout=timeout)


def _roundtrip(sock: socket.socket, line: bytes) -> bytes:
    sock.sendall(line)
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def _poke(proxy: TcpProxy) -> bytes:
    """Connect, send twice, read: raises once the proxy's RST arrives."""
    with _connect(proxy) as sock:
        sock.sendall(b"poke\n")
        time.sleep(0.1)
        sock.sendall(b"poke\n")
        return sock.recv(4096)


def _wait_for(predicate: object, timeout: float = 3.0) -> bool:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())


def test_pass_forwards_both_ways_and_counts(proxy: TcpProxy, line_server: _LineServer) -> None:
    with _connect(proxy) as sock:
        assert _roundtrip(sock, b"hello\n") == b"echo:hello\n"
        assert _roundtrip(sock, b"again\n") == b"echo:again\n"
    assert line_server.received == [b"hello\n", b"again\n"]
    assert _wait_for(lambda: proxy.stats().connections_active == 0)
    stats = proxy.stats()
    assert stats.connections_accepted == 1
    assert stats.bytes_client_to_upstream == len(b"hello\nagain\n")
    assert stats.bytes_upstream_to_client == len(b"echo:hello\necho:again\n")
    assert stats.faults_injected == 0


def test_delay_adds_latency_each_direction(proxy: TcpProxy) -> None:
    with _connect(proxy) as sock:
        started = time.monotonic()
        _roundtrip(sock, b"warm\n")
        baseline = time.monotonic() - started

        proxy.set_mode(ProxyMode.DELAY, delay_ms=150)
        assert proxy.mode is ProxyMode.DELAY
        assert proxy.delay_ms == pytest.approx(150)
        started = time.monotonic()
        assert _roundtrip(sock, b"slow\n") == b"echo:slow\n"
        delayed = time.monotonic() - started

        proxy.set_mode("pass")
        started = time.monotonic()
        _roundtrip(sock, b"fast\n")
        after = time.monotonic() - started
    assert delayed >= 0.29  # 150 ms on the way in, 150 ms on the way out
    assert baseline < 0.15
    assert after < 0.15


def test_drop_after_reply_closes_client_after_upstream_processed(
    proxy: TcpProxy, line_server: _LineServer
) -> None:
    proxy.set_mode(ProxyMode.DROP_AFTER_REPLY)
    with _connect(proxy) as sock:
        sock.sendall(b"effect\n")
        assert sock.recv(4096) == b""  # closed, and no byte of the reply
    assert line_server.received == [b"effect\n"]  # the upstream saw the whole request
    stats = proxy.stats()
    assert stats.drops == 1
    assert stats.bytes_upstream_to_client == 0
    assert stats.bytes_discarded == len(b"echo:effect\n")


def test_drop_after_reply_over_http_then_retry_succeeds(http_server: _HttpServer) -> None:
    body = json.dumps({"payload": "x" * 2000}).encode()
    with (
        TcpProxy("127.0.0.1", http_server.port, lifetime=60) as proxy,
        web.client(base_url=proxy.url, timeout=3.0, trust_env=False) as client,
    ):
        proxy.set_mode(ProxyMode.DROP_AFTER_REPLY)
        with pytest.raises(httpx.TransportError):
            client.post("/items", content=body, headers={"Idempotency-Key": "k1"})
        assert http_server.bodies == [body]  # the effect happened, the reply was lost

        proxy.set_mode(ProxyMode.PASS)
        reply = client.post("/items", content=body, headers={"Idempotency-Key": "k1"})
        assert reply.status_code == 201
        assert reply.json() == {"stored": len(body)}
    assert proxy.stats().drops == 1


def test_reset_refuses_new_connections(proxy: TcpProxy, line_server: _LineServer) -> None:
    proxy.set_mode(ProxyMode.RESET)
    # The RST may already arrive while connect() completes, or on a later send or recv.
    with pytest.raises(ConnectionResetError):
        _poke(proxy)
    assert line_server.received == []
    assert proxy.stats().resets >= 1


def test_reset_aborts_active_connections(proxy: TcpProxy) -> None:
    with _connect(proxy) as sock:
        assert _roundtrip(sock, b"first\n") == b"echo:first\n"
        proxy.set_mode(ProxyMode.RESET)
        with pytest.raises(ConnectionResetError):
            sock.recv(4096)
    assert proxy.stats().resets == 1
    proxy.set_mode(ProxyMode.PASS)
    with _connect(proxy) as sock:
        assert _roundtrip(sock, b"back\n") == b"echo:back\n"


def test_reset_over_http_is_a_connection_error(http_server: _HttpServer) -> None:
    with (
        TcpProxy("127.0.0.1", http_server.port, lifetime=60) as proxy,
        web.client(base_url=proxy.url, timeout=3.0, trust_env=False) as client,
    ):
        proxy.set_mode(ProxyMode.RESET)
        with pytest.raises(httpx.TransportError):
            client.post("/items", content=b"{}")
    assert http_server.bodies == []


def test_blackhole_times_out_the_client(proxy: TcpProxy, line_server: _LineServer) -> None:
    proxy.set_mode(ProxyMode.BLACKHOLE)
    with _connect(proxy, timeout=0.4) as sock:
        sock.sendall(b"into the void\n")
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            sock.recv(4096)
        assert time.monotonic() - started >= 0.35
    assert line_server.received == []
    assert _wait_for(lambda: proxy.stats().bytes_discarded == len(b"into the void\n"))
    assert proxy.stats().blackholed == 1


def test_blackhole_swallows_replies_of_active_connections(
    proxy: TcpProxy, line_server: _LineServer
) -> None:
    with _connect(proxy, timeout=0.4) as sock:
        assert _roundtrip(sock, b"one\n") == b"echo:one\n"
        proxy.set_mode(ProxyMode.BLACKHOLE)
        sock.sendall(b"two\n")
        with pytest.raises(TimeoutError):
            sock.recv(4096)
    assert line_server.received == [b"one\n"]


def test_blackhole_over_http_times_out(http_server: _HttpServer) -> None:
    with (
        TcpProxy("127.0.0.1", http_server.port, mode="blackhole", lifetime=60) as proxy,
        web.client(base_url=proxy.url, timeout=0.5, trust_env=False) as client,
        pytest.raises(httpx.ReadTimeout),
    ):
        client.post("/items", content=b"{}")
    assert http_server.bodies == []


def test_stop_closes_every_connection_promptly(proxy: TcpProxy) -> None:
    active = _connect(proxy)
    assert _roundtrip(active, b"hi\n") == b"echo:hi\n"
    proxy.set_mode(ProxyMode.BLACKHOLE)
    hole = _connect(proxy)
    hole.sendall(b"waiting\n")
    assert _wait_for(lambda: proxy.stats().connections_active == 2)
    started = time.monotonic()
    proxy.stop()
    assert time.monotonic() - started < 2.0
    assert not proxy.running
    for sock in (active, hole):
        with sock, contextlib.suppress(ConnectionResetError):
            assert sock.recv(4096) == b""
    proxy.stop()  # idempotent
    with pytest.raises(ConnectionRefusedError):
        _connect(proxy, timeout=1.0).close()


def test_lifetime_stops_the_proxy_by_itself(line_server: _LineServer) -> None:
    proxy = TcpProxy("127.0.0.1", line_server.port, lifetime=0.3).start()
    with _connect(proxy) as sock:
        assert _roundtrip(sock, b"x\n") == b"echo:x\n"
    assert proxy.wait_stopped(5.0)
    assert not proxy.running
    proxy.stop()


def test_upstream_down_resets_the_client() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free_port = int(probe.getsockname()[1])
    with TcpProxy("127.0.0.1", free_port, lifetime=60) as proxy:
        with pytest.raises(ConnectionResetError):
            _poke(proxy)
        assert _wait_for(lambda: proxy.stats().upstream_failures == 1)


def test_set_mode_from_many_threads(proxy: TcpProxy) -> None:
    modes = [ProxyMode.PASS, ProxyMode.DELAY, ProxyMode.BLACKHOLE, ProxyMode.DROP_AFTER_REPLY]

    def flip(n: int) -> None:
        for i in range(50):
            proxy.set_mode(modes[(n + i) % len(modes)], delay_ms=1)

    threads = [threading.Thread(target=flip, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert proxy.stats().mode_changes == 200
    proxy.set_mode(ProxyMode.PASS)
    with _connect(proxy) as sock:
        assert _roundtrip(sock, b"ok\n") == b"echo:ok\n"


@pytest.mark.parametrize(
    ("upstream", "listen"),
    [("10.1.2.3", "127.0.0.1"), ("example.com", "127.0.0.1"), ("127.0.0.1", "0.0.0.0")],
)
def test_only_loopback_addresses(upstream: str, listen: str) -> None:
    with pytest.raises(ValueError, match="loopback"):
        TcpProxy(upstream, 5432, listen_host=listen)


def test_ipv6_loopback_and_localhost_are_allowed() -> None:
    TcpProxy("::1", 5432, listen_host="localhost")
    with pytest.raises(ValueError, match="negative"):
        TcpProxy("127.0.0.1", 5432, delay_ms=-1)
