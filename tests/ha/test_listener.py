"""The LISTEN session (wake-ups, key revocation) on its own connection: while it is down
waiting acquires poll and the key cache is off; it reconnects with backoff and LISTENs
again."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.rows import dict_row

from queue_server.infra.embedded import EmbeddedPostgres
from queue_server.settings import Settings
from tests.helpers import web
from tests.helpers.api import Api
from tests.helpers.server import LiveServer

pytestmark = pytest.mark.live  # clients of a second API process, on sockets

Db = psycopg.Connection[dict[str, object]]


@pytest.fixture
def listener_role(pg: EmbeddedPostgres) -> Iterator[str]:
    """A role of its own for the listener, so its logins can be refused."""
    role = f"qs_listener_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg.url(), autocommit=True, row_factory=dict_row) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{role}'")
        yield role
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,)
        )
        conn.execute(f"DROP ROLE {role}")


@pytest.fixture
def settings(tmp_path: object, database_url: str, listener_role: str) -> Settings:
    listen = database_url.replace(
        "postgresql://postgres@", f"postgresql://{listener_role}:{listener_role}@", 1
    )
    # A poll interval far above the half second a waiting acquire polls at without the
    # listener: a wake-up within a second then comes from that shorter poll, not this one.
    # No watch for rows made ready: a faster wake-up is the listener's.
    return Settings(
        data_dir=tmp_path,
        listen_database_url=listen,
        lock_timeout_ms=2000,
        poll_interval=5.0,
        watch_interval=0,
    )


def _wait(what: str, check: object, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _wake_delay(api: Api) -> float:
    """Seconds from a requeue's answer (its commit notifies the ready channel) to the answer
    of an acquire that was waiting for the item."""
    leased: dict[str, float] = {}
    api.enqueue()
    [held] = api.acquire(worker="w0")  # the queue's concurrency limit is 1: the rest wait

    def wait_for_work() -> None:
        with api.client(api.keys["worker"]) as client:
            answer = client.post(
                f"/v1/tenants/{api.tenant}/queues/q/leases",
                json={"worker": "w1", "lease_ttl": 30, "wait": 10},
            )
            leased["at"] = time.monotonic()
            leases = answer.json()["leases"]
            leased["n"] = len(leases)
            for lease in leases:
                done = api.holder("complete", lease["item_id"], worker="w1", fence=lease["fence"])
                assert done.status_code == 200, done.text

    thread = threading.Thread(target=wait_for_work)
    thread.start()
    time.sleep(0.4)  # parked on its wake-up
    requeued = api.holder("requeue", held["item_id"], worker="w0", fence=held["fence"])
    assert requeued.status_code == 200, requeued.text
    requeued_at = time.monotonic()
    thread.join(15)
    assert leased["n"] == 1
    return leased["at"] - requeued_at


def test_without_its_session_acquires_poll_and_revocations_apply_then_it_listens_again(
    live: LiveServer, api: Api, db: Db, listener_role: str
) -> None:
    notifier = live.app.state.notifier
    _wait("the listener", notifier.connected.is_set)
    pid = notifier.backend_pid
    db.execute(f"ALTER ROLE {listener_role} NOLOGIN")
    db.execute("SELECT pg_terminate_backend(%s)", (pid,))
    _wait("the listener to notice", lambda: not notifier.connected.is_set())

    # No notification can arrive: a waiting acquire polls every half second instead.
    assert _wake_delay(api) < 1.0

    # A key revoked elsewhere (its notification lost with the session) is refused at once.
    created = api.admin.post(f"/v1/tenants/{api.tenant}/keys", json={"role": "worker"}).json()
    with web.client(
        base_url=api.url, headers={"Authorization": f"Bearer {created['secret']}"}
    ) as key:
        assert key.get(f"/v1/tenants/{api.tenant}/queues").status_code == 200
        db.execute("UPDATE api_keys SET revoked_at = now() WHERE key_id = %s", (created["key_id"],))
        assert key.get(f"/v1/tenants/{api.tenant}/queues").status_code == 401

    db.execute(f"ALTER ROLE {listener_role} LOGIN")
    _wait("the listener to reconnect", notifier.connected.is_set)
    assert notifier.backend_pid not in (0, pid)
    listening = db.execute(
        "SELECT count(*) AS n FROM pg_stat_activity WHERE pid = %s AND query LIKE 'LISTEN%%'",
        (notifier.backend_pid,),
    ).fetchone()
    assert listening == {"n": 1}
    # Woken by its notification, not by a poll (five seconds after it parked): the fastest
    # of three wake-ups, so one slow answer on a busy machine is not it.
    assert min(_wake_delay(api) for _ in range(3)) < 0.25

    metrics = api.admin.get("/metrics").text
    assert "queue_server_listener_connected 1.0" in metrics
    lost = next(
        line
        for line in metrics.splitlines()
        if line.startswith("queue_server_listener_disconnects_total")
    )
    assert float(lost.split()[-1]) >= 1
