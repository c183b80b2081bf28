"""The commit-cancel trap of synchronous replication: a COMMIT whose wait for the standby
is cancelled returns success with only a warning, committed on the primary alone. The
server never cancels a COMMIT itself, never acknowledges one whose wait was cancelled
before a later commit has waited for the standby, and a replayed answer waits too.

The embedded PostgreSQL has no standby: naming one that never comes makes every
COMMIT wait, as under synchronous_mode_strict with the standby gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import psycopg
import pytest

from queue_server import auth
from queue_server.background.notifier import Notifier
from queue_server.db import Database
from queue_server.idempotency import Idempotency
from queue_server.infra.embedded import EmbeddedPostgres
from queue_server.infra.metrics import Metrics
from queue_server.models import Role
from queue_server.services import Services
from queue_server.services.item_specs import NewItem
from queue_server.services.keys import Keys
from queue_server.settings import Settings
from tests.helpers.api import Api

Db = psycopg.Connection[dict[str, object]]


def commit_waits(pg: EmbeddedPostgres, server: psycopg.Connection[tuple[object, ...]]) -> bool:
    """Whether a COMMIT now waits for a standby: a probe transaction that writes WAL is
    watched from `server` for its SyncRep wait, which is then cancelled (it commits locally)."""
    with psycopg.connect(pg.url(), autocommit=True) as probe:
        (pid,) = probe.execute("SELECT pg_backend_pid()").fetchone() or (0,)
        probe.execute("BEGIN")
        probe.execute("SELECT pg_logical_emit_message(true, 'qs-probe', '')")
        commit = threading.Thread(target=probe.execute, args=("COMMIT",))
        commit.start()
        waited = False
        deadline = time.monotonic() + 1.0
        while commit.is_alive() and time.monotonic() < deadline:
            row = server.execute(
                "SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (pid,)
            ).fetchone()
            if row is not None and row[0] == "SyncRep":
                waited = True
                break
            time.sleep(0.02)
        while commit.is_alive():
            server.execute("SELECT pg_cancel_backend(%s)", (pid,))
            commit.join(0.2)
    return waited


def until_commit_waits(
    pg: EmbeddedPostgres,
    server: psycopg.Connection[tuple[object, ...]],
    expected: bool,
    timeout: float = 30.0,
) -> None:
    """pg_reload_conf only signals: the checkpointer turns the standby wait on or off when it
    gets to the signal, which takes a while on a loaded machine. Wait until it has."""
    deadline = time.monotonic() + timeout
    while commit_waits(pg, server) != expected:
        assert time.monotonic() < deadline, f"COMMITs still {'do not ' if expected else ''}wait"
        time.sleep(0.05)


@contextlib.contextmanager
def standby_missing(pg: EmbeddedPostgres) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """Every COMMIT with a transaction id waits for a standby until the block ends."""
    with psycopg.connect(pg.url(), autocommit=True) as server:
        server.execute("ALTER SYSTEM SET synchronous_standby_names = 'qs_missing_standby'")
        server.execute("SELECT pg_reload_conf()")
        try:
            until_commit_waits(pg, server, True)
            yield server
        finally:
            server.execute("ALTER SYSTEM RESET synchronous_standby_names")
            server.execute("SELECT pg_reload_conf()")
            until_commit_waits(pg, server, False)


def waiting_for_standby(db: Db) -> set[int]:
    rows = db.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event = 'SyncRep'"
    ).fetchall()
    return {int(str(row["pid"])) for row in rows}


def wait_for_standby_wait(db: Db, timeout: float = 10.0) -> set[int]:
    deadline = time.monotonic() + timeout
    while not (pids := waiting_for_standby(db)):
        assert time.monotonic() < deadline, "no COMMIT is waiting for the standby"
        time.sleep(0.02)
    return pids


class Request(threading.Thread):
    """An enqueue in a thread of its own, so the test can watch it wait."""

    def __init__(self, api: Api, key: str) -> None:
        super().__init__()
        self.api, self.key = api, key
        self.response: httpx.Response | None = None

    def run(self) -> None:
        self.response = self.api.worker.post(
            f"/v1/tenants/{self.api.tenant}/queues/q/items",
            json={"payload": {"sync": True}},
            headers={"Idempotency-Key": self.key},
        )


def test_a_commit_whose_standby_wait_was_cancelled_is_answered_only_once_confirmed(
    api: Api, db: Db, pg: EmbeddedPostgres
) -> None:
    key = uuid.uuid4().hex
    with standby_missing(pg) as server:
        first = Request(api, key)
        first.start()
        (pid,) = wait_for_standby_wait(db)
        server.execute("SELECT pg_cancel_backend(%s)", (pid,))
        # Committed on the primary only: no answer yet; a confirming commit waits instead.
        time.sleep(1.0)
        assert first.is_alive(), first.response.text if first.response else None
        assert wait_for_standby_wait(db)
    first.join(15)
    assert first.response is not None
    assert first.response.status_code == 201

    # A replay of that answer waits for the standby as well.
    with standby_missing(pg):
        again = Request(api, key)
        again.start()
        wait_for_standby_wait(db)
        assert again.is_alive()
    again.join(15)
    assert again.response is not None
    assert again.response.status_code == 201
    assert again.response.headers["Idempotent-Replayed"] == "true"


def test_cancelling_a_request_never_cancels_its_commit(
    api: Api, db: Db, pg: EmbeddedPostgres, settings: Settings, database_url: str
) -> None:
    key = uuid.uuid4().hex
    db_conn = db

    async def scenario() -> None:
        db = Database.for_api(settings, database_url)
        services = Services.build(
            settings, db, keys=Keys(db), wakeups=Notifier(database_url), metrics=Metrics()
        )
        await db.open(wait=True)
        try:
            with standby_missing(pg):
                task = asyncio.create_task(
                    services.items.enqueue(
                        auth.Principal(key_id="test", tenant=None, role=Role.ADMIN),
                        api.tenant,
                        "q",
                        [NewItem(payload={"cancelled": True})],
                        Idempotency.of(key, caller="test", method="POST", path="/x", body={}),
                        instance="/x",
                        batch=False,
                    )
                )
                pids = await asyncio.to_thread(wait_for_standby_wait, db_conn)
                task.cancel()
                await asyncio.sleep(0.5)
                # psycopg cancels a statement whose task is cancelled; this COMMIT still waits.
                assert await asyncio.to_thread(waiting_for_standby, db_conn) == pids
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            await db.close()

    asyncio.run(scenario())
    stored = db.execute(
        "SELECT count(*) AS n FROM work_items WHERE payload = '{\"cancelled\": true}'"
    ).fetchone()
    assert stored == {"n": 1}
