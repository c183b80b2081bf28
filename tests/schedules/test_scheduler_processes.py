"""Scheduler loops in real API processes (uvicorn, as deployed) on one database: several at
once enqueue each tick once, and a process killed between ticks loses none under
`all-bounded`."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest

from queue_server.settings import Settings
from tests.helpers import web
from tests.helpers.api import client_for
from tests.helpers.schedules import Db
from tests.helpers.server import make_admin_key

pytestmark = pytest.mark.slow


class ApiProcess:
    """`uvicorn queue_server.app:app_from_env` on a loopback port: one API process."""

    def __init__(self, database_url: str, **env: str) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "--factory",
                "queue_server.app:app_from_env",
                "--port",
                str(self.port),
                "--log-level",
                "warning",
            ],
            env={
                **os.environ,
                "QUEUE_SERVER_DATABASE_URL": database_url,
                "QUEUE_SERVER_POOL_MIN_SIZE": "2",
                **env,
            },
        )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "the API process exited"
            try:
                if web.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError("the API process did not become ready")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


@contextmanager
def api_processes(database_url: str, n: int, **env: str) -> Iterator[list[ApiProcess]]:
    procs = [ApiProcess(database_url, **env) for _ in range(n)]
    try:
        for proc in procs:
            proc.wait_ready()
        yield procs
    finally:
        for proc in procs:
            proc.stop()


def _tenant(db: Db) -> None:
    db.execute(
        "INSERT INTO tenants (tenant_id, backlog_cap, default_max_acquisitions, default_lease_ttl)"
        " VALUES ('acme', 100000, 3, '30 seconds')"
    )


def _put(client: httpx.Client, name: str, **body: Any) -> dict[str, Any]:
    response = client.put(
        f"/v1/tenants/acme/schedules/{name}",
        json=body,
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


def _pause(client: httpx.Client, name: str) -> None:
    response = client.post(
        f"/v1/tenants/acme/schedules/{name}/pause", headers={"Idempotency-Key": uuid.uuid4().hex}
    )
    assert response.status_code == 200, response.text


def _ticks(db: Db, name: str) -> list[datetime]:
    rows = db.execute(
        "SELECT (data->>'tick_at')::timestamptz AS tick FROM item_events"
        " WHERE kind = 'scheduled' AND data->>'schedule' = %s ORDER BY 1",
        (name,),
    ).fetchall()
    return [r["tick"] for r in rows]  # type: ignore[misc]


def _consecutive_seconds(ticks: list[datetime]) -> bool:
    return all((b - a).total_seconds() == 1.0 for a, b in itertools.pairwise(ticks))


def _fires_metric(url: str, key: str) -> float:
    text = web.get(f"{url}/metrics", headers={"Authorization": f"Bearer {key}"}).text
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("queue_server_schedule_fires_total{")
    )


@pytest.mark.slow
def test_three_processes_enqueue_20_items_in_20_seconds_and_never_two_for_a_tick(
    db: Db, database_url: str, tmp_path: Any
) -> None:
    _tenant(db)
    key = make_admin_key(Settings(data_dir=tmp_path), database_url)
    with api_processes(database_url, 3) as procs:
        client = client_for(procs[0].url, key)
        created = _put(client, "every-second", queue="q", every=1)
        time.sleep(20.0)
        _pause(client, "every-second")
        time.sleep(0.5)  # a pass that held the row when the pause came has committed
        ticks = _ticks(db, "every-second")
        fired_per_process = [_fires_metric(p.url, key) for p in procs]
    assert 19 <= len(ticks) <= 21, len(ticks)
    assert len(set(ticks)) == len(ticks), "two items for one tick"
    assert _consecutive_seconds(ticks), ticks
    first = datetime.fromisoformat(created["next_fires"][0].replace("Z", "+00:00"))
    assert ticks[0] == first
    # The three loops' counts add up to the items: each item was counted by the loop whose
    # pass enqueued it, and by no other.
    assert sum(fired_per_process) == len(ticks), fired_per_process
    row = db.execute("SELECT count(*) AS n FROM work_items").fetchone()
    assert row is not None
    assert row["n"] == len(ticks)


@pytest.mark.slow
def test_a_process_killed_between_ticks_loses_no_tick_under_all_bounded(
    db: Db, database_url: str, tmp_path: Any
) -> None:
    """Killed for a few seconds, longer than the grace: `all-bounded` enqueues every missed
    tick once after the restart; `skip`, beside it, drops them."""
    _tenant(db)
    key = make_admin_key(Settings(data_dir=tmp_path), database_url)
    grace = {"QUEUE_SERVER_SCHEDULE_GRACE": "0.5"}
    with api_processes(database_url, 1, **grace) as [first]:
        client = client_for(first.url, key)
        created = _put(client, "all", queue="q", every=1, catch_up="all-bounded")
        _put(client, "skip", queue="q", every=1, catch_up="skip")
        time.sleep(2.5 - time.time() % 1)  # then half-way between two ticks
        first.kill()
    killed_at = datetime.now().astimezone()
    time.sleep(3)
    with api_processes(database_url, 1, **grace) as [second]:
        time.sleep(2)
        client = client_for(second.url, key)
        _pause(client, "all")
        _pause(client, "skip")
        time.sleep(0.5)
    ticks = _ticks(db, "all")
    first_tick = datetime.fromisoformat(created["next_fires"][0].replace("Z", "+00:00"))
    assert ticks[0] == first_tick
    assert _consecutive_seconds(ticks), ticks
    assert len(set(ticks)) == len(ticks)
    # From before the kill to after the restart, with the seconds of the downtime.
    assert ticks[0] < killed_at
    assert ticks[-1] > killed_at + timedelta(seconds=3)
    skipped = _ticks(db, "skip")
    assert not _consecutive_seconds(skipped), "skip caught up the missed ticks"
    row = db.execute("SELECT skipped FROM schedules WHERE name = 'skip'").fetchone()
    assert row is not None
    assert int(str(row["skipped"])) >= 2
