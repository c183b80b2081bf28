"""How the lease path's transactions are sent: the acquire as one pipeline with no BEGIN
or COMMIT (an implicit transaction), the holder operations as BEGIN ... COMMIT in one
pipeline. What each must still guarantee is checked on a real database."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from queue_server.store import transitions
from queue_server.store.sessions import pipelined_transaction
from tests.helpers.api import Api

Db = psycopg.Connection[dict[str, object]]

_TERMS: dict[str, Any] = {
    "ttl": timedelta(seconds=30),
    "max_ttl": timedelta(seconds=30),
    "deadline": timedelta(seconds=300),
    "max_items": 2,
    "base_limit": 1,
    "key_id": "k",
}


def _waiting_on_an_advisory_lock(db: Db, pid: int) -> bool:
    row = db.execute(
        "SELECT count(*) AS n FROM pg_locks WHERE pid = %s AND locktype = 'advisory'"
        " AND NOT granted",
        (pid,),
    ).fetchone()
    return row is not None and row["n"] == 1


def test_an_acquire_waiting_on_the_queue_lock_sees_the_lease_of_the_holder_before_it(
    api: Api, database_url: str, db: Db
) -> None:
    """The acquire statement takes its snapshot after the lock is granted: a lease
    committed by the acquire that held the lock counts against the limit (1 here)."""
    api.enqueue("q", {"n": 1})
    api.enqueue("q", {"n": 2})

    async def first_then_second() -> tuple[int, int]:
        async with (
            await psycopg.AsyncConnection.connect(
                database_url, autocommit=True, row_factory=dict_row
            ) as first,
            await psycopg.AsyncConnection.connect(
                database_url, autocommit=True, row_factory=dict_row
            ) as second,
        ):
            # The first acquire holds the queue's lock in an open transaction, its lease made.
            async with first.transaction():
                await transitions.lock_queue(first, tenant="acme", queue="q")
                await first.execute("SELECT 1")  # the lock is granted before the second starts
                holder = asyncio.create_task(
                    transitions.acquire(second, tenant="acme", queue="q", worker="b", **_TERMS)
                )
                waiting_since = time.monotonic()
                pid = second.info.backend_pid
                while not await asyncio.to_thread(_waiting_on_an_advisory_lock, db, pid):
                    assert time.monotonic() - waiting_since < 10, "never waited on the lock"
                    await asyncio.sleep(0.01)
                cur = await first.execute(
                    "UPDATE work_items SET state = 'leased', fence = fence + 1,"
                    " acquisition_count = acquisition_count + 1, lease_holder = 'a',"
                    " lease_expires_at = now() + interval '30 seconds',"
                    " lease_deadline_at = now() + interval '300 seconds', leased_at = now()"
                    " WHERE item_id = (SELECT item_id FROM work_items WHERE state = 'ready'"
                    " ORDER BY available_at LIMIT 1) RETURNING item_id"
                )
                first_leased = len(await cur.fetchall())
            second_got = await holder
            return first_leased, len(second_got.leased)

    first_leased, second_leased = asyncio.run(first_then_second())
    assert first_leased == 1
    # With its snapshot taken before the lock was granted, it would lease the other item.
    assert second_leased == 0
    leased = db.execute("SELECT count(*) AS n FROM work_items WHERE state = 'leased'").fetchone()
    assert leased == {"n": 1}


def test_an_acquire_refuses_a_connection_inside_a_transaction(database_url: str) -> None:
    """Inside a caller's transaction its statements would join it, the lock held on."""

    async def inside() -> None:
        async with (
            await psycopg.AsyncConnection.connect(
                database_url, autocommit=True, row_factory=dict_row
            ) as conn,
            conn.transaction(),
        ):
            await transitions.acquire(conn, tenant="acme", queue="q", worker="w", **_TERMS)

    with pytest.raises(RuntimeError, match="idle"):
        asyncio.run(inside())


def _count(db: Db) -> int:
    row = db.execute("SELECT count(*) AS n FROM pipelined").fetchone()
    assert row is not None
    return int(str(row["n"]))


@pytest.mark.parametrize("ending", ["commit", "python-error", "database-error", "cancelled"])
def test_a_pipelined_transaction_commits_whole_or_not_at_all(
    database_url: str, db: Db, ending: str
) -> None:
    db.execute("CREATE TABLE pipelined (n int)")

    class StopError(Exception):
        pass

    async def run() -> str:
        async with await psycopg.AsyncConnection.connect(
            database_url, autocommit=True, row_factory=dict_row
        ) as conn:
            try:
                async with pipelined_transaction(conn):
                    await conn.execute("INSERT INTO pipelined VALUES (1)")
                    cur = await conn.execute("INSERT INTO pipelined VALUES (2) RETURNING n")
                    # A read mid-transaction: a flush, the transaction goes on.
                    assert await cur.fetchone() == {"n": 2}
                    assert _count(db) == 0  # nothing visible before the COMMIT
                    await conn.execute("INSERT INTO pipelined VALUES (3)")
                    if ending == "python-error":
                        raise StopError()
                    if ending == "database-error":
                        await (await conn.execute("SELECT 1 / 0")).fetchone()
                    if ending == "cancelled":
                        raise asyncio.CancelledError()
            except (StopError, psycopg.errors.DivisionByZero, asyncio.CancelledError) as exc:
                outcome = type(exc).__name__
            else:
                outcome = "committed"
            # Whatever happened, the connection is idle again and usable.
            assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            assert await (await conn.execute("SELECT 7 AS n")).fetchone() == {"n": 7}
            return outcome

    outcome = asyncio.run(run())
    if ending == "commit":
        assert outcome == "committed"
        assert _count(db) == 3
    else:
        assert outcome != "committed"
        assert _count(db) == 0


def test_a_pipelined_transaction_needs_an_idle_connection(database_url: str) -> None:
    async def run() -> None:
        async with (
            await psycopg.AsyncConnection.connect(
                database_url, autocommit=True, row_factory=dict_row
            ) as conn,
            conn.transaction(),
            pipelined_transaction(conn),
        ):
            pass

    with pytest.raises(RuntimeError, match="idle"):
        asyncio.run(run())
