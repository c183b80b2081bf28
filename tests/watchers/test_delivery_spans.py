"""With OTEL_EXPORTER_OTLP_ENDPOINT set, `queue-server deliver` exports a span per delivery
attempt, with the receipt's outcome."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.helpers.api import Api
from tests.helpers.otlp import otlp_receiver
from tests.helpers.watchers import SCALE, ModeReceiver, complete_one, register

BIN = Path(sys.executable).parent / "queue-server"


def _deliver_once(database_url: str, endpoint: str) -> str:
    done = subprocess.run(
        [str(BIN), "deliver", "--once"],
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
            "QUEUE_SERVER_DATABASE_URL": database_url,
            "QUEUE_SERVER_TRANSPORT_ALLOW": '["127.0.0.1"]',
            "QUEUE_SERVER_DELIVERY_BACKOFF_SCALE": str(SCALE),
            "QUEUE_SERVER_DELIVERY_ATTEMPT_TIMEOUT": "1",
            "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "50",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_each_delivery_attempt_is_a_span_with_the_receipts_outcome(
    api: Api, receiver: ModeReceiver, database_url: str
) -> None:
    created = register(api, receiver.url("/hook"))
    item_id = complete_one(api)
    receiver.mode = "fail"
    with otlp_receiver() as (endpoint, spans_seen):
        assert "failed 1" in _deliver_once(database_url, endpoint)
        spans = spans_seen.wait_for(lambda spans: any(s.name.startswith("deliver") for s in spans))
    (span,) = [s for s in spans if s.name == "deliver item.completed"]
    assert span.service == "queue-server-deliver"
    assert span.attributes["queue_server.tenant"] == "acme"
    assert span.attributes["queue_server.item_id"] == item_id
    assert span.attributes["queue_server.watcher_id"] == created["watcher_id"]
    assert span.attributes["queue_server.delivery.attempt"] == 1
    assert span.attributes["queue_server.delivery.outcome"] == "http_error"
    assert span.attributes["http.response.status_code"] == 500
    assert span.attributes["queue_server.delivery.verdict"] == "failed"
