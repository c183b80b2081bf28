"""The watcher outbox cap (watcher-delivery/backpressure, outbox-cap): at most the cap's
pending deliveries per watcher; past it the watcher is backlogged (API, CLI, console,
/metrics) and its events wait in the ledger, until a deliverer writes them, in ledger order
and once each, as its outbox drains. Under a policy version of its own with a cap of 20."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from queue_server.background.deliverer import Deliverer
from queue_server.settings import Settings
from queue_server.store import outbox, transitions
from tests.helpers.api import Api, policy_file
from tests.helpers.cli import Cli
from tests.helpers.items import sample
from tests.helpers.server import LiveServer
from tests.helpers.watchers import Db, ModeReceiver, deliver, register, wait_until

CAP = 20
CELL: dict[str, dict[str, object]] = {
    "watcher-delivery": {"backpressure": {"mechanism": "outbox-cap", "max-queued": CAP}}
}


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    """The watcher tests' settings (tests/watchers/conftest.py) under a cap of CAP."""
    policy = policy_file(tmp_path / "outbox-cap.json", CELL, version="test.outbox-cap-20")
    return settings.model_copy(update={"policy": str(policy)})


def _pending(db: Db, watcher_id: str) -> int:
    row = db.execute(
        "SELECT count(*) AS n FROM outbox_deliveries WHERE watcher_id = %s AND state = 'pending'",
        (watcher_id,),
    ).fetchone()
    assert row is not None
    return int(row["n"])


def _enqueue_batch(api: Api, numbers: range) -> None:
    response = api.worker.post(
        f"/v1/tenants/{api.tenant}/queues/q/items:batch",
        json={"items": [{"payload": {"n": n}} for n in numbers]},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert response.status_code == 201, response.text


def _received(receiver: ModeReceiver) -> list[int]:
    """The payload numbers of the events the receiver got, in arrival order."""
    return [json.loads(r.body)["item"]["payload"]["n"] for r in receiver.hook_requests()]


def _ledger_order(db: Db) -> list[int]:
    """The payload numbers of the enqueued events in the ledger's order: by instant, then
    (the events of one statement) by item, as the transition writes their rows."""
    rows = db.execute(
        "SELECT (w.payload->>'n')::int AS n FROM item_events e"
        " JOIN work_items w USING (tenant_id, item_id)"
        " WHERE e.kind = 'enqueued' ORDER BY e.at, e.item_id, e.seq"
    ).fetchall()
    return [int(r["n"]) for r in rows]


def _watcher(api: Api, watcher_id: str) -> dict[str, Any]:
    response = api.operator.get(f"/v1/tenants/{api.tenant}/watchers/{watcher_id}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _cli(api: Api, tmp_path: Path) -> Cli:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "QUEUE_SERVER_URL": api.url,
        "QUEUE_SERVER_DATA_DIR": str(tmp_path / "data"),
        "COLUMNS": "200",
        "NO_COLOR": "1",
        # The command runs the code under test (a worktree's, when PYTHONPATH names one).
        **({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}),
    }
    return Cli(env=env, api=api, cwd=tmp_path)


def test_a_flood_leaves_the_cap_pending_marks_the_watcher_and_drains_once_each_in_order(
    api: Api,
    live: LiveServer,
    db: Db,
    receiver: ModeReceiver,
    settings: Settings,
    database_url: str,
    tmp_path: Path,
) -> None:
    watcher_id = register(api, receiver.url("/hook"), events=["item.enqueued"])["watcher_id"]
    labels = {"tenant": "acme", "watcher": watcher_id}
    assert sample(api.admin.get("/metrics").text, "queue_server_watcher_backlogged", **labels) == 0
    for n in range(10):
        api.enqueue("q", {"n": n})
    # One statement crosses the cap: ten of its rows fit, the other ten do not.
    _enqueue_batch(api, range(10, 30))
    assert _pending(db, watcher_id) == CAP
    shown = _watcher(api, watcher_id)
    assert shown["backlogged"] is True
    assert shown["backlogged_at"] is not None
    assert shown["backlog_from"] is not None
    assert shown["deliveries"]["pending"] == CAP
    [listed] = api.operator.get("/v1/tenants/acme/watchers").json()["watchers"]
    assert listed["backlogged"] is True
    assert sample(api.admin.get("/metrics").text, "queue_server_watcher_backlogged", **labels) == 1
    cli = _cli(api, tmp_path)
    assert "active, backlogged" in cli.run("watchers", "list").stdout
    assert "backlogged" in cli.run("watchers", "show", watcher_id).stdout
    # Backlogged, each new event waits in the ledger.
    for n in range(30, 35):
        api.enqueue("q", {"n": n})
    assert _pending(db, watcher_id) == CAP

    for _ in range(10):
        deliver(settings, database_url)
        assert _pending(db, watcher_id) <= CAP
        if not _watcher(api, watcher_id)["backlogged"] and _pending(db, watcher_id) == 0:
            break
    assert sorted(_received(receiver)) == list(range(35))
    assert _received(receiver) == _ledger_order(db)
    keys = [r.headers["webhook-id"] for r in receiver.hook_requests()]
    assert len(set(keys)) == 35
    events = {json.loads(r.body)["event"] for r in receiver.hook_requests()}
    assert events == {"item.enqueued"}
    shown = _watcher(api, watcher_id)
    assert (shown["backlogged"], shown["backlogged_at"], shown["backlog_from"]) == (
        False,
        None,
        None,
    )
    assert shown["deliveries"]["delivered"] == 35
    assert sample(api.admin.get("/metrics").text, "queue_server_watcher_backlogged", **labels) == 0
    # Caught up: the next event is written by its transition again.
    api.enqueue("q", {"n": 35})
    assert _pending(db, watcher_id) == 1


def test_the_cap_holds_when_many_connections_write_one_watchers_rows_at_once(
    api: Api, db: Db, receiver: ModeReceiver, database_url: str
) -> None:
    """Eight transactions cancel five items each at the same instant, each holding its
    transaction open a moment: each counts the watcher's pending rows after the one before
    it committed, so exactly the cap's rows are written."""
    watcher_id = register(api, receiver.url("/hook"), events=["item.cancelled"])["watcher_id"]
    _enqueue_batch(api, range(40))
    ids = [str(r["item_id"]) for r in db.execute("SELECT item_id FROM work_items").fetchall()]
    writers = 8
    start = threading.Barrier(writers)
    failures: list[BaseException] = []

    def cancel(item_ids: list[str]) -> None:
        try:
            # A server session: the policy's cap on the connection, as the API's pool has it.
            with psycopg.connect(
                database_url,
                row_factory=dict_row,
                options=f"-c queue_server.outbox_cap={CAP}",
            ) as conn:
                start.wait(timeout=10)
                params = {
                    "tenant": "acme",
                    "item_ids": item_ids,
                    "state": None,
                    "reason": "race",
                    "actor": "operator",
                    "shard": 0,
                }
                cancelled = conn.execute(transitions._SQL["cancel"], params).fetchall()
                assert len(cancelled) == len(item_ids)
                conn.execute("SELECT pg_sleep(0.1)")
                conn.commit()
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=cancel, args=(ids[i::writers],)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert failures == []
    cancelled = db.execute("SELECT count(*) AS n FROM work_items WHERE state = 'cancelled'")
    assert cancelled.fetchone() == {"n": 40}
    assert _pending(db, watcher_id) == CAP
    assert _watcher(api, watcher_id)["backlogged"] is True


def _waiting_on_a_lock(db: Db, fragment: str) -> bool:
    """A session whose statement (its first kilobyte, as the server keeps it) has `fragment`
    waits on a lock."""
    row = db.execute(
        "SELECT count(*) AS n FROM pg_stat_activity"
        " WHERE wait_event_type = 'Lock' AND position(%s in query) > 0",
        (fragment,),
    ).fetchone()
    return row is not None and row["n"] > 0


def test_an_event_written_while_a_backfill_is_mid_statement_goes_out_after_its_rows(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    """A transition whose statement starts while a backfill's is running waits for the
    watcher's lock; its row goes out after every row the backfill wrote, as its event is
    after theirs in the ledger. The backfill is held mid-statement, after numbering its
    first row, by a session that holds that row's delivery key a moment."""
    watcher_id = register(api, receiver.url("/hook"), events=["item.enqueued"])["watcher_id"]
    _enqueue_batch(api, range(CAP + 3))
    # The outbox drains with the backfill held off (its watcher lock is taken): three
    # events are left in the ledger.
    with psycopg.connect(database_url) as holder:
        holder.execute("SELECT 1 FROM watchers WHERE watcher_id = %s FOR UPDATE", (watcher_id,))
        deliver(settings, database_url)
    assert len(_received(receiver)) == CAP
    assert _watcher(api, watcher_id)["backlogged"] is True
    first_missed = db.execute(
        "SELECT delivery_key(%(w)s, e.item_id, e.seq) AS key, e.item_id, e.tenant_id"
        " FROM item_events e WHERE e.kind = 'enqueued' AND NOT EXISTS (SELECT 1"
        " FROM outbox_deliveries o WHERE o.delivery_key = delivery_key(%(w)s, e.item_id, e.seq))"
        " ORDER BY e.at, e.item_id, e.seq LIMIT 1",
        {"w": watcher_id},
    ).fetchone()
    assert first_missed is not None
    # Another watcher's row under that key: the unique index is the tenant's, and the
    # watcher's own row lock stays free for the backfill.
    other = register(api, receiver.url("/other"), events=["item.cancelled"])["watcher_id"]
    options = f"-c queue_server.outbox_cap={CAP}"
    with (
        psycopg.connect(database_url, options=options) as keyholder,
        psycopg.connect(database_url, options=options, row_factory=dict_row) as backfiller,
    ):
        # The key of the first missed event, held uncommitted: the backfill numbers that
        # row and waits to see whether the key is taken.
        keyholder.execute(
            "INSERT INTO outbox_deliveries (tenant_id, watcher_id, delivery_key, event,"
            " item_id, queue, body, state, next_attempt_at, due_at, created_at, updated_at,"
            " backfilled) VALUES (%s, %s, %s, 'item.enqueued', %s, 'q', '{}', 'delivered',"
            " now(), now(), now(), now(), true)",
            (first_missed["tenant_id"], other, first_missed["key"], first_missed["item_id"]),
        )
        [watcher] = backfiller.execute(outbox._SQL["lock_backlogged"], {"limit": 10}).fetchall()
        params = {
            "tenant": watcher["tenant_id"],
            "watcher_id": watcher["watcher_id"],
            "from": watcher["backlog_from"],
            "cap": CAP,
        }
        done: list[dict[str, Any]] = []

        def backfill() -> None:
            done.append(backfiller.execute(outbox._SQL["backfill"], params).fetchone() or {})
            backfiller.commit()

        enqueued: list[dict[str, object]] = []
        backfilling = threading.Thread(target=backfill)
        backfilling.start()
        wait_until(
            lambda: _waiting_on_a_lock(db, "The watcher's missed events"),
            "the backfill held",
            timeout=5,
        )
        # The next event: its statement starts now, numbers its row, and waits for the
        # watcher's lock, which the backfill holds.
        enqueuing = threading.Thread(
            target=lambda: enqueued.append(api.enqueue("q", {"n": CAP + 3}))
        )
        enqueuing.start()
        wait_until(lambda: _waiting_on_a_lock(db, "admit"), "the event held", timeout=5)
        keyholder.rollback()
        backfilling.join(timeout=10)
        enqueuing.join(timeout=10)
    assert done == [{"written": 3, "backlogged": False}]
    assert len(enqueued) == 1
    deliver(settings, database_url)
    assert sorted(_received(receiver)) == list(range(CAP + 4))
    assert _received(receiver) == _ledger_order(db)


def test_two_deliverers_drain_a_backlog_while_events_keep_coming_each_sent_once_in_order(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    """Both deliverers backfill (the watcher's lock lets one at a time); events written
    while they do are neither lost nor sent twice."""
    watcher_id = register(api, receiver.url("/hook"), events=["item.enqueued"])["watcher_id"]
    _enqueue_batch(api, range(30))
    assert _pending(db, watcher_id) == CAP
    stop = asyncio.Event()
    loop = asyncio.new_event_loop()

    async def two() -> None:
        async with (
            Deliverer(settings, database_url) as one,
            Deliverer(settings, database_url) as other,
        ):
            await asyncio.gather(one.run_forever(stop), other.run_forever(stop))

    runner = threading.Thread(target=loop.run_until_complete, args=(two(),))
    runner.start()
    try:
        for n in range(30, 45):
            api.enqueue("q", {"n": n})
            assert _pending(db, watcher_id) <= CAP
        wait_until(lambda: len(receiver.hook_requests()) >= 45, "45 deliveries", timeout=20)
        wait_until(lambda: not _watcher(api, watcher_id)["backlogged"], "the mark cleared")
    finally:
        loop.call_soon_threadsafe(stop.set)
        runner.join(timeout=20)
        loop.close()
    assert sorted(_received(receiver)) == list(range(45))
    assert _received(receiver) == _ledger_order(db)
    assert len({r.headers["webhook-id"] for r in receiver.hook_requests()}) == 45
    backfilled = db.execute(
        "SELECT count(*) AS n FROM outbox_deliveries WHERE backfilled"
    ).fetchone()
    assert backfilled is not None
    assert backfilled["n"] >= 10
