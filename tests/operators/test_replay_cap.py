"""Replay puts items back in the backlog, so it is admitted like an enqueue: under the
tenant's admission lock, within the backlog cap, single or in bulk."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import httpx
import psycopg

from tests.helpers.api import Api
from tests.helpers.invariants import assert_backlog_counter_matches
from tests.helpers.items import dead_letter_of, quarantine, replay

Db = psycopg.Connection[dict[str, Any]]


def _backlog(db: Db) -> int:
    row = db.execute(
        "SELECT count(*) AS n FROM work_items WHERE state IN ('ready', 'leased')"
    ).fetchone()
    assert row is not None
    return int(row["n"])


def _fill(api: Api, n: int, queue: str = "fill") -> None:
    for _ in range(n):
        api.enqueue(queue)


def _bulk(api: Api, queue: str = "q", client: httpx.Client | None = None) -> httpx.Response:
    return (client or api.operator).post(
        f"/v1/tenants/acme/queues/{queue}/dead-letters:replay",
        json={},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )


def test_replay_at_the_cap_is_429_changes_nothing_and_is_not_kept(api: Api, db: Db) -> None:
    api.admin.put("/v1/tenants/acme", json={"backlog_cap": 10})
    letters = [dead_letter_of(api, quarantine(api)) for _ in range(6)]
    _fill(api, 10)
    refused = replay(api, letters[0], key="replay-1")
    assert refused.status_code == 429, refused.text
    problem = refused.json()
    assert (problem["code"], problem["backlog"], problem["backlog_cap"]) == (
        "backlog-cap-reached",
        10,
        10,
    )
    assert api.admin.get("/v1/tenants/acme").json()["backlog"] == 10
    assert _backlog(db) == 10
    shown = api.operator.get(f"/v1/tenants/acme/dead-letters/{letters[0]}").json()
    assert shown["dead_letter"]["closed_at"] is None
    assert shown["item"]["state"] == "quarantined"
    # Room again (one item done): the same key replays now; the 429 was not kept.
    (lease,) = api.acquire("fill")
    api.holder("complete", lease["item_id"], worker="w1", fence=lease["fence"])
    again = replay(api, letters[0], key="replay-1")
    assert again.status_code == 200, again.text
    assert "Idempotent-Replayed" not in again.headers
    assert _backlog(db) == 10
    assert_backlog_counter_matches(db)


def test_bulk_replay_replays_what_fits_and_reports_the_rest(api: Api, db: Db) -> None:
    api.admin.put("/v1/tenants/acme", json={"backlog_cap": 10})
    letters = [dead_letter_of(api, quarantine(api)) for _ in range(6)]
    _fill(api, 7)
    response = _bulk(api)
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["replayed"], body["over_cap"], body["remaining"], body["backlog_cap"]) == (
        3,
        3,
        3,
        10,
    )
    # The oldest fit; the rest stay open and are named.
    assert body["over_cap_dead_letter_ids"] == letters[3:]
    assert api.admin.get("/v1/tenants/acme").json()["backlog"] == 10
    assert _backlog(db) == 10
    # Nothing fits now: a 429, as for an enqueue, and nothing changes.
    full = _bulk(api)
    assert full.status_code == 429, full.text
    assert full.json()["code"] == "backlog-cap-reached"
    assert _backlog(db) == 10
    assert_backlog_counter_matches(db)


def test_replay_never_takes_the_room_of_active_leases(api: Api, db: Db) -> None:
    api.admin.put("/v1/tenants/acme", json={"backlog_cap": 3})
    api.approve("work", 2)
    quarantine(api)
    quarantine(api)
    _fill(api, 2, queue="work")
    leases = api.acquire("work", max_items=2)
    assert len(leases) == 2
    body = _bulk(api).json()
    assert (body["replayed"], body["over_cap"]) == (1, 1)
    # Both holders can still hand their items back: a requeue needs no room.
    for lease in leases:
        requeued = api.holder("requeue", lease["item_id"], worker="w1", fence=lease["fence"])
        assert requeued.status_code == 200, requeued.text
    assert _backlog(db) == 3
    assert_backlog_counter_matches(db)


def test_enqueues_and_replays_racing_at_the_cap_never_overshoot_it(api: Api, db: Db) -> None:
    cap = 20
    api.admin.put("/v1/tenants/acme", json={"backlog_cap": cap})
    singles = [dead_letter_of(api, quarantine(api, "qa")) for _ in range(8)]
    for _ in range(8):
        quarantine(api, "qb")
    _fill(api, 4)
    # Room for 16; 12 enqueues, 8 single replays and 8 in bulk want 28.
    outcomes: dict[str, list[int]] = {"enqueue": [], "single": [], "bulk": []}
    lock = threading.Lock()
    stop = threading.Event()
    peak = [0]
    barrier = threading.Barrier(6 + len(singles) + 2)

    def note(kind: str, value: int) -> None:
        with lock:
            outcomes[kind].append(value)

    def client(key: str) -> httpx.Client:
        return api.client(key)

    def enqueuer(n: int) -> None:
        with client(api.keys["worker"]) as http:
            barrier.wait()
            for i in range(2):
                response = http.post(
                    "/v1/tenants/acme/queues/race/items",
                    json={"payload": [n, i]},
                    headers={"Idempotency-Key": f"e-{n}-{i}"},
                )
                assert response.status_code in (201, 429), response.text
                note("enqueue", int(response.status_code == 201))

    def single(dead_letter_id: str) -> None:
        with client(api.keys["operator"]) as http:
            barrier.wait()
            response = http.post(
                f"/v1/tenants/acme/dead-letters/{dead_letter_id}/replay",
                json={},
                headers={"Idempotency-Key": uuid.uuid4().hex},
            )
            assert response.status_code in (200, 429), response.text
            note("single", int(response.status_code == 200))

    def bulk(_: int) -> None:
        with client(api.keys["operator"]) as http:
            barrier.wait()
            response = _bulk(api, "qb", client=http)
            assert response.status_code in (200, 429), response.text
            note("bulk", response.json()["replayed"] if response.status_code == 200 else 0)

    def probe() -> None:
        with psycopg.connect(db.info.dsn, autocommit=True) as conn:
            while not stop.wait(0.005):
                row = conn.execute(
                    "SELECT count(*) AS n FROM work_items WHERE state IN ('ready', 'leased')"
                ).fetchone()
                assert row is not None
                peak[0] = max(peak[0], int(row[0]))

    threads = [threading.Thread(target=enqueuer, args=(n,)) for n in range(6)]
    threads += [threading.Thread(target=single, args=(d,)) for d in singles]
    threads += [threading.Thread(target=bulk, args=(n,)) for n in range(2)]
    watcher = threading.Thread(target=probe)
    watcher.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    stop.set()
    watcher.join(timeout=10)

    admitted = sum(outcomes["enqueue"]) + sum(outcomes["single"]) + sum(outcomes["bulk"])
    assert len(outcomes["enqueue"]) == 12
    assert len(outcomes["single"]) == 8
    assert admitted == cap - 4, outcomes
    assert _backlog(db) == cap
    assert peak[0] <= cap
    assert_backlog_counter_matches(db)
    # Every dead letter is either closed with its item ready, or open with it quarantined.
    rows = db.execute(
        "SELECT d.closed_at IS NULL AS open, w.state::text AS state FROM dead_letters d"
        " JOIN work_items w USING (tenant_id, item_id)"
    ).fetchall()
    assert {(r["open"], r["state"]) for r in rows} <= {(True, "quarantined"), (False, "ready")}
