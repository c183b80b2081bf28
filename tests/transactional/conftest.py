"""An application's roles on the queue's PostgreSQL, dropped after each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.roles import Roles, roles_on


@pytest.fixture
def roles(database_url: str) -> Iterator[Roles]:
    yield from roles_on(database_url)
