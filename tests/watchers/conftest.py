"""Fixtures: a receiver whose behaviour the test switches, watchers, and delivery runs."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from queue_server.settings import Settings
from queue_server.transport import Budget
from queue_server.workers.deliverer import Deliverer, RunReport
from tests.conftest import Api
from tests.transport.receiver import Receiver, Seen

Db = psycopg.Connection[dict[str, Any]]
# The real schedule's shape, a thousand times faster: 0.03 s, 0.12 s, 0.48 s, 1.92 s.
SCALE = 0.001


class ModeReceiver(Receiver):
    """`/hook` behaves like the receiver path named by `mode` (ok, fail, gone, slow, ...)."""

    mode = "ok"

    def _answer(self, conn: Any, seen: Seen) -> None:
        if seen.target.startswith("/hook"):
            seen = Seen(seen.method, "/" + self.mode, seen.headers, seen.body)
        super()._answer(conn, seen)

    def hook_requests(self) -> list[Seen]:
        return [r for r in self.requests if r.target.startswith("/hook")]


@pytest.fixture
def receiver() -> Iterator[ModeReceiver]:
    r = ModeReceiver()
    yield r
    r.close()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path,
        poll_interval=0.2,
        lock_timeout_ms=2000,
        transport_allow=["127.0.0.1"],
        delivery_backoff_scale=SCALE,
        delivery_attempt_timeout=1.0,
        delivery_poll_interval=0.05,
    )


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
