"""Watchers and delivery runs: a receiver whose behaviour the test switches, a watcher over REST,
one delivery run in process, `queue-server deliver` as a child process."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import psycopg

from queue_server.background.deliverer import Deliverer, RunReport
from queue_server.settings import Settings
from queue_server.transport import Budget
from tests.helpers.api import Api
from tests.helpers.receiver import Receiver, Seen

Db = psycopg.Connection[dict[str, Any]]
# The real schedule's shape, a thousand times faster: 0.03 s, 0.12 s, 0.48 s, 1.92 s.
SCALE = 0.001
BIN = Path(sys.executable).parent / "queue-server"


class ModeReceiver(Receiver):
    """`/hook` behaves like the receiver path named by `mode` (ok, fail, gone, slow, ...)."""

    mode = "ok"

    def _answer(self, conn: Any, seen: Seen) -> None:
        if seen.target.startswith("/hook"):
            seen = Seen(seen.method, "/" + self.mode, seen.headers, seen.body)
        super()._answer(conn, seen)

    def hook_requests(self) -> list[Seen]:
        return [r for r in self.requests if r.target.startswith("/hook")]


def register(
    api: Api,
    url: str,
    events: list[str] | None = None,
    queues: list[str] | None = None,
    client: Any = None,
) -> dict[str, Any]:
    """A watcher over REST; returns its body (with the secret, shown once)."""
    body: dict[str, Any] = {"url": url, "events": events or ["item.completed"]}
    if queues is not None:
        body["queues"] = queues
    response = (client or api.operator).post(
        f"/v1/tenants/{api.tenant}/watchers",
        json=body,
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


def complete_one(api: Api, queue: str = "q", payload: object = None) -> str:
    """Enqueue, lease and complete one item; returns its id."""
    item = api.enqueue(queue, payload)
    [lease] = api.acquire(queue)
    done = api.holder("complete", item["item_id"], worker="w1", fence=lease["fence"], result="ok")
    assert done.status_code == 200, done.text
    return str(item["item_id"])


def paused_after_one(api: Api, url: str) -> tuple[dict[str, Any], str]:
    """A watcher of `url` with one delivery pending (an item completed), then paused: the
    watcher and its path."""
    watcher = register(api, url)
    complete_one(api)
    path = f"/v1/tenants/acme/watchers/{watcher['watcher_id']}"
    assert api.operator.post(f"{path}/pause", headers={"Idempotency-Key": "p"}).status_code == 200
    return watcher, path


def deliver(
    settings: Settings, database_url: str, *, budget: Budget | None = None, **overrides: Any
) -> RunReport:
    """One delivery run, as `queue-server deliver --once` does it."""
    if overrides:
        settings = settings.model_copy(update=overrides)

    async def run() -> RunReport:
        async with Deliverer(settings, database_url, budget=budget) as deliverer:
            return await deliverer.run_once()

    return asyncio.run(run())


def rows(db: Db) -> list[dict[str, Any]]:
    return db.execute("SELECT * FROM outbox_deliveries ORDER BY seq").fetchall()


def make_due(db: Db) -> None:
    """Let the clock jump: every pending row is due now."""
    db.execute("UPDATE outbox_deliveries SET due_at = now() WHERE state = 'pending'")


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


class DeliverProcess:
    """`queue-server deliver` as a child process, its log in a file."""

    def __init__(self, database_url: str, log: Path, **settings: str) -> None:
        """`settings`: more QUEUE_SERVER_* variables, e.g. DELIVERY_BATCH_SIZE="4"."""
        self.log = log
        env = {
            **os.environ,
            "QUEUE_SERVER_DATABASE_URL": database_url,
            "QUEUE_SERVER_TRANSPORT_ALLOW": '["127.0.0.1"]',
            "QUEUE_SERVER_DELIVERY_BACKOFF_SCALE": str(SCALE),
            "QUEUE_SERVER_DELIVERY_ATTEMPT_TIMEOUT": "1",
            "QUEUE_SERVER_DELIVERY_POLL_INTERVAL": "0.1",
            **{f"QUEUE_SERVER_{name}": value for name, value in settings.items()},
        }
        self._out: IO[bytes] = log.open("wb")
        self.proc = subprocess.Popen(
            [str(BIN), "deliver"], env=env, stdout=self._out, stderr=subprocess.STDOUT
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self._out.close()
