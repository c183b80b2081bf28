"""The API under test: uvicorn on a real loopback socket, and the first admin key."""

from __future__ import annotations

import socket
import threading

import uvicorn

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
