"""A running `queue-server deliver` outlives the database going away, its connections being
reset, and an unexpected error in one delivery: it logs, waits, and delivers the next
events without a restart."""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from queue_server.infra import migrate
from queue_server.infra.embedded import EmbeddedPostgres
from queue_server.settings import Settings
from tests.helpers.api import Api, client_for, setup_tenant
from tests.helpers.server import LiveServer, make_admin_key
from tests.helpers.watchers import (
    Db,
    DeliverProcess,
    ModeReceiver,
    complete_one,
    register,
    rows,
    wait_until,
)


def _payloads(receiver: ModeReceiver) -> list[object]:
    import json

    return [json.loads(r.body)["item"]["payload"] for r in receiver.hook_requests()]


# -- the database killed and started again ------------------------------------------------


@pytest.fixture
def own_pg() -> Iterator[EmbeddedPostgres]:
    """A PostgreSQL of this test's own, to kill and start again."""
    root = Path(tempfile.mkdtemp(prefix="qs-test-own-pg-"))
    root.chmod(0o711)  # as root, PostgreSQL's system user traverses to its data
    server = EmbeddedPostgres(root / "data", server_settings={"fsync": "off"})
    server.start()
    yield server
    server.stop("immediate")
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(server.socket_dir, ignore_errors=True)


def _until_answered(send: Callable[[], httpx.Response], timeout: float = 30.0) -> httpx.Response:
    """Retry while the server answers 503 (its database is coming back)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            response = send()
        except httpx.HTTPError:
            response = None
        if response is not None and response.status_code != 503:
            return response
        assert time.monotonic() < deadline, "the server did not recover"
        time.sleep(0.2)


def _complete(api: Api, payload: object) -> None:
    """Enqueue, lease and complete one item, retrying each call through a 503."""
    key = uuid.uuid4().hex
    tenant = f"/v1/tenants/{api.tenant}"
    created = _until_answered(
        lambda: api.worker.post(
            f"{tenant}/queues/q/items",
            json={"payload": payload},
            headers={"Idempotency-Key": key},
        )
    )
    assert created.status_code == 201, created.text
    leased = _until_answered(
        lambda: api.worker.post(f"{tenant}/queues/q/leases", json={"worker": "w", "lease_ttl": 30})
    )
    [lease] = leased.json()["leases"]
    done_key = uuid.uuid4().hex
    done = _until_answered(
        lambda: api.worker.post(
            f"{tenant}/items/{lease['item_id']}/complete",
            json={"worker": "w", "fence": lease["fence"]},
            headers={"Idempotency-Key": done_key},
        )
    )
    assert done.status_code == 200, done.text


def test_deliverer_outlives_a_killed_database_and_resumes_by_itself(
    own_pg: EmbeddedPostgres, receiver: ModeReceiver, tmp_path: Path
) -> None:
    with psycopg.connect(own_pg.url(), autocommit=True) as conn:
        conn.execute("CREATE DATABASE queue")
    url = own_pg.url("queue")
    migrate.upgrade(url)
    settings = Settings(data_dir=tmp_path, poll_interval=0.2, transport_allow=["127.0.0.1"])
    server = LiveServer(settings, url)
    server.start()
    deliverer = DeliverProcess(url, tmp_path / "deliver.log")
    try:
        with client_for(server.url, make_admin_key(settings, url)) as admin:
            api = setup_tenant(server.url, admin, "acme")
            register(api, receiver.url("/hook"))
            _complete(api, "before")
            wait_until(lambda: _payloads(receiver) == ["before"], "the first delivery")

            own_pg.stop("immediate")
            wait_until(lambda: "the database is" in deliverer.text(), "the deliverer's outage log")
            time.sleep(1.0)
            assert deliverer.alive(), deliverer.text()
            own_pg.start()

            _complete(api, "after")
            wait_until(lambda: _payloads(receiver) == ["before", "after"], "the next delivery")
            # The run that sent it logs the recovery once it has recorded the outcome.
            wait_until(lambda: "the database is back" in deliverer.text(), "the recovery log")
            assert deliverer.alive(), deliverer.text()
            log = deliverer.text()
            assert "retrying in" in log
            assert "Traceback" not in log
    finally:
        deliverer.stop()
        server.stop()


# -- connections reset, and an unexpected error in one delivery ---------------------------


def _deliverer_backends(db: Db) -> list[int]:
    found = db.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name = 'queue-server-deliver'"
    ).fetchall()
    return [int(str(row["pid"])) for row in found]


def test_deliverer_outlives_reset_connections_and_an_error_in_one_delivery(
    api: Api, db: Db, receiver: ModeReceiver, database_url: str, tmp_path: Path
) -> None:
    broken = register(api, receiver.url("/hook?watcher=broken"))
    healthy = register(api, receiver.url("/hook?watcher=healthy"))
    deliverer = DeliverProcess(database_url, tmp_path / "deliver.log")
    try:
        complete_one(api, payload=1)
        wait_until(
            lambda: sorted(map(str, _payloads(receiver))) == ["1", "1"], "the first deliveries"
        )

        # Every connection of the deliverer reset under it.
        wait_until(lambda: bool(_deliverer_backends(db)), "the deliverer's connections")
        for pid in _deliverer_backends(db):
            db.execute("SELECT pg_terminate_backend(%s)", (pid,))
        complete_one(api, payload=2)
        wait_until(lambda: _payloads(receiver).count(2) == 2, "the deliveries after the reset")

        # A signing secret that cannot be decoded makes signing raise inside the run.
        db.execute(
            "UPDATE watchers SET secret = 'whsec_!! not base64 !!' WHERE watcher_id = %s",
            (broken["watcher_id"],),
        )
        complete_one(api, payload=3)
        complete_one(api, payload=4)
        wait_until(lambda: _payloads(receiver).count(4) == 1, "the healthy watcher's deliveries")
        wait_until(
            lambda: (
                [r["state"] for r in rows(db) if str(r["watcher_id"]) == broken["watcher_id"]][-2:]
                == ["dead", "dead"]
            ),
            "the broken watcher's deliveries recorded as failed",
        )
        assert deliverer.alive(), deliverer.text()
        failed = [r for r in rows(db) if r["state"] == "dead"]
        assert len(failed) == 2
        for row in failed:
            # Recorded as failed with the error's class, and not retried: no class of the
            # policy's retryable ones names it.
            assert row["last_outcome"]["outcome"] == "run_failed"
            assert row["last_outcome"]["error"] == "ValueError"
            assert row["attempts"] == 1
        letters = api.operator.get("/v1/tenants/acme/dead-letters", params={"kind": "delivery"})
        reasons = {d["reason"] for d in letters.json()["dead_letters"]}
        assert reasons == {"run-failed: ValueError"}

        def healthy_payloads() -> list[object]:
            return [
                r["body"]["item"]["payload"]
                for r in rows(db)
                if str(r["watcher_id"]) == healthy["watcher_id"] and r["state"] == "delivered"
            ]

        # The receiver has the last request before the deliverer records its answer.
        wait_until(lambda: healthy_payloads() == [1, 2, 3, 4], "the healthy deliveries recorded")

        # Fixed by a rotation: the next event goes out, still without a restart.
        rotated = api.operator.post(
            f"/v1/tenants/acme/watchers/{broken['watcher_id']}/rotate-secret",
            headers={"Idempotency-Key": "fix"},
        )
        assert rotated.status_code == 200
        db.execute(
            "UPDATE watchers SET previous_secret = NULL, previous_secret_expires_at = NULL"
            " WHERE watcher_id = %s",
            (broken["watcher_id"],),
        )
        complete_one(api, payload=5)
        wait_until(lambda: _payloads(receiver).count(5) == 2, "both deliveries of the next event")
        assert deliverer.alive(), deliverer.text()
    finally:
        deliverer.stop()
