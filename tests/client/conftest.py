"""The SDK under test opens its own connections to a URL: the API on a socket. Both worker
faces in turn (`face`): each behaviour test runs against `Worker` and `AsyncWorker`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.faces import AsyncioFace, Face, ThreadFace
from tests.helpers.server import LiveServer


@pytest.fixture
def server(live: LiveServer) -> LiveServer:
    return live


@pytest.fixture(params=["thread", "asyncio"])
def face(request: pytest.FixtureRequest) -> Iterator[Face]:
    """`Worker` and `AsyncWorker` in turn."""
    chosen = ThreadFace() if request.param == "thread" else AsyncioFace()
    try:
        yield chosen
    finally:
        chosen.close()
