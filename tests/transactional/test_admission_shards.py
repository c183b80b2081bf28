"""The backlog cap in admission shards (migration 0028): an admission held open in one
application transaction does not delay another connection's enqueue of the same tenant,
racing admissions, commits, rollbacks and releases never overshoot the cap nor lose room,
and the backlog in place when the migration runs is carried over shard by shard."""

from __future__ import annotations

import random
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from queue_server.client import enqueue_in, errors
from queue_server.infra import migrate
from tests.helpers.api import Api
from tests.helpers.invariants import assert_backlog_counter_matches, assert_ledgers_fold_to_rows
from tests.helpers.roles import Roles

Db = psycopg.Connection[dict[str, Any]]


def _backlog(db: Db, tenant: str = "acme") -> int:
    row = db.execute(
        "SELECT count(*) AS n FROM work_items WHERE tenant_id = %s"
        " AND state IN ('ready', 'leased')",
        (tenant,),
    ).fetchone()
    assert row is not None
    return int(row["n"])


def test_an_enqueue_held_open_in_one_transaction_does_not_delay_anothers(
    api: Api, db: Db, roles: Roles
) -> None:
    app = roles.make("acme")
    holder, other = app.connect(), app.connect()
    try:
        # An application's request transaction enqueues, then goes on with its own work.
        held = enqueue_in(holder, "acme", "emails", {"held": True}, key="held")
        timings: list[float] = []
        failures: list[str] = []

        def enqueue_meanwhile() -> None:
            try:
                for n in range(20):
                    started = time.monotonic()
                    enqueue_in(other, "acme", "emails", {"n": n}, key=f"other-{n}")
                    other.commit()
                    timings.append(time.monotonic() - started)
                started = time.monotonic()
                response = api.worker.post(
                    "/v1/tenants/acme/queues/emails/items",
                    json={"payload": {"rest": True}},
                    headers={"Idempotency-Key": "rest-meanwhile"},
                )
                assert response.status_code == 201, response.text
                timings.append(time.monotonic() - started)
            except Exception as exc:  # the test fails on it below
                failures.append(repr(exc))

        # Under one admission lock per tenant, these waited for the holder's COMMIT.
        meanwhile = threading.Thread(target=enqueue_meanwhile)
        meanwhile.start()
        meanwhile.join(timeout=20)
        assert not meanwhile.is_alive(), "another connection's enqueue waited for the holder"
        assert failures == []
        assert len(timings) == 21
        assert max(timings) < 2.0, timings
        # The holder's transaction is still open: its item is not seen yet, the others are.
        assert _backlog(db) == 21
        holder.commit()
        assert _backlog(db) == 22
        assert db.execute(
            "SELECT state FROM work_items WHERE item_id = %s", (held,)
        ).fetchone() == {"state": "ready"}
    finally:
        holder.close()
        other.close()
    assert_backlog_counter_matches(db)


CAP = 50
RACERS = 24


def _completed_off_shard_zero(db: Db) -> bool:
    row = db.execute(
        "SELECT count(*) AS n FROM work_items"
        " WHERE tenant_id = 'acme' AND state = 'completed' AND admission_shard <> 0"
    ).fetchone()
    return bool(row and row["n"])


def test_racing_admissions_commits_rollbacks_and_releases_keep_the_cap_exact(
    api: Api, db: Db, roles: Roles
) -> None:
    """Application transactions of 1 to 3 items hold their admission a moment, a fifth of
    them roll back, REST enqueues and completions run beside them, and one transaction
    stays open across the whole race: the backlog never passes the cap, and once the race
    is over the cap's whole room is still there to take, to the last item."""
    assert api.admin.put("/v1/tenants/acme", json={"backlog_cap": CAP}).status_code == 200
    app = roles.make("acme")
    long_open = app.connect()
    long_items = [{"payload": {"long": n}} for n in range(3)]
    long_open.execute(
        "SELECT queue_server.enqueue_many('acme', 'q', %s::jsonb, 'long')",
        (psycopg.types.json.Jsonb(long_items),),
    )
    stop = time.monotonic() + 4.0
    lock = threading.Lock()
    peaks: list[int] = []
    failures: list[str] = []
    refused = [0]

    def application(n: int) -> None:
        rng = random.Random(n)
        with app.connect() as conn:
            # An application's own bound on waits: room held by the transaction left open
            # is waited for a second, not the 10 s of a session without one.
            conn.execute("SET lock_timeout = '1s'")
            conn.commit()
            while time.monotonic() < stop:
                size = rng.randint(1, 3)
                items = [{"payload": {"racer": n}} for _ in range(size)]
                try:
                    conn.execute(
                        "SELECT queue_server.enqueue_many('acme', 'q', %s::jsonb, %s)",
                        (psycopg.types.json.Jsonb(items), uuid.uuid4().hex),
                    )
                    time.sleep(rng.uniform(0, 0.01))
                    if rng.random() < 0.2:
                        conn.rollback()
                    else:
                        conn.commit()
                except psycopg.Error as exc:
                    conn.rollback()
                    if exc.sqlstate != "QS429":
                        with lock:
                            failures.append(repr(exc))
                    with lock:
                        refused[0] += 1

    def rest(n: int) -> None:
        with api.client(api.keys["worker"]) as client:
            while time.monotonic() < stop:
                response = client.post(
                    "/v1/tenants/acme/queues/q/items",
                    json={"payload": {"rest": n}},
                    headers={"Idempotency-Key": uuid.uuid4().hex},
                )
                if response.status_code != 201 and response.json().get("code") != (
                    "backlog-cap-reached"
                ):
                    with lock:
                        failures.append(response.text)

    def releases() -> None:
        # Items leave the backlog (completed) and give their room back to their shards.
        with api.client(api.keys["worker"]) as client:
            while time.monotonic() < stop:
                leases = client.post(
                    "/v1/tenants/acme/queues/q/leases",
                    json={"worker": "w1", "max_items": 4},
                ).json()
                for lease in leases.get("leases", []):
                    done = client.post(
                        f"/v1/tenants/acme/items/{lease['item_id']}/complete",
                        json={"worker": "w1", "fence": lease["fence"], "result": None},
                        headers={"Idempotency-Key": uuid.uuid4().hex},
                    )
                    if done.status_code != 200:
                        with lock:
                            failures.append(done.text)
                time.sleep(0.05)

    def watch() -> None:
        with psycopg.connect(db.info.dsn, autocommit=True, row_factory=dict_row) as conn:
            while time.monotonic() < stop:
                peaks.append(_backlog(conn))
                time.sleep(0.01)

    threads = [threading.Thread(target=application, args=(n,)) for n in range(RACERS)]
    threads += [threading.Thread(target=rest, args=(n,)) for n in range(4)]
    threads += [threading.Thread(target=releases), threading.Thread(target=watch)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert failures == []
    assert refused[0] > 0, "the race never reached the cap"
    # The long transaction's 3 items were invisible all along; their room was held.
    assert max(peaks) <= CAP - 3, max(peaks)
    # A release from a shard other than 0 at least, whatever the race managed on a loaded
    # machine: each release gives its room back to its own shard, which the counters show.
    with api.client(api.keys["worker"]) as client:
        for _ in range(CAP):
            if _completed_off_shard_zero(db):
                break
            for lease in client.post(
                "/v1/tenants/acme/queues/q/leases", json={"worker": "w1", "max_items": 4}
            ).json()["leases"]:
                done = client.post(
                    f"/v1/tenants/acme/items/{lease['item_id']}/complete",
                    json={"worker": "w1", "fence": lease["fence"], "result": None},
                    headers={"Idempotency-Key": uuid.uuid4().hex},
                )
                assert done.status_code == 200, done.text
    assert _completed_off_shard_zero(db)
    long_open.commit()
    long_open.close()
    assert _backlog(db) <= CAP
    # The room left is all there: single enqueues take it to the cap exactly, then no more.
    with app.connect() as conn:
        filled = 0
        while True:
            try:
                enqueue_in(conn, "acme", "q", {"fill": filled}, key=f"fill-{filled}")
                conn.commit()
                filled += 1
            except errors.BacklogCapReachedError:
                conn.rollback()
                break
            assert filled <= CAP
    assert _backlog(db) == CAP
    assert api.operator.get("/v1/tenants/acme").json()["backlog"] == CAP
    assert_backlog_counter_matches(db)
    assert_ledgers_fold_to_rows(db)


def test_the_migration_deals_the_backlog_over_the_shards_and_keeps_the_cap(
    api: Api, db: Db, database_url: str
) -> None:
    migrate.downgrade(database_url, "0027")
    db.execute(
        "INSERT INTO tenants (tenant_id, backlog_cap, default_max_acquisitions,"
        " default_lease_ttl) VALUES ('acme', 100, 3, interval '30 seconds')"
        " ON CONFLICT (tenant_id) DO UPDATE SET backlog_cap = 100"
    )
    db.execute(
        "INSERT INTO work_items (tenant_id, queue, payload, state, max_acquisitions)"
        " SELECT 'acme', 'q', to_jsonb(g), 'ready', 3 FROM generate_series(1, 70) AS g"
    )
    db.execute(
        "INSERT INTO work_items (tenant_id, queue, payload, state, fence, max_acquisitions)"
        " SELECT 'acme', 'done', to_jsonb(g), 'completed', 1, 3"
        " FROM generate_series(1, 5) AS g"
    )
    db.execute(
        "INSERT INTO counter_deltas (tenant_id, queue, admitted, released, completed)"
        " VALUES ('acme', 'q', 70, 0, 0), ('acme', 'done', 5, 5, 5)"
    )
    migrate.upgrade(database_url)
    shards = db.execute(
        "SELECT admission_shard AS shard, count(*) AS n FROM work_items"
        " WHERE state = 'ready' GROUP BY admission_shard ORDER BY admission_shard"
    ).fetchall()
    # 70 items over 32 shards: 3 on the first 6, 2 on the rest; within each share of 100.
    assert [row["n"] for row in shards] == [3] * 6 + [2] * 26
    assert_backlog_counter_matches(db)
    figures = api.operator.get("/v1/tenants/acme").json()
    assert (figures["backlog"], figures["completed"]) == (70, 5), figures
    # The cap holds across the shards: 30 more, then no more.
    batch = api.worker.post(
        "/v1/tenants/acme/queues/q/items:batch",
        json={"items": [{"payload": n} for n in range(30)]},
        headers={"Idempotency-Key": "to-the-cap"},
    )
    assert batch.status_code == 201, batch.text
    over = api.worker.post(
        "/v1/tenants/acme/queues/q/items",
        json={"payload": "one more"},
        headers={"Idempotency-Key": "over"},
    )
    assert over.status_code == 429, over.text
    assert _backlog(db) == 100
    assert_backlog_counter_matches(db)


def test_room_held_only_by_open_admissions_is_waited_for_up_to_the_lock_timeout(
    api: Api, db: Db, database_url: str, roles: Roles
) -> None:
    """With every shard held by transactions not yet committed, an enqueue polls for room
    no longer than its session's lock_timeout, then is refused saying why; once they let
    go, it is admitted."""
    app = roles.make("acme")
    with psycopg.connect(database_url) as holder, app.connect() as conn:
        holder.execute("SELECT 1 FROM admission_shards WHERE tenant_id = 'acme' FOR NO KEY UPDATE")
        conn.execute("SET lock_timeout = '300ms'")
        conn.execute("SET statement_timeout = '10s'")  # a poll without end fails otherwise
        conn.commit()
        started = time.monotonic()
        with pytest.raises(errors.BacklogCapReachedError) as refused:
            enqueue_in(conn, "acme", "q", {"n": 1}, key="waits")
        assert "not yet committed" in (refused.value.detail or ""), refused.value.detail
        waited = time.monotonic() - started
        assert 0.25 <= waited < 5.0, waited
        conn.rollback()
        holder.rollback()
        enqueue_in(conn, "acme", "q", {"n": 1}, key="waits")
        conn.commit()
    assert _backlog(db) == 1


def test_a_cap_lowered_below_the_backlog_refuses_where_a_shard_still_has_room(
    api: Api, db: Db, roles: Roles
) -> None:
    """Each shard's share follows the cap, so after a cap is lowered an empty shard has room
    of its own; the tenant's committed backlog still refuses the enqueue."""
    app = roles.make("acme")
    with app.connect() as conn:
        conn.execute(
            "SELECT queue_server.enqueue_many('acme', 'q', %s::jsonb, 'two')",
            (psycopg.types.json.Jsonb([{"payload": 1}, {"payload": 2}]),),
        )
        conn.commit()
        row = db.execute("SELECT DISTINCT admission_shard AS s FROM work_items").fetchone()
        assert row is not None
        # A cap whose shares include an empty shard: shard 0 alone, or shards 0 and 1.
        lowered = 1 if row["s"] != 0 else 2
        db.execute("UPDATE tenants SET backlog_cap = %s WHERE tenant_id = 'acme'", (lowered,))
        with pytest.raises(errors.BacklogCapReachedError) as refused:
            enqueue_in(conn, "acme", "q", {"n": 3}, key="three")
        assert refused.value.detail == f"Backlog 2 + 1 new would exceed the cap of {lowered}."
        conn.rollback()
    assert _backlog(db) == 2


def test_an_enqueue_waiting_for_held_room_looks_again_less_and_less_often(
    api: Api, database_url: str, roles: Roles
) -> None:
    """A session waiting for room that open transactions hold looks again at growing
    intervals, up to 50 ms: in a 1 s wait, about 25 looks (every 5 ms, 200 looks: sessions
    waiting on a forgotten transaction kept a core of the database busy)."""
    app = roles.make("acme")
    with psycopg.connect(database_url) as holder, app.connect() as conn:
        shards = holder.execute(
            "SELECT 1 FROM admission_shards WHERE tenant_id = 'acme' FOR NO KEY UPDATE"
        ).rowcount
        conn.execute("SET lock_timeout = '1s'")
        conn.execute("SAVEPOINT waiting")
        started = time.monotonic()
        with pytest.raises(errors.BacklogCapReachedError):
            enqueue_in(conn, "acme", "q", {"n": 1}, key="waits")
        assert time.monotonic() - started >= 0.95
        conn.execute("ROLLBACK TO SAVEPOINT waiting")
        # Each look reads every shard of the tenant, all held (this transaction's reads).
        row = conn.execute(
            "SELECT pg_stat_get_xact_tuples_fetched('admission_shards'::regclass)"
        ).fetchone()
        assert row is not None
        assert isinstance(row[0], int)
        looks = row[0] // shards
        assert 10 <= looks <= 40, f"{looks} looks in a 1 s wait"
        conn.rollback()
        holder.rollback()
