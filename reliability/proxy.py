"""A small fault-injecting TCP proxy (asyncio, in a background thread).

It sits between a client and the API, or between the API and PostgreSQL (TCP),
and forwards bytes in both directions. The mode can be switched at run time
from any thread with :meth:`TcpProxy.set_mode`:

``pass``
    forward everything unchanged.
``delay``
    forward everything, each chunk held back ``delay_ms`` milliseconds in each
    direction (a request/response round trip gains about ``2 * delay_ms``).
``drop_after_reply``
    forward the request to the upstream and let it process it; as soon as the
    upstream starts answering, close the client connection without delivering
    a single byte of the answer. The effect committed, the client saw a lost
    reply.
``reset``
    abort every active connection with a TCP RST, and RST every new one.
``blackhole``
    accept connections and read from them, but never forward nor answer
    (new connections are not even opened upstream). Clients time out.

Only loopback addresses are accepted, for listening and for the upstream.
The proxy stops on :meth:`TcpProxy.stop`, and by itself after ``lifetime``
seconds if one was given, so a forgotten proxy cannot outlive its scenario.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from types import TracebackType

__all__ = ["ProxyMode", "ProxyStats", "TcpProxy"]

_CHUNK = 65536


class ProxyMode(StrEnum):
    PASS = "pass"
    DELAY = "delay"
    DROP_AFTER_REPLY = "drop_after_reply"
    RESET = "reset"
    BLACKHOLE = "blackhole"


@dataclass(frozen=True)
class ProxyStats:
    """A consistent snapshot of the proxy's counters."""

    connections_accepted: int
    connections_active: int
    bytes_client_to_upstream: int
    bytes_upstream_to_client: int
    bytes_discarded: int
    resets: int
    drops: int
    blackholed: int
    upstream_failures: int
    mode_changes: int

    @property
    def faults_injected(self) -> int:
        """Connections that a fault mode acted on (reset, dropped or blackholed)."""
        return self.resets + self.drops + self.blackholed


def _require_loopback(host: str, what: str) -> None:
    if host == "localhost":
        return
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"{what} {host!r} is not a loopback address") from None
    if not address.is_loopback:
        raise ValueError(f"{what} {host!r} is not a loopback address")


def _abort(writer: asyncio.StreamWriter | None, *, rst: bool) -> None:
    if writer is None:
        return
    if rst:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            # SO_LINGER with a zero timeout makes close() send RST instead of FIN.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Connection:
    __slots__ = ("client", "closed", "dropped", "upstream")

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.closed = False
        self.dropped = False

    def reset(self) -> None:
        self.closed = True
        _abort(self.client, rst=True)
        _abort(self.upstream, rst=False)

    def abort(self) -> None:
        self.closed = True
        _abort(self.client, rst=False)
        _abort(self.upstream, rst=False)

    def close(self) -> None:
        self.closed = True
        for writer in (self.client, self.upstream):
            if writer is not None and not writer.is_closing():
                writer.close()


class TcpProxy:
    """A TCP proxy from ``127.0.0.1:<random port>`` to a loopback upstream.

    Use it as a context manager or call :meth:`start` and :meth:`stop`.
    Every public method is safe to call from any thread.
    """

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        *,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        mode: ProxyMode | str = ProxyMode.PASS,
        delay_ms: float = 0.0,
        connect_timeout: float = 5.0,
        lifetime: float | None = None,
        name: str = "tcp-proxy",
    ) -> None:
        _require_loopback(upstream_host, "upstream host")
        _require_loopback(listen_host, "listen host")
        if not 0 < upstream_port < 65536:
            raise ValueError(f"bad upstream port {upstream_port}")
        if lifetime is not None and lifetime <= 0:
            raise ValueError("lifetime must be positive")
        self._upstream_host = upstream_host
        self._upstream_port = upstream_port
        self._listen_host = listen_host
        self._listen_port = listen_port
        self._connect_timeout = connect_timeout
        self._lifetime = lifetime
        self._name = name

        self._lock = threading.Lock()
        self._mode = ProxyMode(mode)
        self._delay_s = self._check_delay(delay_ms)
        self._counters: dict[str, int] = dict.fromkeys(
            (
                "connections_accepted",
                "bytes_client_to_upstream",
                "bytes_upstream_to_client",
                "bytes_discarded",
                "resets",
                "drops",
                "blackholed",
                "upstream_failures",
                "mode_changes",
            ),
            0,
        )

        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread_id: int | None = None
        self._stop_event: asyncio.Event | None = None
        self._port: int | None = None
        self._conns: set[_Connection] = set()
        self._handlers: set[asyncio.Task[None]] = set()

    # ----------------------------------------------------------------- public

    @property
    def host(self) -> str:
        return self._listen_host

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the proxy is not started")
        return self._port

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def url(self) -> str:
        """``http://host:port``, for pointing an HTTP client at the proxy."""
        return f"http://{self.host}:{self.port}"

    @property
    def upstream(self) -> tuple[str, int]:
        return (self._upstream_host, self._upstream_port)

    @property
    def mode(self) -> ProxyMode:
        with self._lock:
            return self._mode

    @property
    def delay_ms(self) -> float:
        with self._lock:
            return self._delay_s * 1000.0

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    def stats(self) -> ProxyStats:
        with self._lock:
            counters = dict(self._counters)
            active = len(self._conns)
        return ProxyStats(connections_active=active, **counters)

    def start(self, timeout: float = 5.0) -> TcpProxy:
        """Start listening; returns once the port is bound."""
        if self._thread is not None:
            raise RuntimeError("the proxy was already started")
        self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError("the proxy did not start in time")
        if self._startup_error is not None:
            raise RuntimeError("the proxy failed to start") from self._startup_error
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Close the listener and every connection, then join the thread. Idempotent."""
        thread = self._thread
        if thread is None:
            return
        loop, event = self._loop, self._stop_event
        if loop is not None and event is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                loop.call_soon_threadsafe(event.set)
        thread.join(timeout)
        if thread.is_alive():
            raise RuntimeError("the proxy did not stop in time")

    def wait_stopped(self, timeout: float) -> bool:
        """Wait for the proxy thread to end (after stop() or its lifetime)."""
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def set_mode(self, mode: ProxyMode | str, *, delay_ms: float | None = None) -> None:
        """Switch the mode; ``reset`` also aborts every active connection before returning."""
        new_mode = ProxyMode(mode)
        with self._lock:
            self._mode = new_mode
            if delay_ms is not None:
                self._delay_s = self._check_delay(delay_ms)
            self._counters["mode_changes"] += 1
        if new_mode is ProxyMode.RESET:
            self._call_in_loop(self._reset_active)

    def __enter__(self) -> TcpProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # --------------------------------------------------------------- internals

    @staticmethod
    def _check_delay(delay_ms: float) -> float:
        if delay_ms < 0:
            raise ValueError("delay_ms must not be negative")
        return delay_ms / 1000.0

    def _bump(self, counter: str, amount: int = 1) -> None:
        with self._lock:
            self._counters[counter] += amount

    def _current(self) -> tuple[ProxyMode, float]:
        with self._lock:
            return self._mode, self._delay_s

    def _call_in_loop(self, fn: Callable[[], None], timeout: float = 5.0) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        if threading.get_ident() == self._loop_thread_id:
            fn()
            return
        done = threading.Event()

        def call() -> None:
            try:
                fn()
            finally:
                done.set()

        try:
            loop.call_soon_threadsafe(call)
        except RuntimeError:  # the loop ended meanwhile
            return
        done.wait(timeout)

    def _reset_active(self) -> None:
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            if not conn.closed:
                conn.reset()
                self._bump("resets")

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # surfaced by start()
            if self._startup_error is None and not self._ready.is_set():
                self._startup_error = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread_id = threading.get_ident()
        self._stop_event = asyncio.Event()
        try:
            server = await asyncio.start_server(
                self._handle, self._listen_host, self._listen_port, reuse_address=True
            )
        except OSError as exc:
            self._startup_error = exc
            return
        self._port = int(server.sockets[0].getsockname()[1])
        self._ready.set()
        try:
            if self._lifetime is None:
                await self._stop_event.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop_event.wait(), self._lifetime)
        finally:
            server.close()
            with self._lock:
                conns = list(self._conns)
            for conn in conns:
                conn.abort()
            handlers = [task for task in self._handlers if not task.done()]
            for task in handlers:
                task.cancel()
            await asyncio.gather(*handlers, return_exceptions=True)
            await server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        conn = _Connection(writer)
        with self._lock:
            self._conns.add(conn)
            self._counters["connections_accepted"] += 1
        try:
            await self._serve(conn, reader)
        except OSError:
            conn.abort()
        except asyncio.CancelledError:
            # The proxy is stopping: asyncio's stream callback would log a cancelled
            # handler as an error, so the handler ends quietly instead.
            conn.abort()
        finally:
            conn.close()
            with self._lock:
                self._conns.discard(conn)
            if task is not None:
                self._handlers.discard(task)

    async def _serve(self, conn: _Connection, reader: asyncio.StreamReader) -> None:
        mode, _ = self._current()
        if mode is ProxyMode.RESET:
            conn.reset()
            self._bump("resets")
            return
        if mode is ProxyMode.BLACKHOLE:
            self._bump("blackholed")
            await self._swallow(reader)
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(self._upstream_host, self._upstream_port),
                self._connect_timeout,
            )
        except (OSError, TimeoutError):
            self._bump("upstream_failures")
            conn.reset()
            return
        conn.upstream = up_writer
        if conn.closed:  # reset or stopped while connecting
            up_writer.transport.abort()
            return
        await asyncio.gather(
            self._pump(reader, up_writer, conn, to_upstream=True),
            self._pump(up_reader, conn.client, conn, to_upstream=False),
        )

    async def _swallow(self, reader: asyncio.StreamReader) -> None:
        while True:
            data = await reader.read(_CHUNK)
            if not data:
                return
            self._bump("bytes_discarded", len(data))

    async def _pump(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        conn: _Connection,
        *,
        to_upstream: bool,
    ) -> None:
        counter = "bytes_client_to_upstream" if to_upstream else "bytes_upstream_to_client"
        try:
            while True:
                data = await src.read(_CHUNK)
                if not data:
                    if not dst.is_closing() and dst.can_write_eof():
                        dst.write_eof()
                    return
                mode, delay_s = self._current()
                if mode is ProxyMode.BLACKHOLE:
                    self._bump("bytes_discarded", len(data))
                    continue
                if mode is ProxyMode.RESET:
                    if not conn.closed:
                        conn.reset()
                        self._bump("resets")
                    return
                if mode is ProxyMode.DROP_AFTER_REPLY and not to_upstream:
                    # The upstream has processed the request and started to answer:
                    # the client gets a closed connection and none of the answer.
                    self._bump("bytes_discarded", len(data))
                    if not conn.dropped:
                        conn.dropped = True
                        self._bump("drops")
                    conn.close()
                    return
                if mode is ProxyMode.DELAY and delay_s > 0:
                    await asyncio.sleep(delay_s)
                if dst.is_closing():
                    conn.abort()
                    return
                dst.write(data)
                await dst.drain()
                self._bump(counter, len(data))
        except OSError:
            conn.abort()
