"""The API under test: in process (its lifespan and every request on one event loop thread), or
under uvicorn on a real loopback socket; and the first admin key."""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import anyio
import httpx
import uvicorn
from anyio.from_thread import BlockingPortal, start_blocking_portal

from queue_server.app import create_app
from queue_server.infra.http_protocol import ProblemHttpToolsProtocol
from queue_server.infra.serve import create_admin_key
from queue_server.settings import Settings


class LiveServer:
    """The app under uvicorn in a thread, on a real loopback socket."""

    def __init__(self, settings: Settings, database_url: str) -> None:
        self.settings = settings
        self.database_url = database_url
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = create_app(settings, database_url)
        config = uvicorn.Config(
            self.app, log_level="warning", lifespan="on", http=ProblemHttpToolsProtocol
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]})

    def start(self) -> None:
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            threading.Event().wait(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


def make_admin_key(settings: Settings, database_url: str) -> str:
    secret = create_admin_key(settings, database_url)
    assert secret is not None
    return secret


class InProcessTransport(httpx.BaseTransport):
    """A sync httpx transport into the app: each request runs on the server's event loop.

    Requests from many threads interleave on that loop as they would on uvicorn's; the
    client's read timeout bounds each request as it would on a socket.
    """

    def __init__(self, server: InProcessServer) -> None:
        self.server = server
        self.asgi = httpx.ASGITransport(
            app=server.app, raise_app_exceptions=False, client=("127.0.0.1", 50000)
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = request.read()
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        timeout = timeouts.get("read")

        async def send() -> tuple[int, list[tuple[bytes, bytes]], bytes]:
            inner = httpx.Request(
                request.method, request.url, headers=request.headers, content=body
            )
            with anyio.fail_after(timeout):
                answer = await self.asgi.handle_async_request(inner)
                raw = b"".join([chunk async for chunk in answer.aiter_raw()])
            return answer.status_code, answer.headers.raw, raw

        try:
            status, headers, raw = self.server.portal.call(send)
        except TimeoutError as exc:
            raise httpx.ReadTimeout("the app did not answer in time", request=request) from exc
        # A stream, not content: the client reads and closes it, which sets `elapsed`.
        return httpx.Response(
            status, headers=headers, stream=httpx.ByteStream(raw), request=request
        )


class InProcessServer:
    """The app in this process, no socket: its lifespan (pool, listener, background loops)
    and every request run on one event loop in a thread of its own.

    Clients reach it through `client_for(server.url, key)`: the URL names this server only.
    """

    _numbers = itertools.count(1)
    running: ClassVar[dict[str, InProcessServer]] = {}

    def __init__(self, settings: Settings, database_url: str) -> None:
        self.settings = settings
        self.database_url = database_url
        self.url = f"http://in-process-{next(self._numbers)}.test"
        self.app = create_app(settings, database_url)
        self._stack = contextlib.ExitStack()
        self._portal: BlockingPortal | None = None

    @property
    def portal(self) -> BlockingPortal:
        assert self._portal is not None, "the in-process server is not started"
        return self._portal

    def start(self) -> None:
        self._portal = self._stack.enter_context(start_blocking_portal())
        lifespan: AbstractContextManager[Any] = self._portal.wrap_async_context_manager(
            self.app.router.lifespan_context(self.app)
        )
        self._stack.enter_context(lifespan)
        InProcessServer.running[self.url] = self

    def stop(self) -> None:
        InProcessServer.running.pop(self.url, None)
        self._stack.close()
        self._portal = None

    def transport(self) -> InProcessTransport:
        return InProcessTransport(self)


def transport_for(url: str) -> InProcessTransport | None:
    """The transport into the in-process server at `url`; None for a server on a socket."""
    server = InProcessServer.running.get(url)
    return server.transport() if server else None
