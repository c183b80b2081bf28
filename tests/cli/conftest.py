"""Run the real `queue-server` command against the real server (the `live` fixture)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers.api import Api
from tests.helpers.cli import Cli
from tests.helpers.server import LiveServer


@pytest.fixture
def server(live: LiveServer) -> LiveServer:
    """`queue-server` runs as a subprocess: it reaches the API on a socket."""
    return live


@pytest.fixture
def cli(api: Api, tmp_path: Path) -> Cli:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "QUEUE_SERVER_URL": api.url,
        "QUEUE_SERVER_DATA_DIR": str(tmp_path / "data"),
        "COLUMNS": "200",
        "NO_COLOR": "1",
    }
    return Cli(env=env, api=api, cwd=tmp_path)
