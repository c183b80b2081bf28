"""The sweeper's samples of each queue: its counters, ready items, oldest due item and
completion times, taken by one process at a time; a day of them kept per quarter hour."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any, TypeVar

import psycopg

from queue_server.background import sweeper
from queue_server.db import Database
from queue_server.settings import Settings
from tests.helpers.api import Api
from tests.helpers.charts import clock_clear_of_the_grid, quarter_of

Db = psycopg.Connection[dict[str, Any]]
T = TypeVar("T")


def run(
    settings: Settings, url: str, work: Callable[[list[Database]], Awaitable[T]], n: int = 1
) -> T:
    """`work` on `n` pools of their own, as `n` API processes would run it."""

    async def main() -> T:
        pools = [Database.for_api(settings, url) for _ in range(n)]
        for pool in pools:
            await pool.open(wait=True)
        try:
            return await work(pools)
        finally:
            for pool in pools:
                await pool.close()

    return asyncio.run(main())


def sample_now(settings: Settings, url: str) -> None:
    """A sample of now, taken here (again while the server's own sweeper holds the lock)."""
    for _ in range(50):
        if run(settings, url, lambda dbs: sweeper.sample_counters(dbs[0], min_gap=0)) is not None:
            return
        time.sleep(0.05)
    raise AssertionError("the sample lock stayed taken")


def latest(db: Db, queue: str) -> dict[str, Any]:
    row = db.execute(
        "SELECT * FROM queue_samples WHERE tenant_id = 'acme' AND queue = %s"
        " ORDER BY sampled_at DESC LIMIT 1",
        (queue,),
    ).fetchone()
    assert row is not None, f"no sample of {queue}"
    return row


def at(value: object) -> datetime:
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def test_a_sample_holds_the_ready_items_the_oldest_due_one_and_the_completion_time(
    api: Api, db: Db, settings: Settings, database_url: str
) -> None:
    first = api.enqueue("q", 1)
    second = api.enqueue("q", 2)
    api.enqueue("q", 3, delay=3600)  # ready, not due: counted, not the oldest
    (lease,) = api.acquire("q")
    assert lease["item_id"] == first["item_id"]
    time.sleep(1.0)
    done = api.holder("complete", str(lease["item_id"]), worker="w1", fence=lease["fence"])
    assert done.status_code == 200, done.text
    sample_now(settings, database_url)

    row = latest(db, "q")
    assert row["ready"] == 2
    assert row["oldest_ready_at"] == at(second["available_at"])
    assert (row["completed"], row["failed"], row["timed_completions"]) == (1, 0, 1)
    ledger = api.worker.get(f"/v1/tenants/acme/items/{first['item_id']}/ledger").json()
    when = {e["kind"]: at(e["at"]) for e in ledger["events"]}
    took = (when["completed"] - when["acquired"]).total_seconds() * 1000
    assert row["completion_ms"] >= 1000
    assert abs(row["completion_ms"] - took) <= 1

    # The last due item taken: the delayed one is all that is ready, and not due.
    (lease2,) = api.acquire("q")
    assert lease2["item_id"] == second["item_id"]
    sample_now(settings, database_url)
    row = latest(db, "q")
    assert (row["ready"], row["oldest_ready_at"], row["completed"]) == (1, None, 1)

    # A batch of completions counts each one's time too.
    time.sleep(0.5)
    entry = {"item_id": lease2["item_id"], "fence": lease2["fence"]}
    batch = api.worker.post(
        "/v1/tenants/acme/completions",
        json={"worker": "w1", "completions": [entry]},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert batch.status_code == 200, batch.text
    sample_now(settings, database_url)
    after = latest(db, "q")
    assert (after["completed"], after["timed_completions"]) == (2, 2)
    assert 500 <= after["completion_ms"] - row["completion_ms"] < 30_000

    # A queue that never finished anything: its one ready item taken, its depth is zero.
    api.enqueue("fresh", 1)
    sample_now(settings, database_url)
    assert latest(db, "fresh")["ready"] == 1
    api.acquire("fresh")
    sample_now(settings, database_url)
    assert (latest(db, "fresh")["ready"], latest(db, "fresh")["oldest_ready_at"]) == (0, None)


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    keys = ("completed", "failed", "timed_completions", "completion_ms", "ready", "oldest_ready_at")
    return all(a[k] == b[k] for k in keys)


def test_processes_sampling_at_once_take_one_sample_of_each_change(
    api: Api, db: Db, settings: Settings, database_url: str
) -> None:
    async def race(dbs: list[Database]) -> list[list[int | None]]:
        rounds = []
        for n in range(6):
            await asyncio.to_thread(api.enqueue, "race", n)
            rounds.append(
                await asyncio.gather(*(sweeper.sample_counters(d, min_gap=0) for d in dbs))
            )
        return rounds

    rounds = run(settings, database_url, race, n=6)
    for taken in rounds:
        # One process took each round's sample (or the server's own sweeper did first).
        assert sum(t or 0 for t in taken) <= 1, taken
    rows = db.execute(
        "SELECT * FROM queue_samples WHERE tenant_id = 'acme' AND queue = 'race'"
        " ORDER BY sampled_at"
    ).fetchall()
    # A row only when something changed: no two samples in a row say the same.
    assert all(not _same(a, b) for a, b in pairwise(rows)), rows
    assert [r["ready"] for r in rows] == list(range(1, 7))

    # A process coming a moment after another's sample leaves the round to the next one.
    api.enqueue("race", "late")
    assert run(settings, database_url, lambda dbs: sweeper.sample_counters(dbs[0])) in (0, None)
    assert latest(db, "race")["ready"] == 6


def _insert(db: Db, table: str, queue: str, sampled_at: datetime, total: int, ready: int) -> None:
    db.execute(
        f"INSERT INTO {table} (tenant_id, queue, sampled_at, completed, failed,"
        " timed_completions, completion_ms, ready, oldest_ready_at)"
        " VALUES ('acme', %s, %s, %s, 0, %s, %s, %s, NULL)",
        (queue, sampled_at, total, total, total * 10, ready),
    )


def test_the_day_keeps_each_quarter_hours_last_sample_and_prunes_past_the_day(
    api: Api, db: Db, settings: Settings, database_url: str
) -> None:
    # The roll-up copies the buckets that ended a minute ago or more.
    now = clock_clear_of_the_grid(db, lag=timedelta(minutes=1))
    minutes = [44, 40, 33, 31, 29, 22, 16, 14, 9, 3, 0.5]
    times = [now - timedelta(minutes=m) for m in minutes]
    # In one transaction: the server's own sweeper, running meanwhile, sees all of these
    # back-dated samples or none (one committed late into a bucket it had copied would be
    # copied too; a real sample is never that late).
    with db.transaction():
        for n, t in enumerate(times):
            _insert(db, "queue_samples", "roll", t, n, n)
    # The sweeper's minute round: the day's samples first, then both prunes (again while
    # the server's own sweeper holds the lock).
    for _ in range(20):
        run(settings, database_url, lambda dbs: sweeper.tend_samples(dbs[0]))
        if db.execute("SELECT 1 FROM queue_day_samples WHERE queue = 'roll'").fetchone():
            break
        time.sleep(0.05)

    # Every quarter hour that ended a minute ago or more: its last sample, once.
    ended = quarter_of(now - timedelta(minutes=1))
    last: dict[datetime, datetime] = {}
    for t in times:
        if t < ended:
            last[quarter_of(t)] = max(t, last.get(quarter_of(t), t))
    kept = db.execute(
        "SELECT sampled_at, completed FROM queue_day_samples WHERE queue = 'roll'"
        " ORDER BY sampled_at"
    ).fetchall()
    assert [r["sampled_at"] for r in kept] == sorted(last.values())
    assert [r["completed"] for r in kept] == [times.index(t) for t in sorted(last.values())]
    again = run(settings, database_url, lambda dbs: sweeper.roll_up_samples(dbs[0]))
    assert again == 0

    # Past 25 hours only each queue's latest one stays: the day's first total.
    for hours, total in ((27, 1), (26, 2), (25.5, 3), (24.5, 4), (24, 5)):
        _insert(db, "queue_day_samples", "old", now - timedelta(hours=hours), total, 0)
    run(settings, database_url, lambda dbs: sweeper.tend_samples(dbs[0]))
    left = db.execute(
        "SELECT completed FROM queue_day_samples WHERE queue = 'old' ORDER BY sampled_at"
    ).fetchall()
    assert [r["completed"] for r in left] == [3, 4, 5]
