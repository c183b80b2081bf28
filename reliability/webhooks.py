"""Webhook delivery under a fault: a receiver in the harness, a watcher on the load's
tenant, and `queue-server deliver` as a process of its own, then the checks that every
outbox row was delivered, every delivered key was received, and the deliverer outlived
the fault without a restart.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO

import httpx

from reliability.checkers import Violation
from reliability.cluster import HOST, Cluster, say, venv_bin
from reliability.history import JSONValue

__all__ = ["WebhookReceiver", "WebhookRun"]


class _Handler(BaseHTTPRequestHandler):
    server: WebhookReceiver

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(length)
        if self.server.failing.is_set():
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        with self.server.lock:
            self.server.keys.append(self.headers.get("webhook-id", ""))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return


class WebhookReceiver(ThreadingHTTPServer):
    """Answers every webhook 200 and keeps each delivery key it was sent, repeats included;
    503 to every one while `failing` is set (a receiver that is down)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__((HOST, 0), _Handler)
        self.keys: list[str] = []
        self.lock = threading.Lock()
        self.failing = threading.Event()
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.server_address[1]}/hook"

    def received(self) -> Counter[str]:
        with self.lock:
            return Counter(self.keys)

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class WebhookRun:
    """A watcher of `item.completed` on `tenant`, and a deliverer process sending to it."""

    def __init__(
        self, cluster: Cluster, tenant: str, operator_key: str, *, backoff_scale: float = 0.01
    ) -> None:
        self.cluster = cluster
        self.tenant = tenant
        self.receiver = WebhookReceiver()
        with httpx.Client(
            base_url=cluster.base_url,
            headers={"Authorization": f"Bearer {operator_key}"},
            timeout=30,
        ) as client:
            created = client.post(
                f"/v1/tenants/{tenant}/watchers",
                json={"url": self.receiver.url, "events": ["item.completed"]},
                headers={"Idempotency-Key": uuid.uuid4().hex},
            )
        if created.status_code != 201:
            raise RuntimeError(f"the watcher was refused: {created.status_code} {created.text}")
        self.watcher_id = str(created.json()["watcher_id"])
        self.log_path: Path = cluster.root / "deliver.log"
        self._log: IO[bytes] = self.log_path.open("ab")
        env = {
            **os.environ,
            "QUEUE_SERVER_DATABASE_URL": cluster.db_url,
            "QUEUE_SERVER_DATA_DIR": str(cluster.root / "data"),
            "QUEUE_SERVER_TRANSPORT_ALLOW": f'["{HOST}"]',
            "QUEUE_SERVER_DELIVERY_POLL_INTERVAL": "0.2",
            "QUEUE_SERVER_DELIVERY_BACKOFF_SCALE": str(backoff_scale),
        }
        self.proc = subprocess.Popen(
            [venv_bin("queue-server"), "deliver"],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.pid = self.proc.pid

    def log(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")
        return ""

    def outbox(self) -> dict[str, int]:
        """The watcher's outbox rows by state."""
        with self.cluster.db() as conn:
            found = conn.execute(
                "SELECT state, count(*) AS n FROM outbox_deliveries"
                " WHERE tenant_id = %s AND watcher_id = %s GROUP BY state",
                (self.tenant, self.watcher_id),
            ).fetchall()
        return {str(row["state"]): int(row["n"]) for row in found}

    def wait_drained(self, timeout: float) -> float:
        """Wait until no row of the watcher is pending; returns the seconds waited."""
        began = time.monotonic()
        while self.outbox().get("pending", 0) and time.monotonic() - began < timeout:
            time.sleep(0.2)
        return time.monotonic() - began

    def check(
        self,
        metrics: dict[str, JSONValue],
        *,
        drain_timeout: float = 90.0,
        expect_outage: bool = False,
    ) -> list[Violation]:
        """Every row delivered, every delivered key received, the deliverer never restarted
        (and, with `expect_outage`, it logged the database's absence and return)."""
        out: list[Violation] = []
        alive_before = self.proc.poll() is None
        waited = self.wait_drained(drain_timeout)
        with self.cluster.db() as conn:
            rows = conn.execute(
                "SELECT delivery_key, state FROM outbox_deliveries"
                " WHERE tenant_id = %s AND watcher_id = %s",
                (self.tenant, self.watcher_id),
            ).fetchall()
            completed = conn.execute(
                "SELECT count(*) AS n FROM item_events e JOIN watchers w"
                " ON w.tenant_id = e.tenant_id AND w.watcher_id = %s"
                " WHERE e.tenant_id = %s AND e.kind = 'completed' AND e.at >= w.created_at",
                (self.watcher_id, self.tenant),
            ).fetchone()
        received = self.received_now()
        states = Counter(str(r["state"]) for r in rows)
        metrics["webhook_rows"] = {k: v for k, v in sorted(states.items())}
        metrics["webhook_completions_after_watcher"] = int(completed["n"]) if completed else 0
        metrics["webhook_deliveries_received"] = sum(received.values())
        metrics["webhook_keys_received_twice"] = sum(1 for n in received.values() if n > 1)
        metrics["webhook_drain_seconds_after_load"] = round(waited, 2)
        metrics["deliverer_not_restarted"] = alive_before and self.proc.pid == self.pid
        log = self.log()
        metrics["deliverer_logged_outage"] = "the database is" in log
        metrics["deliverer_logged_recovery"] = "the database is back" in log
        if expect_outage and not (
            metrics["deliverer_logged_outage"] and metrics["deliverer_logged_recovery"]
        ):
            out.append(Violation("webhooks", "the deliverer did not log the outage and recovery"))
        if not alive_before:
            out.append(
                Violation(
                    "webhooks", f"the deliverer exited ({self.proc.returncode}): {log[-500:]}"
                )
            )
        undelivered = {k: v for k, v in states.items() if k != "delivered"}
        if undelivered:
            out.append(Violation("webhooks", f"outbox rows not delivered: {undelivered}"))
        if len(rows) != metrics["webhook_completions_after_watcher"]:
            out.append(
                Violation(
                    "webhooks",
                    f"{metrics['webhook_completions_after_watcher']} completions but"
                    f" {len(rows)} outbox rows",
                )
            )
        missing = [str(r["delivery_key"]) for r in rows if r["state"] == "delivered"]
        missing = [key for key in missing if key not in received]
        if missing:
            out.append(
                Violation("webhooks", f"{len(missing)} delivered rows never reached the receiver")
            )
        return out

    def received_now(self) -> Counter[str]:
        return self.receiver.received()

    def stop(self) -> None:
        if self._log.closed:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._log.close()
        self.receiver.close()
        say(f"deliverer log: {self.log_path}")
