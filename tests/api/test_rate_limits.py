"""Rate limits: a queue hands out at most `limit` leases in any `per` seconds, across every
worker process and API process (four worker processes racing here), over the whole queue or per partition key, where a key at its limit holds back
only its own items. Counted from the ledgers' `acquired` events."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

import httpx
import psycopg
import pytest

from queue_server.background import sweeper
from queue_server.db import Database
from queue_server.settings import Settings
from queue_server.store import transitions
from tests.helpers import worker_processes
from tests.helpers.api import Api
from tests.helpers.items import enqueue_many, put_settings
from tests.helpers.server import InProcessServer, LiveServer

Db = psycopg.Connection[dict[str, object]]


def put_rate(api: Api, **rate: Any) -> httpx.Response:
    return put_settings(api, rate_limit=rate)


def acquisitions(db: Db, key: str | None = None) -> list[datetime]:
    rows = db.execute(
        "SELECT e.at FROM item_events e JOIN work_items w USING (tenant_id, item_id)"
        " WHERE e.tenant_id = 'acme' AND e.kind = 'acquired'"
        " AND (%(key)s::text IS NULL OR w.partition_key = %(key)s) ORDER BY e.at",
        {"key": key},
    ).fetchall()
    return [row["at"] for row in rows]  # type: ignore[misc]


def busiest(times: list[datetime], per: float) -> int:
    """The most acquisitions in any window of `per` seconds."""
    span, most, first = timedelta(seconds=per), 0, 0
    for last, at in enumerate(times):
        while times[first] <= at - span:
            first += 1
        most = max(most, last - first + 1)
    return most


@pytest.mark.live
def test_four_worker_processes_get_the_rate_and_never_more(api: Api, db: Db) -> None:
    api.approve("q", 50)  # concurrency is not what holds them back
    put = put_rate(api, limit=20, per=1.0)
    assert put.status_code == 200, put.text
    assert put.json()["rate_limit"] == {
        "value": {"limit": 20, "per": 1.0, "partitioned": False},
        "source": "queue",
    }
    enqueue_many(api, [{"payload": n} for n in range(400)])
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        # Each process started and this module imported before the clock starts.
        assert pool.map(worker_processes.ready, range(8)) == [True] * 8
        until = time.time() + 5
        runs = pool.starmap(
            worker_processes.work, [(api.url, api.keys["worker"], f"w{n}", until) for n in range(4)]
        )
    times = acquisitions(db)
    assert sum(len(run) for run in runs) == len(times)
    assert busiest(times, 1.0) <= 20  # never more, in any second
    # And the rate itself, within 5 %: four windows' worth in the first 3.5 s.
    first = times[0]
    in_span = [t for t in times if t < first + timedelta(seconds=3.5)]
    assert len(in_span) >= 76, len(in_span)


def test_a_key_at_its_limit_holds_back_only_its_own_items(api: Api, db: Db) -> None:
    api.approve("q", 50)
    put = put_rate(api, limit=5, per=30, partitioned=True)
    assert put.status_code == 200, put.text
    enqueue_many(
        api,
        [{"payload": n, "partition_key": "noisy"} for n in range(40)]
        + [{"payload": n, "partition_key": "quiet"} for n in range(3)]
        + [{"payload": "keyless"}],
    )
    leases = api.acquire(max_items=20)
    by_key: dict[str, int] = {}
    for lease in leases:
        item = api.worker.get(f"/v1/tenants/acme/items/{lease['item_id']}").json()
        key = item["partition_key"] or ""
        by_key[key] = by_key.get(key, 0) + 1
    # The quiet key's items, and the one without a key, behind 40 of the noisy key's.
    assert by_key == {"noisy": 5, "quiet": 3, "": 1}
    assert api.acquire(max_items=20) == []  # the noisy key waits out its 30 s
    assert len(acquisitions(db, "noisy")) == 5


def test_a_whole_queue_limit_counts_the_leases_of_items_with_keys(api: Api) -> None:
    # Not partitioned: the items' partition keys are no windows of their own.
    api.approve("q", 50)
    assert put_rate(api, limit=2, per=30).status_code == 200
    enqueue_many(api, [{"payload": n, "partition_key": f"k{n}"} for n in range(6)])
    assert len(api.acquire(max_items=10)) == 2
    assert api.acquire(max_items=10) == []


def test_a_key_s_window_is_its_whole_interval(api: Api) -> None:
    # One lease per key in any 4 s: 2.5 s after its lease the key still waits.
    api.approve("q", 50)
    assert put_rate(api, limit=1, per=4, partitioned=True).status_code == 200
    enqueue_many(api, [{"payload": n, "partition_key": "a"} for n in range(3)])
    assert len(api.acquire(max_items=10)) == 1
    time.sleep(2.5)
    assert api.acquire(max_items=10) == []


def test_a_rate_limit_is_a_setting_refused_when_malformed_and_removable(api: Api) -> None:
    api.approve("q", 10)
    refused = put_rate(api, limit=0, per=1)
    assert refused.status_code == 422, refused.text
    assert put_rate(api, limit=3, per=60).status_code == 200
    enqueue_many(api, [{"payload": n} for n in range(5)])
    # A process that has not seen the queue rate-limited: its plain acquire steps aside, and
    # the queue's own statement leases, in the same call.
    transitions._rated.clear()
    assert len(api.acquire(max_items=10)) == 3
    assert api.acquire(max_items=10) == []
    # Removed: the next acquire is free of it.
    cleared = api.operator.put(
        "/v1/tenants/acme/queues/q/settings",
        json={},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert cleared.json()["rate_limit"] == {"value": None, "source": "default"}
    assert len(api.acquire(max_items=10)) == 2


def test_the_sweeper_deletes_the_grants_no_window_reads_any_more(
    api: Api, server: InProcessServer | LiveServer, db: Db, settings: Settings, database_url: str
) -> None:
    """Grants older than their queue's interval go (in batches); the window's stay, and so
    do those of a queue whose longer interval still reads them."""
    assert put_rate(api, limit=100, per=60).status_code == 200
    # The server's own sweeper runs every sweep when it starts: on a busy machine that first
    # round could come after the INSERT below and take the grants before this purge.
    server.stop()
    db.execute(
        "INSERT INTO rate_grants (tenant_id, queue, partition_key, granted_at, n)"
        " SELECT 'acme', q, '', statement_timestamp() - make_interval(secs => s), 1"
        " FROM (VALUES ('q', 5), ('q', 30), ('q', 90), ('q', 120), ('q', 300),"
        "              ('gone', 5)) AS v(q, s)"
    )

    async def purge() -> int | None:
        pool = Database.for_api(settings, database_url)
        await pool.open(wait=True)
        try:
            return await sweeper.purge_rate_grants(pool, 2)
        finally:
            await pool.close()

    assert asyncio.run(purge()) == 4  # q's three past 60 s, and the unlimited queue's one
    left = db.execute(
        "SELECT queue, round(extract(epoch FROM statement_timestamp() - granted_at)) AS age"
        " FROM rate_grants ORDER BY 2"
    ).fetchall()
    assert [(r["queue"], r["age"]) for r in left] == [("q", 5), ("q", 30)]
