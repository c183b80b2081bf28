"""Item transitions write their outbox rows in the same statement, or none at all."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
from psycopg.rows import dict_row

from queue_server.store import transitions
from queue_server.transport.signing import generate_secret
from tests.helpers.api import Api
from tests.helpers.items import expire

Db = psycopg.Connection[dict[str, Any]]


def _watcher(db: Db, tenant: str, events: list[str], queues: list[str] | None = None) -> str:
    row = db.execute(
        "INSERT INTO watchers (tenant_id, url, events, queues, secret)"
        " VALUES (%s, 'http://127.0.0.1:9/hook', %s, %s, %s) RETURNING watcher_id::text AS id",
        (tenant, events, queues, generate_secret()),
    ).fetchone()
    assert row is not None
    return str(row["id"])


def _rows(db: Db) -> list[dict[str, Any]]:
    return db.execute(
        "SELECT watcher_id::text AS watcher_id, event, item_id::text AS item_id, queue, body,"
        " state, attempts, delivery_key FROM outbox_deliveries ORDER BY seq"
    ).fetchall()


def test_transitions_write_one_row_per_matching_active_watcher(api: Api, db: Db) -> None:
    every = _watcher(
        db,
        "acme",
        ["item.enqueued", "item.completed", "item.requeued", "item.quarantined"],
    )
    only_q = _watcher(db, "acme", ["item.completed"], queues=["q"])
    _watcher(db, "acme", ["item.completed"], queues=["elsewhere"])
    paused = _watcher(db, "acme", ["item.completed"])
    db.execute(
        "UPDATE watchers SET state = 'paused', paused_at = now() WHERE watcher_id = %s", (paused,)
    )

    item = api.enqueue("q", {"n": 1})
    [lease] = api.acquire("q")
    done = api.holder("complete", item["item_id"], worker="w1", fence=lease["fence"], result=7)
    assert done.status_code == 200

    rows = _rows(db)
    assert rows[0]["watcher_id"] == every
    assert rows[0]["event"] == "item.enqueued"
    assert sorted((r["watcher_id"], r["event"]) for r in rows[1:]) == sorted(
        [(every, "item.completed"), (only_q, "item.completed")]
    )
    completed = next(r for r in rows if r["event"] == "item.completed")
    body = completed["body"]
    assert body["event"] == "item.completed"
    # The body's item is the item exactly as the API shows it.
    shown = api.worker.get(f"/v1/tenants/acme/items/{item['item_id']}").json()
    assert body["item"] == shown
    assert all(r["state"] == "pending" and r["attempts"] == 0 for r in rows)
    assert len({r["delivery_key"] for r in rows}) == len(rows)
    assert all(r["delivery_key"].startswith("msg_") for r in rows)


def test_requeue_and_quarantine_emit_their_events(api: Api, db: Db) -> None:
    _watcher(db, "acme", ["item.requeued", "item.quarantined"])
    item = api.enqueue("q", None, max_acquisitions=2)
    [lease] = api.acquire("q")
    assert api.holder("requeue", item["item_id"], worker="w1", fence=lease["fence"], reason="x")
    [lease] = api.acquire("q")
    failure = {"class": "Boom", "message": "no", "transient": False}
    triaged = api.holder(
        "triage",
        item["item_id"],
        worker="w1",
        fence=lease["fence"],
        failure=failure,
        decision="requeue",
    )
    assert triaged.status_code == 200
    # The budget of 2 is spent: that failure was its last, and the triage quarantines it.
    assert triaged.json()["state"] == "quarantined"
    assert api.acquire("q") == []
    assert [r["event"] for r in _rows(db)] == ["item.requeued", "item.quarantined"]
    other = api.enqueue("q")
    [lease] = api.acquire("q")
    quarantined = api.holder(
        "triage",
        other["item_id"],
        worker="w1",
        fence=lease["fence"],
        failure=failure,
        decision="quarantine",
    )
    assert quarantined.status_code == 200
    assert _rows(db)[-1]["event"] == "item.quarantined"
    assert _rows(db)[-1]["item_id"] == other["item_id"]


def test_an_item_quarantined_by_an_acquire_writes_a_row_for_each_matching_active_watcher(
    api: Api, db: Db
) -> None:
    # The item's only attempt ran out (its lease expired): the next acquire quarantines it,
    # and only the active watcher of its queue hears of it.
    every = _watcher(db, "acme", ["item.quarantined"])
    _watcher(db, "acme", ["item.quarantined"], queues=["elsewhere"])
    paused = _watcher(db, "acme", ["item.quarantined"])
    db.execute(
        "UPDATE watchers SET state = 'paused', paused_at = now() WHERE watcher_id = %s", (paused,)
    )
    item = api.enqueue("q", None, max_acquisitions=1)
    assert len(api.acquire("q")) == 1
    expire(db, item["item_id"])
    assert api.acquire("q") == []  # its budget spent: quarantined, not handed out
    assert [(r["watcher_id"], r["event"], r["item_id"]) for r in _rows(db)] == [
        (every, "item.quarantined", item["item_id"])
    ]


def test_refused_transition_writes_no_outbox_row(api: Api, db: Db) -> None:
    _watcher(db, "acme", ["item.completed", "item.enqueued"])
    item = api.enqueue("q")
    [lease] = api.acquire("q")
    stale = api.holder("complete", item["item_id"], worker="w1", fence=int(str(lease["fence"])) + 5)
    assert stale.status_code == 409
    other = api.holder("complete", item["item_id"], worker="intruder", fence=lease["fence"])
    assert other.status_code == 409
    assert [r["event"] for r in _rows(db)] == ["item.enqueued"]


def test_rolled_back_transition_leaves_no_outbox_row(api: Api, database_url: str, db: Db) -> None:
    _watcher(db, "acme", ["item.completed"])
    item = api.enqueue("q")
    [lease] = api.acquire("q")

    async def complete_then_roll_back() -> None:
        conn = await psycopg.AsyncConnection.connect(database_url, row_factory=dict_row)
        async with conn, conn.transaction(force_rollback=True):
            row = await transitions.complete(
                conn,
                tenant="acme",
                item_id=str(item["item_id"]),
                worker="w1",
                key_id=api.keys["worker"].split("_")[1],  # the key that took the lease
                fence=int(str(lease["fence"])),
                result=None,
            )
            assert row is not None
            cur = await conn.execute("SELECT count(*) AS n FROM outbox_deliveries")
            inside = await cur.fetchone()
            assert inside is not None
            assert inside["n"] == 1

    asyncio.run(complete_then_roll_back())
    assert _rows(db) == []
    assert api.worker.get(f"/v1/tenants/acme/items/{item['item_id']}").json()["state"] == "leased"


def test_other_tenants_watchers_see_nothing(api: Api, db: Db) -> None:
    db.execute("INSERT INTO tenants VALUES ('other', 10, 5, '30 seconds', now(), now())")
    _watcher(db, "other", ["item.enqueued"])
    api.enqueue("q")
    assert _rows(db) == []


def test_batch_completion_writes_one_row_per_completed_item(api: Api, db: Db) -> None:
    _watcher(db, "acme", ["item.completed"])
    api.approve("q", 10)
    items = [api.enqueue("q", n) for n in range(3)]
    leases = api.acquire(max_items=3)
    entries = [{"item_id": lease["item_id"], "fence": lease["fence"]} for lease in leases]
    entries[1]["fence"] = 0  # stale: refused, so no delivery for it
    response = api.worker.post(
        "/v1/tenants/acme/completions",
        json={"worker": "w1", "completions": entries},
        headers={"Idempotency-Key": "batch-outbox"},
    )
    assert response.status_code == 200, response.text
    rows = _rows(db)
    assert sorted(r["item_id"] for r in rows) == sorted(str(leases[i]["item_id"]) for i in (0, 2))
    assert len(items) == 3
