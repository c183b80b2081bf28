"""The server's own database sessions end a transaction left idle: it would hold its locks and a
snapshot that holds the database's xmin horizon back."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from queue_server import errors
from queue_server.db import Database
from queue_server.settings import Settings

Db = psycopg.Connection[dict[str, object]]


def test_a_server_session_idle_in_a_transaction_is_ended_by_its_timeout(
    database_url: str, db: Db
) -> None:
    settings = Settings(idle_in_transaction_timeout_ms=300)

    seen: dict[str, object] = {}

    async def idle_then_go_on(database: Database) -> None:
        async with database.tx() as conn:
            cur = await conn.execute("SELECT pg_backend_pid() AS pid")
            row = await cur.fetchone()
            assert row is not None
            seen["pid"] = row["pid"]
            # The transaction sits idle, as a request stalled between its statements.
            await asyncio.sleep(1.5)
            seen["sessions"] = db.execute(
                "SELECT count(*) AS n FROM pg_stat_activity WHERE pid = %s", (row["pid"],)
            ).fetchone()
            await conn.execute("SELECT 1")

    async def scenario() -> None:
        database = Database.for_api(settings, database_url)
        await database.open(wait=True)
        try:
            with pytest.raises(errors.TimeoutExceededError):
                await idle_then_go_on(database)
        finally:
            await database.close()

    asyncio.run(scenario())
    assert seen["sessions"] == {"n": 0}, f"session {seen['pid']} outlived its idle timeout"


def test_every_pool_of_the_server_sets_the_idle_in_transaction_timeout(database_url: str) -> None:
    settings = Settings(idle_in_transaction_timeout_ms=4321)

    async def shown(database: Database) -> str:
        await database.open(wait=True)
        try:
            async with database.conn() as conn:
                cur = await conn.execute("SHOW idle_in_transaction_session_timeout")
                row = await cur.fetchone()
                assert row is not None
                return str(row["idle_in_transaction_session_timeout"])
        finally:
            await database.close()

    api_pool = Database.for_api(settings, database_url)
    deliverer_pool = Database.for_deliverer(settings, database_url, concurrency=1)
    assert asyncio.run(shown(api_pool)) == "4321ms"
    assert asyncio.run(shown(deliverer_pool)) == "4321ms"
