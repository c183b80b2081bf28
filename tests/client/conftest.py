"""The SDK under test opens its own connections to a URL: the API on a socket."""

from __future__ import annotations

import pytest

from tests.helpers.server import LiveServer


@pytest.fixture
def server(live: LiveServer) -> LiveServer:
    return live
