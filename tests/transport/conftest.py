"""Fixtures: real local receivers and a broker allowed to reach 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.receiver import Receiver


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A fresh receiver per test, so connection counts start at zero."""
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def canary() -> Iterator[Receiver]:
    """A listener on 127.0.0.1 that must never see a connection from a refused dispatch."""
    r = Receiver()
    yield r
    r.close()
