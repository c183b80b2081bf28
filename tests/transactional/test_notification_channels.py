"""PostgreSQL has no LISTEN privilege: an application's enqueue role may LISTEN on the
server's channels and NOTIFY on them. What it hears names no tenant, queue or key, and what
it sends makes a waiting acquire look again, nothing more."""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest

from queue_server.client import enqueue_in, enqueue_many_in
from queue_server.settings import Settings
from tests.helpers.api import Api, setup_tenant
from tests.helpers.items import sample
from tests.helpers.roles import Roles
from tests.helpers.wake import ParkedAcquire


@pytest.fixture
def settings(tmp_path: object) -> Settings:
    """A poll longer than every wait here: only a notification makes an acquire look again."""
    return Settings(data_dir=tmp_path, poll_interval=30.0)


def _heard(conn: psycopg.Connection[tuple[object, ...]]) -> list[tuple[str, str]]:
    return [(n.channel, n.payload) for n in conn.notifies(timeout=1.0)]


def _acquire_transactions(api: Api) -> float:
    done = sample(api.admin.get("/metrics").text, "queue_server_acquire_seconds_count")
    assert done is not None
    return done


def _requeued(api: Api, queue: str, delay: float = 0) -> None:
    """An item of `queue` enqueued, leased and requeued (with `delay`): the requeue's
    commit notifies the ready channel."""
    item = api.enqueue(queue, {"n": 1})
    [lease] = api.acquire(queue)
    assert lease["item_id"] == item["item_id"]
    requeued = api.holder(
        "requeue", item["item_id"], worker="w1", fence=lease["fence"], delay=delay
    )
    assert requeued.status_code == 200, requeued.text


def test_a_listening_enqueue_role_hears_no_tenants_queue_names_nor_key_ids(
    api: Api, roles: Roles
) -> None:
    setup_tenant(api.url, api.admin, "beta")
    spy = roles.make("beta")
    with spy.connect() as conn:
        conn.autocommit = True
        conn.execute("LISTEN queue_server_ready")
        conn.execute("LISTEN queue_server_keys")
        # acme's activity: a requeue, a key revoked.
        _requeued(api, "payroll-secret")
        created = api.admin.post("/v1/tenants/acme/keys", json={"role": "worker"}).json()
        revoked = api.admin.delete(f"/v1/tenants/acme/keys/{created['key_id']}")
        assert revoked.status_code in (200, 204), revoked.text
        heard = _heard(conn)
        assert {channel for channel, _ in heard} == {"queue_server_ready", "queue_server_keys"}
        for _, payload in heard:
            assert "acme" not in payload
            assert "payroll" not in payload
            assert created["key_id"] not in payload
        # Nor can the role make a queue's tag: the secret and the function are the server's.
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT secret FROM installation_secret")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT queue_server.ready_tag('acme', 'payroll-secret')")


def test_a_forged_wake_makes_a_waiting_acquire_look_again_and_nothing_more(
    api: Api, roles: Roles
) -> None:
    setup_tenant(api.url, api.admin, "beta")
    spy = roles.make("beta")
    with spy.connect() as conn:
        conn.autocommit = True
        conn.execute("LISTEN queue_server_ready")
        # A tag overheard (the queue's own, from a requeue) and the old plain payload.
        _requeued(api, "q", delay=60)
        [(_, tag)] = _heard(conn)
        looks_before = _acquire_transactions(api)
        started = time.monotonic()
        parked = ParkedAcquire(api, "q", wait=3)
        for payload in (tag, "acme/q", "", "x" * 7000):
            conn.execute("SELECT pg_notify('queue_server_ready', %s)", (payload,))
        count, answered_at = parked.join()
    # Woken, it looked, found nothing due (the item waits a minute) and kept waiting out
    # its three seconds: no lease, no early empty answer.
    assert count == 0
    assert answered_at - started >= 2.9
    # A handful of looks (its first, one once it listens, one per wake-up), not one after
    # another for the rest of its wait: each wake-up is spent by the look it caused.
    assert _acquire_transactions(api) - looks_before <= 10
    [item] = api.operator.get("/v1/tenants/acme/items").json()["items"]
    assert item["state"] == "ready"


def test_an_enqueue_notifies_nobody_so_enqueuing_transactions_commit_side_by_side(
    api: Api, roles: Roles, database_url: str
) -> None:
    """PostgreSQL serializes the commits of every transaction that sent a notification (one
    lock, held through the commit's flush): an admission that notified would make an
    application's enqueuing transactions commit one at a time. Neither the REST enqueue nor
    queue_server.enqueue notifies; a waiting acquire is woken all the same (the watch)."""
    app = roles.make("acme")
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN queue_server_ready")
        parked = ParkedAcquire(api, "q", wait=10)
        with app.connect() as conn:
            enqueue_in(conn, "acme", "q", {"n": 1}, key=uuid.uuid4().hex)
            conn.commit()
        committed_at = time.monotonic()
        api.enqueue("q", {"n": 2}, delay=60)
        count, leased_at = parked.join()
        assert count == 1
        assert leased_at - committed_at < 2.0  # woken, not at the end of its wait (10 s)
        assert _heard(listener) == []


def test_past_a_thousand_rows_in_one_look_every_waiter_looks(api: Api, roles: Roles) -> None:
    """The watch reads at most a thousand rows a look, in the order their transactions
    began: past them it cannot tell which queues had work, so it wakes every waiter. Here a
    transaction with 1,000 items of another queue began first, and both were in progress
    at the watch's looks until they committed together."""
    assert api.admin.put("/v1/tenants/acme", json={"backlog_cap": 5000}).status_code == 200
    app = roles.make("acme")
    parked = ParkedAcquire(api, "q", wait=10)
    with app.connect() as bulk, app.connect() as one:
        for n in (1, 2):
            items = [{"payload": i} for i in range(500)]
            enqueue_many_in(bulk, "acme", "bulk", items, key=f"bulk-{n}")
        enqueue_in(one, "acme", "q", {"n": 1}, key=uuid.uuid4().hex)
        time.sleep(0.2)  # the watch looks with both in progress
        bulk.commit()
        one.commit()
        committed_at = time.monotonic()
    count, leased_at = parked.join()
    assert count == 1
    assert leased_at - committed_at < 2.0  # woken, not at the end of its wait (10 s)
