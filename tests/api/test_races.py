"""Races with real concurrent connections, checked by invariants at the end."""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict

import psycopg

from queue_server.services.leases import Leases
from queue_server.store import transitions
from tests.helpers.api import Api
from tests.helpers.invariants import assert_backlog_counter_matches, assert_ledgers_fold_to_rows
from tests.helpers.server import LiveServer

Db = psycopg.Connection[dict[str, object]]


def _run_threads(count: int, target: object) -> None:
    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]  # type: ignore[arg-type]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)


def test_many_acquirers_lease_each_item_to_one_holder_with_rising_fences(api: Api, db: Db) -> None:
    api.approve("q", 1000)
    total = 150
    api.worker.post(
        "/v1/tenants/acme/queues/q/items:batch",
        json={"items": [{"payload": i} for i in range(total)]},
        headers={"Idempotency-Key": "load"},
    )
    leases: list[tuple[str, int, str, int]] = []  # item, fence, worker, when
    lock = threading.Lock()

    def work(n: int) -> None:
        worker = f"w{n}"
        with api.client(api.keys["worker"]) as client:
            while True:
                got = client.post(
                    "/v1/tenants/acme/queues/q/leases",
                    json={"worker": worker, "lease_ttl": 30, "max_items": 3},
                ).json()["leases"]
                if not got:
                    return
                for lease in got:
                    with lock:
                        leases.append(
                            (lease["item_id"], lease["fence"], worker, time.monotonic_ns())
                        )
                    # Every third item is requeued once, so items are leased more than once.
                    if lease["fence"] == 1 and lease["payload"] % 3 == 0:
                        action, body = "requeue", {"reason": "again"}
                    else:
                        action, body = "complete", {"result": worker}
                    response = client.post(
                        f"/v1/tenants/acme/items/{lease['item_id']}/{action}",
                        json={"worker": worker, "fence": lease["fence"], **body},
                        headers={"Idempotency-Key": uuid.uuid4().hex},
                    )
                    assert response.status_code == 200, response.text

    _run_threads(12, work)

    by_item: defaultdict[str, list[tuple[int, int]]] = defaultdict(list)
    for item_id, fence, _worker, when in leases:
        by_item[item_id].append((when, fence))
    assert len(by_item) == total  # nothing lost
    for item_id, seen in by_item.items():
        fences = [fence for _, fence in sorted(seen)]
        assert fences == sorted(set(fences)), f"fences of {item_id} did not strictly rise: {fences}"
    states = db.execute(
        "SELECT state::text AS s, count(*) AS n FROM work_items GROUP BY 1"
    ).fetchall()
    assert states == [{"s": "completed", "n": total}]
    # Exactly one accepted completion per item.
    completed = db.execute(
        "SELECT count(*) AS n FROM item_events WHERE kind = 'completed'"
    ).fetchone()
    assert completed == {"n": total}
    assert_ledgers_fold_to_rows(db)
    assert_backlog_counter_matches(db)


def test_enqueues_racing_at_the_cap_admit_exactly_the_free_room(api: Api, db: Db) -> None:
    cap = 25
    api.admin.put("/v1/tenants/acme", json={"backlog_cap": cap})
    for _ in range(5):
        api.enqueue()
    admitted: list[int] = []
    refused: list[int] = []
    barrier = threading.Barrier(16)

    def enqueue(n: int) -> None:
        with api.client(api.keys["worker"]) as client:
            barrier.wait()
            for i in range(4):
                response = client.post(
                    "/v1/tenants/acme/queues/q/items:batch",
                    json={"items": [{"payload": [n, i]}] * 2},
                    headers={"Idempotency-Key": f"{n}-{i}"},
                )
                assert response.status_code in (201, 429), response.text
                (admitted if response.status_code == 201 else refused).append(n)

    _run_threads(16, enqueue)
    count = db.execute("SELECT count(*) AS n FROM work_items").fetchone()
    assert count == {"n": cap}
    assert 5 + 2 * len(admitted) == cap
    assert len(refused) == 64 - len(admitted)
    assert_backlog_counter_matches(db)


def test_concurrency_limit_holds_when_many_acquires_race(api: Api, db: Db) -> None:
    api.approve("q", 3)
    api.worker.post(
        "/v1/tenants/acme/queues/q/items:batch",
        json={"items": [{"payload": i} for i in range(40)]},
        headers={"Idempotency-Key": "many"},
    )
    barrier = threading.Barrier(20)
    handed: list[str] = []

    def acquire(n: int) -> None:
        with api.client(api.keys["worker"]) as client:
            barrier.wait()
            got = client.post(
                "/v1/tenants/acme/queues/q/leases",
                json={"worker": f"w{n}", "lease_ttl": 30, "max_items": 2},
            ).json()["leases"]
            handed.extend(lease["item_id"] for lease in got)

    _run_threads(20, acquire)
    assert len(handed) == 3
    assert len(set(handed)) == 3
    leased = db.execute("SELECT count(*) AS n FROM work_items WHERE state = 'leased'").fetchone()
    assert leased == {"n": 3}


def test_an_expired_holder_loses_to_its_successor(api: Api, db: Db) -> None:
    api.approve("q", 5)
    api.enqueue()
    (old,) = api.acquire(worker="old", ttl=1)
    time.sleep(1.1)  # the lease runs out on the database clock
    (new,) = api.acquire(worker="new", ttl=30)
    assert int(str(new["fence"])) > int(str(old["fence"]))
    late = api.holder("complete", old["item_id"], worker="old", fence=old["fence"], result="late")
    assert late.status_code == 409
    assert late.json()["code"] == "stale-fence"
    beat = api.worker.post(
        f"/v1/tenants/acme/items/{old['item_id']}/heartbeat",
        json={"worker": "old", "fence": old["fence"]},
    )
    assert beat.status_code == 409
    ok = api.holder("complete", new["item_id"], worker="new", fence=new["fence"], result="ok")
    assert ok.status_code == 200
    assert ok.json()["result"] == "ok"


def test_backlog_counters_follow_every_transition(api: Api, db: Db) -> None:
    api.approve("q", 50)
    items = [api.enqueue(payload=i, max_acquisitions=1) for i in range(6)]
    leases = api.acquire(max_items=4)
    first, second, third, fourth = leases
    api.holder("complete", first["item_id"], worker="w1", fence=first["fence"])
    api.holder(
        "triage",
        second["item_id"],
        worker="w1",
        fence=second["fence"],
        failure={"class": "X", "message": "m", "transient": False},
        decision="quarantine",
    )
    api.holder("requeue", third["item_id"], worker="w1", fence=third["fence"])
    api.worker.post(
        "/v1/tenants/acme/completions",
        json={"worker": "w1", "completions": [{"item_id": fourth["item_id"], "fence": 1}]},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert_backlog_counter_matches(db)
    # The requeued item has spent its budget of 1: the next acquire quarantines it.
    api.acquire(max_items=10)
    assert_backlog_counter_matches(db)
    dead = api.operator.get("/v1/tenants/acme/dead-letters").json()["dead_letters"]
    assert len(dead) == 2
    for letter in dead:
        replayed = api.operator.post(
            f"/v1/tenants/acme/dead-letters/{letter['dead_letter_id']}/replay",
            json={"max_acquisitions": 2},
            headers={"Idempotency-Key": uuid.uuid4().hex},
        )
        assert replayed.status_code == 200, replayed.text
    assert_backlog_counter_matches(db)
    assert len(items) == 6
    cap = api.operator.get("/v1/tenants/acme").json()
    assert cap["backlog"] == cap["ready"] + cap["leased"]


def test_shared_lock_acquires_never_exceed_a_high_limit(api: Api, db: Db, live: LiveServer) -> None:
    """Far from the limit acquires share the queue lock; near it they go exclusive."""
    leases: Leases = live.app.state.services.leases
    api.approve("q", 60)
    api.worker.post(
        "/v1/tenants/acme/queues/q/items:batch",
        json={"items": [{"payload": i} for i in range(100)]},
        headers={"Idempotency-Key": "hundred"},
    )
    # Three rounds: the tenant's budget is three acquisitions per item.
    for _round in range(3):
        handed: list[str] = []
        barrier = threading.Barrier(20)

        def acquire(
            n: int, barrier: threading.Barrier = barrier, handed: list[str] = handed
        ) -> None:
            with api.client(api.keys["worker"]) as client:
                barrier.wait()
                while True:
                    answer = client.post(
                        "/v1/tenants/acme/queues/q/leases",
                        json={"worker": f"w{n}", "lease_ttl": 30, "max_items": 2},
                    )
                    if answer.status_code == 503 and "retry-after" in answer.headers:
                        continue  # the queue's lock not granted within lock_timeout: again
                    assert answer.status_code == 200, answer.text
                    got = answer.json()["leases"]
                    if not got:
                        return
                    handed.extend(lease["item_id"] for lease in got)

        _run_threads(20, acquire)
        assert len(handed) == 60
        assert len(set(handed)) == 60
        leased = db.execute(
            "SELECT count(*) AS n FROM work_items WHERE state = 'leased'"
        ).fetchone()
        assert leased == {"n": 60}
        # Let every lease run out: the next round takes them over and races again.
        db.execute(
            "UPDATE work_items SET lease_expires_at = now() - interval '1 second'"
            " WHERE state = 'leased'"
        )
    # Near the limit the shared attempts found too little room: the queue went exclusive.
    assert leases.near_limit.recent("acme", "q")


def _announce(database_url: str, max_items: int) -> psycopg.Connection[tuple[object, ...]]:
    """A shared acquire in flight on acme/q that may lease `max_items`: its two locks, held
    until the returned connection's transaction ends."""
    conn = psycopg.connect(database_url)
    conn.execute(
        transitions._SQL["lock_queue_shared"],
        {"tenant": "acme", "queue": "q", "max_items": max_items},
    )
    return conn


def test_a_shared_acquire_leaves_room_for_what_acquires_in_flight_announced(
    api: Api, database_url: str
) -> None:
    """Under the shared lock an acquire leases only while the room covers every acquire in
    flight (each may take its max_items); otherwise it waits for them, exclusively."""
    api.approve("q", 10)
    for n in range(20):
        api.enqueue(payload=n)
    # 8 announced + 2 asked fit in 10: the acquire shares the lock with the one in flight.
    with _announce(database_url, 8):
        began = time.monotonic()
        assert len(api.acquire(max_items=2)) == 2
        assert time.monotonic() - began < 5
    # 7 announced + 2 asked do not fit in the 8 left: it waits for the one in flight to end.
    answered: list[list[dict[str, object]]] = []
    with _announce(database_url, 7) as in_flight:
        waiter = threading.Thread(target=lambda: answered.append(api.acquire(max_items=2)))
        waiter.start()
        waiter.join(timeout=1.0)
        assert answered == [], "leased past what the acquire in flight may still take"
        in_flight.rollback()
        waiter.join(timeout=30)
    assert [len(leases) for leases in answered] == [2]
