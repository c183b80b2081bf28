"""The counters are append-only deltas folded into bases: every transition's delta is counted
once, whether its transaction commits before, during or after a fold, the backlog cap stays
exact while folds run, and under a held snapshot a reader's cost does not grow with the
work done since the snapshot began."""

from __future__ import annotations

import json
import random
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from queue_server.background.sweeper import FOLD_LOCK
from queue_server.infra import migrate
from queue_server.store import counters, queues, sweeps, transitions
from tests.helpers.api import Api
from tests.helpers.database import held_snapshot
from tests.helpers.invariants import assert_backlog_counter_matches, assert_ledgers_fold_to_rows

Db = psycopg.Connection[dict[str, object]]

FOLD = counters._SQL["fold"]


def _fold(conn: Db) -> dict[str, Any] | None:
    """One fold as the sweeper runs it: in a transaction holding the fold's lock; None when
    the server's own sweeper holds it."""
    with conn.transaction():
        locked = conn.execute(
            "SELECT pg_try_advisory_xact_lock(%s, %s) AS locked",
            (sweeps.SWEEP_LOCK_CLASS, FOLD_LOCK),
        ).fetchone()
        if not locked or not locked["locked"]:
            return None
        return conn.execute(FOLD, {}).fetchone()


def _horizon(db: Db) -> object:
    row = db.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text AS x").fetchone()
    assert row is not None
    return row["x"]


def _totals(db: Db, tenant: str = "acme") -> dict[str, dict[str, int]]:
    rows = db.execute(
        "SELECT * FROM counter_totals WHERE tenant_id = %s ORDER BY queue", (tenant,)
    ).fetchall()
    return {str(r["queue"]): {k: int(v) for k, v in r.items() if isinstance(v, int)} for r in rows}


def _tenant(db: Db, tenant: str = "acme", cap: int = 1000) -> None:
    db.execute(
        "INSERT INTO tenants (tenant_id, backlog_cap, default_max_acquisitions,"
        " default_lease_ttl) VALUES (%s, %s, 3, interval '30 seconds')",
        (tenant, cap),
    )


def _run_threads(targets: list[Callable[[], None]]) -> None:
    failures: list[BaseException] = []

    def guarded(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as exc:  # reported in the test's own thread
                failures.append(exc)

        return run

    threads = [threading.Thread(target=guarded(t)) for t in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    assert not failures, failures


def test_a_delta_committed_after_a_fold_began_is_counted_once(db: Db, database_url: str) -> None:
    _tenant(db)
    # Committed before the transaction below began: folded by the first fold.
    db.execute("INSERT INTO counter_deltas (tenant_id, queue, failed) VALUES ('acme', 'q', 5)")
    with psycopg.connect(database_url, row_factory=dict_row) as late:
        # A transition's transaction, open across the fold: its delta is not visible to it.
        late.execute(
            "INSERT INTO counter_deltas (tenant_id, queue, completed) VALUES ('acme', 'q', 1)"
        )
        mine = late.execute("SELECT pg_current_xact_id()::text AS xid").fetchone()
        assert mine is not None
        # Committed after it began: visible to the fold, at a higher id.
        db.execute(
            "INSERT INTO counter_deltas (tenant_id, queue, completed) VALUES ('acme', 'q', 10)"
        )
        # Transactions older than it (of any database of the cluster: ids are the
        # cluster's) end; from then on it holds the horizon.
        deadline = time.monotonic() + 30
        while _horizon(db) != mine["xid"]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        folded = _fold(db)
        assert folded is not None
        # The open transaction is the oldest running one: the new base is as of its id, with
        # the delta below it; what committed after it began waits for the next fold.
        assert (folded["deltas"], folded["bases"], folded["as_of_xid"]) == (1, 1, mine["xid"])
        assert (_totals(db)["q"]["completed"], _totals(db)["q"]["failed"]) == (10, 5)
        late.commit()
    assert (_totals(db)["q"]["completed"], _totals(db)["q"]["failed"]) == (11, 5)
    again = _fold(db)
    assert again is not None
    assert (again["deltas"], again["bases"]) == (2, 1)
    assert (_totals(db)["q"]["completed"], _totals(db)["q"]["failed"]) == (11, 5)
    left = db.execute("SELECT count(*) AS n FROM counter_deltas").fetchone()
    assert left == {"n": 0}
    bases = db.execute("SELECT count(*) AS n FROM counter_bases").fetchone()
    assert bases == {"n": 1}
    # Nothing to fold: the base stays, with the same totals.
    idle = _fold(db)
    assert idle is not None
    assert (idle["deltas"], idle["bases"]) == (0, 0)
    assert (_totals(db)["q"]["completed"], _totals(db)["q"]["failed"]) == (11, 5)


def _tenant_version(db: Db) -> object:
    row = db.execute("SELECT ctid::text AS v FROM tenants WHERE tenant_id = 'acme'").fetchone()
    assert row is not None
    return row["v"]


def _states(db: Db) -> dict[tuple[str, str], int]:
    rows = db.execute(
        "SELECT queue, state::text AS state, count(*) AS n FROM work_items GROUP BY 1, 2"
    ).fetchall()
    return {(str(r["queue"]), str(r["state"])): int(str(r["n"])) for r in rows}


def test_racing_transitions_and_folds_leave_figures_equal_to_the_items_states(
    api: Api, db: Db, database_url: str
) -> None:
    api.admin.put("/v1/tenants/acme", json={"backlog_cap": 100_000})
    names = ("q1", "q2")
    for name in names:
        api.approve(name, 100)
    stop = threading.Event()
    folds: list[int] = []
    version = _tenant_version(db)

    def produce(n: int) -> Callable[[], None]:
        def run() -> None:
            with api.client(api.keys["worker"]) as client:
                for i in range(25):
                    response = client.post(
                        f"/v1/tenants/acme/queues/{names[(n + i) % 2]}/items:batch",
                        json={"items": [{"payload": [n, i, k]} for k in range(6)]},
                        headers={"Idempotency-Key": f"p{n}-{i}"},
                    )
                    assert response.status_code == 201, response.text

        return run

    def work(n: int) -> Callable[[], None]:
        def run() -> None:
            rng = random.Random(n)
            worker = f"w{n}"
            idle = 0
            with api.client(api.keys["worker"]) as client:
                while idle < 20:
                    name = names[rng.randrange(2)]
                    got = client.post(
                        f"/v1/tenants/acme/queues/{name}/leases",
                        json={"worker": worker, "lease_ttl": 30, "max_items": 4},
                    ).json()["leases"]
                    if not got:
                        idle += 1
                        time.sleep(0.05)
                        continue
                    idle = 0
                    for lease in got:
                        roll = rng.random()
                        base = {"worker": worker, "fence": lease["fence"]}
                        if roll < 0.6:
                            action, body = "complete", {**base, "result": n}
                        elif roll < 0.8:
                            action, body = "requeue", {**base, "reason": "again", "delay": 0}
                        else:
                            action = "triage"
                            body = {
                                **base,
                                "decision": "quarantine",
                                "failure": {"class": "Boom", "message": "x", "transient": False},
                            }
                        response = client.post(
                            f"/v1/tenants/acme/items/{lease['item_id']}/{action}",
                            json=body,
                            headers={"Idempotency-Key": uuid.uuid4().hex},
                        )
                        # A cancel may beat the holder to its item.
                        assert response.status_code in (200, 409), response.text

        return run

    def operate() -> None:
        with (
            api.client(api.keys["operator"]) as client,
            psycopg.connect(database_url, autocommit=True) as conn,
        ):
            for _ in range(40):
                ready = conn.execute(
                    "SELECT item_id::text FROM work_items WHERE state IN ('ready', 'leased')"
                    " ORDER BY random() LIMIT 2"
                ).fetchall()
                for (item_id,) in ready:
                    response = client.post(
                        f"/v1/tenants/acme/items/{item_id}/cancel",
                        json={"reason": "race"},
                        headers={"Idempotency-Key": uuid.uuid4().hex},
                    )
                    assert response.status_code in (200, 409), response.text
                letters = client.get(
                    "/v1/tenants/acme/dead-letters", params={"kind": "item", "limit": 3}
                ).json()["dead_letters"]
                for letter in letters:
                    if letter.get("closed_at") is None:
                        response = client.post(
                            f"/v1/tenants/acme/dead-letters/{letter['dead_letter_id']}/replay",
                            json={},
                            headers={"Idempotency-Key": uuid.uuid4().hex},
                        )
                        assert response.status_code in (200, 409), response.text
                time.sleep(0.05)

    def fold() -> None:
        with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as conn:
            while not stop.is_set():
                done = _fold(conn)
                if done is not None:
                    folds.append(int(str(done["deltas"])))
                time.sleep(0.01)

    folder = threading.Thread(target=fold)
    folder.start()
    try:
        _run_threads([produce(0), produce(1), work(0), work(1), work(2), work(3), operate])
    finally:
        stop.set()
        folder.join(timeout=30)
    assert sum(folds) > 50, folds  # folds ran all along, and folded deltas

    states = _states(db)
    totals = _totals(db)
    for name in names:
        figures = {
            q["queue"]: q for q in api.operator.get("/v1/tenants/acme/queues").json()["queues"]
        }[name]
        assert figures["states"]["completed"] == states.get((name, "completed"), 0)
        assert figures["states"]["cancelled"] == states.get((name, "cancelled"), 0)
        assert figures["completions"]["total"] == states.get((name, "completed"), 0)
        letters = db.execute(
            "SELECT count(*) AS n FROM dead_letters WHERE queue = %s AND kind = 'item'", (name,)
        ).fetchone()
        assert letters is not None
        assert figures["quarantines"] == letters["n"]
        # Quarantined by triage (a failure) or at acquire past the budget (none).
        triaged = db.execute(
            "SELECT count(*) AS n FROM item_events e JOIN work_items w USING (tenant_id, item_id)"
            " WHERE w.queue = %s AND e.kind = 'triaged'",
            (name,),
        ).fetchone()
        assert triaged is not None
        assert figures["failures"]["total"] == triaged["n"]
        assert totals[name]["admitted"] - totals[name]["released"] == states.get(
            (name, "ready"), 0
        ) + states.get((name, "leased"), 0)
    backlog = api.admin.get("/v1/tenants/acme").json()["backlog"]
    assert backlog == sum(n for (_, s), n in states.items() if s in ("ready", "leased"))
    assert_backlog_counter_matches(db)
    assert_ledgers_fold_to_rows(db)
    assert states.get(("q1", "completed"), 0) > 0
    assert states.get(("q2", "cancelled"), 0) > 0
    # The tenant's row was locked by every admission and replay, never updated: the same
    # version as before the run, no chain for a foreign-key check to walk.
    assert _tenant_version(db) == version


def test_enqueues_racing_at_the_cap_while_folds_run_admit_exactly_the_room(
    api: Api, db: Db, database_url: str
) -> None:
    cap = 60
    api.admin.put("/v1/tenants/acme", json={"backlog_cap": cap})
    api.approve("q", 10)
    for _ in range(10):
        api.enqueue()
    # Ten leased and completed: released, while admissions race.
    for lease in api.acquire(max_items=10):
        api.holder("complete", lease["item_id"], worker="w1", fence=lease["fence"])
    admitted: list[int] = []
    stop = threading.Event()

    def enqueue(n: int) -> Callable[[], None]:
        def run() -> None:
            with api.client(api.keys["worker"]) as client:
                for i in range(8):
                    response = client.post(
                        "/v1/tenants/acme/queues/q/items:batch",
                        json={"items": [{"payload": [n, i]}] * 2},
                        headers={"Idempotency-Key": f"{n}-{i}"},
                    )
                    assert response.status_code in (201, 429), response.text
                    if response.status_code == 201:
                        admitted.append(n)

        return run

    def fold() -> None:
        with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as conn:
            while not stop.is_set():
                _fold(conn)

    folder = threading.Thread(target=fold)
    folder.start()
    try:
        _run_threads([enqueue(n) for n in range(8)])
    finally:
        stop.set()
        folder.join(timeout=30)
    ready = db.execute("SELECT count(*) AS n FROM work_items WHERE state = 'ready'").fetchone()
    assert ready == {"n": cap}
    assert 2 * len(admitted) == cap
    assert_backlog_counter_matches(db)


def _leased_items(db: Db, n: int) -> list[str]:
    ids = [str(uuid.uuid4()) for _ in range(n)]
    with db.cursor() as cur:
        cur.executemany(
            "INSERT INTO work_items (tenant_id, item_id, queue, payload, state, fence,"
            " acquisition_count, max_acquisitions, lease_holder, lease_expires_at,"
            " lease_deadline_at, leased_at, available_at)"
            " VALUES ('acme', %s, 'q', 'null', 'leased', 1, 1, 3, 'w1',"
            " now() + interval '1 hour', now() + interval '1 hour', now(), now())",
            [(i,) for i in ids],
        )
    return ids


def _buffers(db: Db, statement: str, params: dict[str, object]) -> int:
    """Shared buffers hit and read by one run of `statement`, from EXPLAIN (ANALYZE, BUFFERS)."""
    plan = db.execute(
        ("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement).encode(), params
    ).fetchone()
    assert plan is not None
    top: Any = next(iter(plan.values()))
    if isinstance(top, str):
        top = json.loads(top)
    node = top[0]["Plan"]
    return int(node["Shared Hit Blocks"]) + int(node["Shared Read Blocks"])


def _complete(item_id: str) -> dict[str, object]:
    return {
        "tenant": "acme",
        "item_id": item_id,
        "fence": 1,
        "worker": "w1",
        "key_id": "k1",
        "result": Jsonb(None),
    }


def _admission(n: int) -> dict[str, object]:
    """One admission of `n` items to the queue `in` (not the queue whose figures are read)."""
    return {
        "tenant": "acme",
        "queue": "in",
        "items": Jsonb([{"item_id": str(uuid.uuid4())} for _ in range(n)]),
        "actor": "producer",
        "attempt_cap": 5,
        "backlog_ceiling": 10**9,
    }


def test_under_a_held_snapshot_reading_the_figures_and_the_backlog_does_not_grow_with_work(
    db: Db, database_url: str
) -> None:
    """A completion and an admission per step: each inserts a delta, none updates a row
    that every reader, or every foreign-key check of an enqueue, has to walk."""
    _tenant(db, cap=10**6)
    readers: dict[str, tuple[str, dict[str, object]]] = {
        "finished_counts": (queues._SQL["finished_counts"], {"tenant": "acme"}),
        "queue_series": (
            queues._SQL["queue_series"],
            {"tenant": "acme", "queue": "q", "points": 1, "step": "1 minute", "aligned": False},
        ),
        # What an admission reads under its shard's lock (queue_server.admission_shards).
        "backlog": (
            "SELECT sum(backlog) FILTER (WHERE shard = 0), sum(backlog) FROM admission_backlogs"
            " WHERE tenant_id = %(tenant)s",
            {"tenant": "acme"},
        ),
    }
    complete, enqueue = transitions._SQL["complete"], transitions._SQL["enqueue"]
    version = _tenant_version(db)
    measured: dict[int, dict[str, int]] = {}
    with (
        held_snapshot(database_url),
        psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as conn,
    ):
        done = admitted = 0
        for mark in (1000, 5000):
            for i, item_id in enumerate(_leased_items(db, mark - done)):
                conn.execute(complete, _complete(item_id))
                conn.execute(enqueue, _admission(1))
                admitted += 1
                # The sweeper's fold, every so often (every second at this pace).
                if i % 250 == 249:
                    assert _fold(conn) is not None
            done = mark
            assert _fold(conn) is not None
            # The deltas since the fold: a few transitions more, as a reader meets them.
            for item_id in _leased_items(db, 5):
                conn.execute(complete, _complete(item_id))
            done += 5
            # What the held snapshot keeps stays; the planner's figures count it.
            db.execute("VACUUM ANALYZE counter_deltas, counter_bases, work_items, tenants")
            measured[mark] = {name: _buffers(db, sql, p) for name, (sql, p) in readers.items()}
            # A batch enqueue: a foreign-key check of the tenant's row per item, then the
            # admission under its lock.
            measured[mark]["enqueue_100"] = _buffers(db, enqueue, _admission(100))
            admitted += 100
            assert _totals(db)["q"]["completed"] == done
            assert _totals(db)["in"]["admitted"] == admitted
            assert _tenant_version(db) == version  # no admission updated the tenant's row
    for name in readers:
        assert measured[5000][name] <= measured[1000][name] + 2, (name, measured)
        assert measured[5000][name] < 40, (name, measured)
    assert measured[5000]["enqueue_100"] <= measured[1000]["enqueue_100"] * 1.2, measured
    # 10,200 admissions and none updated the tenant's row: one version still.
    assert _tenant_version(db) == version


def test_a_deleted_tenant_takes_its_counters_and_one_made_again_starts_from_nothing(
    api: Api, db: Db
) -> None:
    for _ in range(3):
        api.enqueue()
    (lease,) = api.acquire()
    api.holder("complete", lease["item_id"], worker="w1", fence=lease["fence"])
    with psycopg.connect(db.info.dsn, autocommit=True, row_factory=dict_row) as conn:
        assert _fold(conn) is not None
    api.enqueue()  # a delta since the fold too
    assert api.admin.delete("/v1/tenants/acme").status_code == 204
    left = db.execute(
        "SELECT (SELECT count(*) FROM counter_deltas) + (SELECT count(*) FROM counter_bases) AS n"
    ).fetchone()
    assert left == {"n": 0}
    again = api.admin.put("/v1/tenants/acme", json={"backlog_cap": 10})
    assert again.status_code in (200, 201), again.text
    assert api.admin.get("/v1/tenants/acme").json()["backlog"] == 0
    assert _totals(db) == {}


def test_the_migration_carries_the_counters_over_as_the_first_base_and_back(
    db: Db, database_url: str
) -> None:
    migrate.downgrade(database_url, "0022")
    _tenant(db)
    db.execute("UPDATE tenants SET admitted = 7")
    db.execute("INSERT INTO backlog_releases VALUES ('acme', 0, 1), ('acme', 5, 3)")
    db.execute(
        "INSERT INTO queue_counters (tenant_id, queue, shard, completed, failed, quarantined,"
        " cancelled, purged_completed, purged_cancelled, timed_completions, completion_ms)"
        " VALUES ('acme', 'q1', 0, 5, 2, 1, 1, 1, 0, 5, 500),"
        " ('acme', 'q1', 3, 1, 0, 0, 0, 0, 0, 1, 100)"
    )
    for queue, state in (("q1", "ready"), ("q1", "ready"), ("q2", "leased")):
        db.execute(
            "INSERT INTO work_items (tenant_id, queue, payload, state, fence, lease_holder,"
            " lease_expires_at, lease_deadline_at, max_acquisitions)"
            " VALUES ('acme', %s, 'null', %s::item_state, 1,"
            " CASE WHEN %s = 'leased' THEN 'w1' END,"
            " CASE WHEN %s = 'leased' THEN now() + interval '1 hour' END,"
            " CASE WHEN %s = 'leased' THEN now() + interval '1 hour' END, 3)",
            (queue, state, state, state, state),
        )
    migrate.upgrade(database_url)
    totals = _totals(db)
    assert totals["q1"] == {
        "admitted": 2,
        "released": 0,
        "completed": 6,
        "failed": 2,
        "quarantined": 1,
        "cancelled": 1,
        "purged_completed": 1,
        "purged_cancelled": 0,
        "timed_completions": 6,
        "completion_ms": 600,
    }
    # Each queue's backlog is its ready and leased items: the tenant's 7 - 4 in all.
    assert (totals["q2"]["admitted"], totals["q2"]["released"]) == (1, 0)
    assert_backlog_counter_matches(db)
    migrate.downgrade(database_url, "0022")
    back = db.execute(
        "SELECT t.admitted - (SELECT sum(released) FROM backlog_releases) AS backlog,"
        " (SELECT sum(completed) FROM queue_counters WHERE queue = 'q1') AS completed"
        " FROM tenants t"
    ).fetchone()
    assert back == {"backlog": 3, "completed": 6}
