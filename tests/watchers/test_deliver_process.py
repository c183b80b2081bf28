"""`queue-server deliver` and `queue-server watchers` as real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks.webhooks import Webhook

from queue_server.settings import Settings
from tests.helpers.api import Api
from tests.helpers.watchers import (
    SCALE,
    Db,
    ModeReceiver,
    complete_one,
    deliver,
    make_due,
    register,
    rows,
)

pytestmark = pytest.mark.live  # `queue-server` runs as a subprocess against the URL

BIN = Path(sys.executable).parent / "queue-server"


def _env(database_url: str, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "QUEUE_SERVER_DATABASE_URL": database_url,
        "QUEUE_SERVER_TRANSPORT_ALLOW": '["127.0.0.1"]',
        "QUEUE_SERVER_DELIVERY_BACKOFF_SCALE": str(SCALE),
        "QUEUE_SERVER_DELIVERY_ATTEMPT_TIMEOUT": "1",
        "QUEUE_SERVER_DELIVERY_POLL_INTERVAL": "0.05",
        **extra,
    }


def _wait(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_deliverer_killed_after_sending_resends_under_the_same_key(
    api: Api, db: Db, receiver: ModeReceiver, database_url: str
) -> None:
    receiver.mode = "slow"
    register(api, receiver.url("/hook"))
    complete_one(api)
    first = subprocess.Popen([str(BIN), "deliver"], env=_env(database_url))
    try:
        _wait(lambda: len(receiver.hook_requests()) == 1)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=10)
    [row] = rows(db)
    # The attempt and the next instant were committed before the request went out.
    assert row["attempts"] == 1
    assert row["state"] == "pending"
    assert row["claim_token"] is not None
    assert row["next_attempt_at"] - row["last_attempt_at"] == timedelta(seconds=30 * SCALE)
    # The lost claim holds the row until it expires: no second sender meanwhile.
    assert row["due_at"] == row["claimed_until"]
    receiver.mode = "ok"
    second = subprocess.Popen([str(BIN), "deliver"], env=_env(database_url))
    try:
        _wait(lambda: rows(db)[0]["state"] == "delivered")
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(timeout=10)
    keys = [r.headers["webhook-id"] for r in receiver.hook_requests()]
    assert keys == [row["delivery_key"], row["delivery_key"]]
    [row] = rows(db)
    assert row["attempts"] == 2
    assert [r["attempt"] for r in row["receipts"]] == [2]


def _cli(live_url: str, key: str, *args: str) -> Any:
    done = subprocess.run(
        [str(BIN), *args, "--json"],
        env={**os.environ, "QUEUE_SERVER_URL": live_url, "QUEUE_SERVER_KEY": key},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_cli_walkthrough_register_deliver_fail_dead_letter_replay(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    key = api.keys["operator"]
    created = _cli(
        api.url, key, "watchers", "create", receiver.url("/hook"), "-e", "item.completed"
    )
    watcher_id = created["watcher_id"]
    complete_one(api)
    once = subprocess.run(
        [str(BIN), "deliver", "--once"],
        env=_env(database_url),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert once.returncode == 0, once.stderr
    assert "delivered 1" in once.stdout
    [seen] = receiver.hook_requests()
    Webhook(created["secret"]).verify(seen.body, seen.headers)

    receiver.mode = "fail"
    complete_one(api)
    for _ in range(5):
        make_due(db)
        deliver(settings, database_url)
    dead = _cli(api.url, key, "watchers", "deliveries", watcher_id, "--state", "dead")
    [delivery] = dead["deliveries"]
    assert delivery["attempts"] == 5
    letters = _cli(api.url, key, "dead-letters", "list", "--kind", "delivery")
    [letter] = letters if isinstance(letters, list) else letters["dead_letters"]
    receiver.mode = "ok"
    # The operator's general command knows a delivery from an item.
    [replayed] = _cli(api.url, key, "dead-letters", "replay", letter["dead_letter_id"])
    assert replayed["delivery_key"] == delivery["delivery_key"]
    deliver(settings, database_url)
    shown = _cli(api.url, key, "watchers", "show", watcher_id)
    assert shown["deliveries"]["delivered"] == 2
    assert receiver.hook_requests()[-1].headers["webhook-id"] == delivery["delivery_key"]
    listed = _cli(api.url, key, "watchers", "list")
    assert [w["watcher_id"] for w in listed] == [watcher_id]
