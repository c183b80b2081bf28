"""Retention: finished items past their tenant's retention go with their ledgers, in bounded
batches, one process at a time, and whatever a crash interrupted the next round finishes."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest

from queue_server.background import sweeper
from queue_server.db import Database
from queue_server.settings import Settings
from queue_server.store import sweeps, transitions
from tests.helpers.api import Api, setup_tenant
from tests.helpers.invariants import assert_backlog_counter_matches, assert_ledgers_fold_to_rows

Db = psycopg.Connection[dict[str, object]]
T = TypeVar("T")


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """The live server's own sweeper runs its rounds at start only: these tests run theirs."""
    return Settings(
        data_dir=tmp_path, poll_interval=0.2, lock_timeout_ms=2000, retention_interval=3600
    )


def _key() -> dict[str, str]:
    return {"Idempotency-Key": uuid.uuid4().hex}


def run(settings: Settings, url: str, work: Callable[[Database], Awaitable[T]]) -> T:
    """`work` on a pool of its own, as one more API process would run it."""

    async def main() -> T:
        db = Database.for_api(settings, url)
        await db.open(wait=True)
        try:
            return await work(db)
        finally:
            await db.close()

    return asyncio.run(main())


def finish(api: Api, n: int, queue: str = "q") -> list[str]:
    """Enqueue, lease and complete `n` items; returns their ids."""
    ids = []
    for i in range(n):
        item = api.enqueue(queue, {"n": i})
        (lease,) = api.acquire(queue)
        done = api.holder("complete", item["item_id"], worker="w1", fence=lease["fence"])
        assert done.status_code == 200, done.text
        ids.append(str(item["item_id"]))
    return ids


def age(db: Db, ids: list[str], *, created: str, finished: str) -> None:
    """Move the items' times back, as if they had been created and finished that long ago."""
    db.execute(
        "UPDATE work_items SET created_at = created_at - %s::interval,"
        " updated_at = updated_at - %s::interval WHERE item_id = ANY(%s::uuid[])",
        (created, finished, ids),
    )


def remaining(db: Db) -> dict[str, str]:
    rows = db.execute("SELECT item_id::text AS id, state::text AS state FROM work_items")
    return {str(r["id"]): str(r["state"]) for r in rows.fetchall()}


def test_finished_items_past_retention_go_with_their_ledgers_in_bounded_batches(
    api: Api, db: Db, settings: Settings, database_url: str
) -> None:
    saved = api.admin.put("/v1/tenants/acme", json={"backlog_cap": 100, "retention": 3600})
    assert saved.json()["retention"] == 3600
    old_done = finish(api, 5)
    old_cancelled = [str(api.enqueue("q", "x")["item_id"]) for _ in range(2)]
    for item_id in old_cancelled:
        cancelled = api.operator.post(
            f"/v1/tenants/acme/items/{item_id}/cancel", json={}, headers=_key()
        )
        assert cancelled.status_code == 200
    recent_done = finish(api, 2, queue="other")
    long_lived = finish(api, 1)  # created long ago, finished a minute ago: kept
    still_ready = str(api.enqueue("q", "open")["item_id"])
    age(db, old_done + old_cancelled, created="3 hours", finished="2 hours")
    age(db, long_lived, created="3 hours", finished="1 minute")
    before = api.operator.get("/v1/tenants/acme/queues").json()

    deleted = run(settings, database_url, lambda d: sweeper.purge_finished(d, batch=2))

    assert deleted == len(old_done + old_cancelled)
    assert remaining(db) == {
        **{i: "completed" for i in recent_done + long_lived},
        still_ready: "ready",
    }
    orphans = db.execute(
        "SELECT count(*) AS n FROM item_events e WHERE NOT EXISTS"
        " (SELECT 1 FROM work_items w WHERE w.item_id = e.item_id)"
    ).fetchone()
    assert orphans == {"n": 0}
    assert_ledgers_fold_to_rows(db)
    assert_backlog_counter_matches(db)
    verified = api.operator.get("/v1/tenants/acme/ledger-verification").json()
    assert verified["mismatches"] == []
    # The figures count what is left; the completions total keeps what happened.
    after = {q["queue"]: q for q in api.operator.get("/v1/tenants/acme/queues").json()["queues"]}
    assert after["q"]["states"]["completed"] == 1
    assert after["q"]["states"]["cancelled"] == 0
    assert after["q"]["completions"]["total"] == 6
    assert before["queues"][1]["completions"]["total"] == 6
    tenant = api.operator.get("/v1/tenants/acme").json()
    assert (tenant["completed"], tenant["cancelled"]) == (3, 0)
    # Nothing left past the retention: the next round deletes nothing.
    assert run(settings, database_url, lambda d: sweeper.purge_finished(d, batch=2)) == 0


def test_each_tenant_is_held_to_its_own_retention(
    api: Api, db: Db, settings: Settings, database_url: str
) -> None:
    saved = api.admin.put("/v1/tenants/acme", json={"backlog_cap": 100, "retention": 3600})
    assert saved.status_code == 200
    other = setup_tenant(api.url, api.admin, "globex")  # the default retention: seven days
    mine = finish(api, 2)
    theirs = finish(other, 2)
    age(db, mine + theirs, created="3 hours", finished="2 hours")
    assert run(settings, database_url, lambda d: sweeper.purge_finished(d, batch=10)) == 2
    assert remaining(db) == {i: "completed" for i in theirs}


def test_the_round_runs_in_one_process_at_a_time_and_a_crash_leaves_nothing_half_done(
    api: Api, db: Db, settings: Settings, database_url: str
) -> None:
    api.admin.put("/v1/tenants/acme", json={"backlog_cap": 100, "retention": 60})
    done = finish(api, 12)
    age(db, done, created="2 hours", finished="2 hours")

    # Another process holds the round: this one leaves it alone.
    with psycopg.connect(database_url, autocommit=True) as other:
        other.execute(
            "SELECT pg_advisory_lock(%s, %s)", (sweeps.SWEEP_LOCK_CLASS, sweeper.RETENTION_LOCK)
        )
        assert run(settings, database_url, lambda d: sweeper.purge_finished(d, batch=3)) is None
        assert len(remaining(db)) == 12

    # A process dies after its first batch: that batch went whole, the rest stayed whole.
    async def crash_after_one_batch(d: Database) -> None:
        original = transitions.purge_finished
        calls = 0

        async def then_die(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 2:
                raise asyncio.CancelledError()
            return await original(*args, **kwargs)

        transitions.purge_finished = then_die
        try:
            with pytest.raises(asyncio.CancelledError):
                await sweeper.purge_finished(d, batch=3)
        finally:
            transitions.purge_finished = original

    run(settings, database_url, crash_after_one_batch)
    assert len(remaining(db)) == 9
    assert_ledgers_fold_to_rows(db)

    # Several processes at once after the restart: every item goes exactly once.
    async def three_processes(d: Database) -> list[int | None]:
        pools = [Database.for_api(settings, database_url) for _ in range(2)]
        for pool in pools:
            await pool.open(wait=True)
        try:
            return await asyncio.gather(*(sweeper.purge_finished(p, batch=2) for p in [d, *pools]))
        finally:
            for pool in pools:
                await pool.close()

    rounds = run(settings, database_url, three_processes)
    # One process did the round (or took it over from another); none deleted twice.
    assert remaining(db) == {}
    assert any(rounds)
    assert sum(r or 0 for r in rounds) <= 9
    purged = db.execute("SELECT sum(purged_completed) AS n FROM counter_totals").fetchone()
    assert purged == {"n": 12}
    figures = api.operator.get("/v1/tenants/acme/queues").json()["queues"][0]
    assert figures["states"]["completed"] == 0
    assert figures["completions"]["total"] == 12


def test_a_walk_in_batches_of_one_passes_over_what_it_keeps_and_ends(
    api: Api, db: Db, settings: Settings, database_url: str
) -> None:
    """Each batch starts after the last entry the one before read, kept or deleted: an item
    created long ago but finished recently, read last by a batch of one, is not read again
    and again."""
    assert api.admin.put(
        "/v1/tenants/acme", json={"backlog_cap": 100, "retention": 3600}
    ).is_success
    kept = finish(api, 1)  # created long ago, finished a minute ago: kept
    gone = finish(api, 2)
    age(db, kept, created="4 hours", finished="1 minute")
    age(db, gone, created="3 hours", finished="2 hours")

    async def walk(d: Database) -> int | None:
        async with asyncio.timeout(10):
            return await sweeper.purge_finished(d, batch=1)

    assert run(settings, database_url, walk) == 2
    assert remaining(db) == {kept[0]: "completed"}


def test_a_sweeps_first_round_comes_one_interval_after_the_sweeper_starts(
    api: Api, db: Db, settings: Settings, database_url: str
) -> None:
    """Processes started together (a deploy, a failover) do not all sweep at once: an item
    past its retention when the sweeper starts goes one retention interval later."""
    assert api.admin.put(
        "/v1/tenants/acme", json={"backlog_cap": 100, "retention": 3600}
    ).is_success
    old = finish(api, 1)
    age(db, old, created="3 hours", finished="2 hours")
    interval = 1.0
    own = settings.model_copy(update={"retention_interval": interval})

    async def first_round(d: Database) -> float:
        began = time.monotonic()
        sweeping = asyncio.create_task(sweeper.sweep_forever(d, own, lambda: (1, None)))
        try:
            while remaining(db):
                assert time.monotonic() - began < 30, "the retention round never came"
                await asyncio.sleep(0.02)
            return time.monotonic() - began
        finally:
            sweeping.cancel()
            await asyncio.gather(sweeping, return_exceptions=True)

    assert run(settings, database_url, first_round) >= interval


def test_spent_receipts_go_in_batches_and_live_ones_stay(
    api: Api, db: Db, settings: Settings, database_url: str
) -> None:
    for _ in range(5):
        api.enqueue("q", "x")
    db.execute(
        "UPDATE idempotency_receipts SET expires_at = now() - interval '1 second'"
        " WHERE idempotency_key IN (SELECT idempotency_key FROM idempotency_receipts LIMIT 4)"
    )
    assert run(settings, database_url, lambda d: sweeper.purge_receipts(d, batch=3)) == 4
    left = db.execute("SELECT count(*) AS n FROM idempotency_receipts").fetchone()
    assert left == {"n": 1}


def test_retention_is_a_tenant_setting_with_a_default_of_seven_days(api: Api) -> None:
    shown = api.admin.get("/v1/tenants/acme").json()
    assert shown["retention"] == 7 * 24 * 3600
    refused = api.admin.put("/v1/tenants/acme", json={"backlog_cap": 10, "retention": 0})
    assert refused.status_code == 422
    assert "retention" in refused.text
