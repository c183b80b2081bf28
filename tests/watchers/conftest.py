"""Fixtures: a receiver whose behaviour the test switches, and settings that deliver fast."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from queue_server.settings import Settings
from tests.helpers.watchers import SCALE, ModeReceiver


@pytest.fixture
def receiver() -> Iterator[ModeReceiver]:
    r = ModeReceiver()
    yield r
    r.close()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path,
        poll_interval=0.2,
        lock_timeout_ms=2000,
        transport_allow=["127.0.0.1"],
        delivery_backoff_scale=SCALE,
        delivery_attempt_timeout=1.0,
        delivery_poll_interval=0.05,
    )
