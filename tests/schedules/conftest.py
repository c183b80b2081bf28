"""Fixtures for the scheduler without a server: a tenant row and an event loop per scenario."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from queue_server.settings import Settings
from tests.helpers.schedules import Db, Scheduler, scheduler

T = TypeVar("T")


@pytest.fixture
def tenant(db: Db) -> str:
    db.execute(
        "INSERT INTO tenants (tenant_id, backlog_cap, default_max_acquisitions, default_lease_ttl)"
        " VALUES ('acme', 1000, 3, '30 seconds')"
    )
    return "acme"


@pytest.fixture
def with_scheduler(
    settings: Settings, database_url: str, db: Db, tenant: str
) -> Callable[[Callable[[Scheduler], Awaitable[T]]], T]:
    """Run `scenario(scheduler)` in an event loop of its own."""

    def run(scenario: Callable[[Scheduler], Awaitable[T]]) -> T:
        async def main() -> T:
            async with scheduler(settings, database_url, db, tenant) as s:
                return await scenario(s)

        return asyncio.run(main())

    return run
