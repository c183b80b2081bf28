"""Operators see a held snapshot coming: /metrics gives the age of the oldest snapshot holding
the database's xmin horizon back and the hot tables' dead row versions, the console's queues
page warns past a threshold, and the server's own sessions end a transaction left idle."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import psycopg
import pytest

from queue_server import errors
from queue_server.db import Database
from queue_server.settings import Settings
from queue_server.store import tables
from queue_server.store.health import HOT_TABLES
from tests.helpers.api import Api
from tests.helpers.console import sign_in
from tests.helpers.database import held_snapshot
from tests.helpers.items import sample

Db = psycopg.Connection[dict[str, object]]

AGE = "queue_server_database_horizon_age_seconds"
BANNER = "A database session has held an old snapshot"
WARN_AFTER = 2.0


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """The suite's settings with a console warning after two seconds of a held snapshot."""
    return Settings(
        data_dir=tmp_path, poll_interval=0.2, lock_timeout_ms=2000, horizon_warning_age=WARN_AFTER
    )


def test_metrics_give_the_age_of_a_held_snapshot_from_its_transactions_start(
    api: Api, database_url: str
) -> None:
    with psycopg.connect(database_url) as other:
        other.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        other.execute("SELECT count(*) FROM work_items")
        snapshot_taken = time.monotonic()
        time.sleep(1.5)
        # A later statement of the same transaction: the snapshot is as old as the
        # transaction, not as this statement.
        other.execute("SELECT 1")
        time.sleep(1.0)
        held = time.monotonic() - snapshot_taken
        scrape = api.admin.get("/metrics").text
        mine = api.operator.get("/metrics").text
        other.rollback()

    age = sample(scrape, AGE, holder="snapshot")
    assert age is not None, scrape
    assert age >= held
    assert (sample(scrape, "queue_server_database_horizon_holders", holder="snapshot") or 0) >= 1
    assert sample(scrape, "queue_server_database_horizon_xid_age", holder="snapshot") is not None
    for holder in ("prepared_transaction",):
        assert sample(scrape, AGE, holder=holder) == 0
    assert sample(scrape, "queue_server_database_horizon_holders", holder="replication_slot") == 0
    # A replication slot keeps no time: it has no age to give.
    assert sample(scrape, AGE, holder="replication_slot") is None
    # Database-wide, no tenant's data: the server's health, in an operator's scrape too.
    assert (sample(mine, AGE, holder="snapshot") or 0) >= held

    released = api.admin.get("/metrics").text
    assert (sample(released, AGE, holder="snapshot") or 0) < held


def test_metrics_give_the_dead_row_versions_of_the_hot_tables_to_the_admin_only(
    api: Api,
) -> None:
    api.approve("q", 10)
    for i in range(10):
        api.enqueue("q", i)
    leases = api.acquire("q", max_items=10)
    assert len(leases) == 10
    for lease in leases:
        done = api.holder("complete", lease["item_id"], worker="w1", fence=lease["fence"])
        assert done.status_code == 200, done.text

    # Each backend reports its statistics at most once a second, when idle: wait for all.
    deadline = time.monotonic() + 30
    while True:
        scrape = api.admin.get("/metrics").text
        dead = sample(scrape, "queue_server_table_dead_tuples", table="work_items") or 0
        live = sample(scrape, "queue_server_table_live_tuples", table="work_items")
        if (dead >= 10 and live == 10) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    # Every ready -> leased -> completed transition leaves a dead version of the item row.
    assert dead >= 10, scrape
    assert live == 10, scrape
    for table in HOT_TABLES:
        assert sample(scrape, "queue_server_table_dead_tuples", table=table) is not None, table
        assert sample(scrape, "queue_server_table_live_tuples", table=table) is not None, table
    # Every tenant's traffic: not in an operator's scrape.
    assert "queue_server_table_" not in api.operator.get("/metrics").text


def test_the_hot_tables_are_tables_of_the_schema() -> None:
    assert set(HOT_TABLES) <= set(tables.metadata.tables)


def test_the_queues_page_warns_while_a_snapshot_is_held_past_the_threshold(
    api: Api, database_url: str
) -> None:
    client, answer = sign_in(api.url, api.keys["operator"])
    assert answer.status_code == 303
    page = "/console/tenants/acme/queues"
    try:
        quiet = client.get(page)
        assert quiet.status_code == 200
        assert BANNER not in quiet.text

        with held_snapshot(database_url) as began:
            young = client.get(page).text
            while time.monotonic() - began < WARN_AFTER + 0.5:
                time.sleep(0.25)
            old = client.get(page).text
            # The page's script puts the live answer's figures in place (console.js).
            live = client.get(f"{page}/live").json()["figures"]["held-horizon"]

        after = client.get(page).text
        live_after = client.get(f"{page}/live").json()["figures"]["held-horizon"]
    finally:
        client.close()
    assert BANNER not in young  # younger than the threshold
    assert BANNER in old
    assert "queues slow down" in old
    assert "operators' guide (docs/operators.md)" in old
    assert BANNER in live
    assert live.startswith('<div data-figure="held-horizon">')
    assert BANNER not in after
    assert live_after == '<div data-figure="held-horizon"></div>'


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


def _shown(database: Database, *names: str) -> dict[str, str]:
    """What a session of the pool says its settings are (SHOW), by name."""

    async def show() -> dict[str, str]:
        await database.open(wait=True)
        try:
            async with database.conn() as conn:
                values: dict[str, str] = {}
                for name in names:
                    cur = await conn.execute(f"SHOW {name}")
                    row = await cur.fetchone()
                    assert row is not None
                    (values[name],) = (str(v) for v in row.values())
                return values
        finally:
            await database.close()

    return asyncio.run(show())


def test_every_pool_of_the_server_sets_the_idle_in_transaction_timeout(database_url: str) -> None:
    settings = Settings(idle_in_transaction_timeout_ms=4321)
    api_pool = Database.for_api(settings, database_url)
    deliverer_pool = Database.for_deliverer(settings, database_url, concurrency=1)
    timeout = "idle_in_transaction_session_timeout"
    assert _shown(api_pool, timeout) == {timeout: "4321ms"}
    assert _shown(deliverer_pool, timeout) == {timeout: "4321ms"}


def test_the_servers_sessions_bound_statements_and_lock_waits_as_set_and_run_in_utc(
    database_url: str,
) -> None:
    settings = Settings(statement_timeout_ms=7000, lock_timeout_ms=1234)
    names = ("statement_timeout", "lock_timeout", "TimeZone", "plan_cache_mode")
    assert _shown(Database.for_api(settings, database_url), *names) == {
        "statement_timeout": "7s",
        "lock_timeout": "1234ms",
        "TimeZone": "UTC",
        "plan_cache_mode": "force_generic_plan",
    }
    # A deliverer's statements have a bound of their own; its times are in UTC too.
    deliverer_pool = Database.for_deliverer(settings, database_url, concurrency=1)
    assert _shown(deliverer_pool, "statement_timeout", "TimeZone") == {
        "statement_timeout": "15s",
        "TimeZone": "UTC",
    }
