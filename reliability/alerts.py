"""Alerts delivered end to end: Debian's Prometheus and Alertmanager against a live server.

Prometheus scrapes the API every second and evaluates deploy/prometheus's rules, with every
duration in them (`for:`, range windows) divided by ``scale`` (60: a minute of the rules is a
second here, so an hour's burn-rate window is a minute); Alertmanager sends every firing
and resolved alert to a receiver in the harness. Under a steady load (producers, workers, a
watcher with its deliverer), each fault must bring its alert to the receiver within its
window and the alert must resolve after recovery:

    workers stopped while work arrives   QueueServerOldestReadyItemTooOld
    a REPEATABLE READ snapshot held       QueueServerSnapshotHoldsHorizon
    the watcher's receiver answering 503  QueueServerWebhookDeliveryLagging
    the database stopped                  QueueServerDatabaseUnavailable

and no alert may fire during the quiet baseline before them. The load's history is judged
by the usual checkers afterwards: nothing lost, nothing duplicated.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import psycopg
import yaml

from reliability.checkers import Violation
from reliability.client import RecordingClient
from reliability.cluster import HARNESS_APP, HOST, Cluster, free_port, say, wait_answering
from reliability.debian import ensure_packages
from reliability.history import HistoryRecorder, JSONValue
from reliability.scenarios import FAST_API_ENV, Load, ScenarioOutcome, finish
from reliability.webhooks import WebhookRun

__all__ = ["AlertReceiver", "Monitoring", "alert_delivery", "scaled_rules"]

RULES = Path(__file__).resolve().parents[1] / "deploy" / "prometheus" / "queue-server.rules.yml"
PROMETHEUS = "/usr/bin/prometheus"
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"\[(\d+)([smhd])\]")

# The objectives of the scenario's server, in its seconds (rules' minutes are seconds here).
OBJECTIVES = {
    "QUEUE_SERVER_SLO_OLDEST_READY_SECONDS": "6",
    "QUEUE_SERVER_SLO_HORIZON_AGE_SECONDS": "8",
    "QUEUE_SERVER_SLO_DELIVERY_LAG_SECONDS": "8",
}


def _scaled(value: int, unit: str, scale: float) -> str:
    return f"{max(1, round(value * _SECONDS[unit] / scale))}s"


def scaled_rules(text: str, scale: float) -> str:
    """The rules with every duration divided by `scale` (at least a second each)."""
    document = yaml.safe_load(text)
    for group in document["groups"]:
        for rule in group["rules"]:
            rule["expr"] = _DURATION.sub(
                lambda m: f"[{_scaled(int(m.group(1)), m.group(2), scale)}]", rule["expr"]
            )
            if "for" in rule:
                found = re.fullmatch(r"(\d+)([smhd])", str(rule["for"]))
                if found is None:
                    raise ValueError(f"{rule.get('alert')}: a `for` of {rule['for']!r}")
                rule["for"] = _scaled(int(found.group(1)), found.group(2), scale)
    return yaml.safe_dump(document, sort_keys=False)


@dataclass(frozen=True)
class Notice:
    """One alert of one Alertmanager notification, as the receiver got it."""

    at: float  # time.monotonic() on arrival
    status: str  # firing | resolved
    alert: str
    labels: dict[str, str]


class _Handler(BaseHTTPRequestHandler):
    server: AlertReceiver

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        now = time.monotonic()
        with self.server.lock:
            for alert in body.get("alerts", []):
                labels = dict(alert.get("labels", {}))
                self.server.notices.append(
                    Notice(now, str(alert.get("status")), labels.get("alertname", ""), labels)
                )
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return


class AlertReceiver(ThreadingHTTPServer):
    """Alertmanager's webhook receiver: keeps every alert of every notification."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__((HOST, 0), _Handler)
        self.notices: list[Notice] = []
        self.lock = threading.Lock()
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.server_address[1]}/alerts"

    def __exit__(self, *args: object) -> None:
        self.shutdown()
        self.server_close()

    def seen(self, since: float = 0.0) -> list[Notice]:
        with self.lock:
            return [n for n in self.notices if n.at >= since]

    def wait_for(self, alert: str, status: str, since: float, timeout: float) -> float | None:
        """Seconds from `since` until `alert` arrived with `status`, waiting at most `timeout`
        seconds from now; None when it did not."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for notice in self.seen(since):
                if notice.alert == alert and notice.status == status:
                    return notice.at - since
            time.sleep(0.2)
        return None


class Monitoring:
    """Prometheus scraping the API's metrics listener (`serve --metrics-listen`, which answers
    while the database is down, when /metrics cannot check a key), evaluating the scaled
    rules, and Alertmanager sending to `receiver`; both Debian's, in the cluster's directory."""

    def __init__(
        self, cluster: Cluster, receiver: AlertReceiver, *, metrics_port: int, scale: float
    ) -> None:
        self.root = cluster.root / "monitoring"
        self.root.mkdir()
        self.prometheus_port = free_port()
        self.alertmanager_port = free_port()
        (self.root / "rules.yml").write_text(scaled_rules(RULES.read_text(), scale))
        (self.root / "alertmanager.yml").write_text(
            yaml.safe_dump(
                {
                    "route": {
                        "receiver": "harness",
                        "group_by": ["alertname", "tenant", "queue", "watcher", "holder"],
                        "group_wait": "1s",
                        "group_interval": "1s",
                        "repeat_interval": "1h",
                    },
                    "receivers": [
                        {
                            "name": "harness",
                            "webhook_configs": [{"url": receiver.url, "send_resolved": True}],
                        }
                    ],
                }
            )
        )
        (self.root / "prometheus.yml").write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": ["rules.yml"],
                    "alerting": {
                        "alertmanagers": [
                            {"static_configs": [{"targets": [f"{HOST}:{self.alertmanager_port}"]}]}
                        ]
                    },
                    "scrape_configs": [
                        {
                            "job_name": "queue-server",
                            "static_configs": [{"targets": [f"{HOST}:{metrics_port}"]}],
                        }
                    ],
                }
            )
        )
        self.procs: list[subprocess.Popen[bytes]] = []

    def _start(self, name: str, args: list[str], port: int) -> None:
        with (self.root / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen(
                args,
                cwd=self.root,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.procs.append(proc)
        if not wait_answering(f"http://{HOST}:{port}/-/ready", proc=proc):
            raise RuntimeError(f"{name} did not start:\n{self.log(name)}")

    def log(self, name: str) -> str:
        with contextlib.suppress(OSError):
            return (self.root / f"{name}.log").read_text(errors="replace")[-3000:]
        return ""

    def __enter__(self) -> Monitoring:
        self._start(
            "alertmanager",
            [
                ALERTMANAGER,
                f"--config.file={self.root / 'alertmanager.yml'}",
                f"--storage.path={self.root / 'alertmanager-data'}",
                f"--web.listen-address={HOST}:{self.alertmanager_port}",
                "--cluster.listen-address=",
                "--log.level=warn",
            ],
            self.alertmanager_port,
        )
        self._start(
            "prometheus",
            [
                PROMETHEUS,
                f"--config.file={self.root / 'prometheus.yml'}",
                f"--storage.tsdb.path={self.root / 'prometheus-data'}",
                f"--web.listen-address={HOST}:{self.prometheus_port}",
                "--log.level=warn",
            ],
            self.prometheus_port,
        )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def query(self, expr: str) -> list[dict[str, Any]]:
        answer = httpx.get(
            f"http://{HOST}:{self.prometheus_port}/api/v1/query", params={"query": expr}, timeout=5
        ).json()
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def wait_scraping(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, KeyError):
                if any(r["value"][1] == "1" for r in self.query('up{job="queue-server"}')):
                    return
            time.sleep(0.5)
        raise RuntimeError(f"Prometheus never scraped the API:\n{self.log('prometheus')}")


def alert_delivery(
    *,
    quiet: float = 60.0,
    outage: float = 60.0,
    scale: float = 60.0,
    window: float = 60.0,
    name: str = "alert delivery",
) -> ScenarioOutcome:
    """Each fault's alert delivered within `window` seconds and resolved within `window` after
    recovery; nothing fired in `quiet` seconds of steady load before the faults."""
    began = time.monotonic()
    missing = ensure_packages("prometheus", "prometheus-alertmanager")
    if missing is not None:
        raise RuntimeError(f"Prometheus and Alertmanager are needed: {missing}")
    extras: list[Violation] = []
    metrics: dict[str, JSONValue] = {}
    metrics_port = free_port()
    with (
        Cluster(
            name="alerts",
            api_env={**FAST_API_ENV, **OBJECTIVES, "QUEUE_SERVER_TRANSPORT_ALLOW": f'["{HOST}"]'},
            api_args=["--metrics-listen", f"{HOST}:{metrics_port}"],
        ) as cluster,
        AlertReceiver() as receiver,
    ):
        tenant = "alerts"
        keys = cluster.create_tenant(tenant, max_concurrency=8)
        recorder = HistoryRecorder(source="harness")
        stop = threading.Event()
        client = RecordingClient(cluster.base_url, keys.worker, tenant, recorder, stop=stop)
        hooks = WebhookRun(cluster, tenant, keys.operator, backoff_scale=0.05)
        producers = Load(client, stop, producers=1, workers=0, requeue_ratio=0.0,
                         producer_pause=0.1, max_items_total=10**9)  # fmt: skip
        working = threading.Event()
        workers = Load(client, working, producers=0, workers=2, requeue_ratio=0.0, ttl=5.0)
        with Monitoring(cluster, receiver, metrics_port=metrics_port, scale=scale) as monitoring:
            monitoring.wait_scraping()
            say(f"{name}: a quiet baseline of {quiet:.0f}s")
            start = time.monotonic()
            time.sleep(quiet)
            fired = sorted({n.alert for n in receiver.seen(start) if n.status == "firing"})
            metrics["quiet_baseline_alerts"] = list(fired)
            if fired:
                extras.append(
                    Violation("alerts", f"fired during the quiet baseline: {', '.join(fired)}")
                )

            def expect(alert: str, fault: str, begin: Any, end: Any) -> None:
                """Start the fault, wait for `alert` to fire, end it, wait for the resolve."""
                say(f"{name}: {fault}")
                since = time.monotonic()
                begin()
                took = receiver.wait_for(alert, "firing", since, window)
                end()
                ended = time.monotonic()
                cleared = receiver.wait_for(alert, "resolved", ended, window)
                metrics[f"{alert}_fired_after_s"] = None if took is None else round(took, 1)
                metrics[f"{alert}_resolved_after_s"] = (
                    None if cleared is None else round(cleared, 1)
                )
                if took is None:
                    extras.append(Violation("alerts", f"{alert} not delivered in {window:.0f}s"))
                elif cleared is None:
                    extras.append(
                        Violation("alerts", f"{alert} not resolved {window:.0f}s after {fault}")
                    )
                else:
                    say(f"  {alert}: fired after {took:.1f}s, resolved {cleared:.1f}s after")

            # Workers stopped while work arrives; then started again.
            def restart_workers() -> None:
                nonlocal workers, working
                working = threading.Event()
                workers = Load(client, working, producers=0, workers=2, requeue_ratio=0.0,
                               ttl=5.0)  # fmt: skip

            def stop_workers() -> None:
                working.set()
                workers.join()

            expect("QueueServerOldestReadyItemTooOld", "workers stopped", stop_workers,
                   restart_workers)  # fmt: skip

            # A snapshot held open (a forgotten BEGIN), then ended.
            held: list[psycopg.Connection[Any]] = []

            def hold() -> None:
                conn = psycopg.connect(cluster.db_url, application_name=HARNESS_APP)
                conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
                conn.execute("SELECT count(*) FROM work_items").fetchone()
                held.append(conn)

            def release() -> None:
                for conn in held:
                    conn.rollback()
                    conn.close()

            expect("QueueServerSnapshotHoldsHorizon", "a snapshot held", hold, release)

            # The watcher's receiver down, then back.
            expect(
                "QueueServerWebhookDeliveryLagging", "the watcher's receiver failing",
                hooks.receiver.failing.set, hooks.receiver.failing.clear,
            )  # fmt: skip

            # The database stopped, then started.
            def restart() -> None:
                # The outage lasts `outage` seconds however soon its alert came.
                time.sleep(max(0.0, outage - (time.monotonic() - crashed[0])))
                cluster.start_pg()

            crashed: list[float] = []

            def crash() -> None:
                crashed.append(time.monotonic())
                cluster.crash_pg()

            expect("QueueServerDatabaseUnavailable", f"the database stopped for {outage:.0f}s",
                   crash, restart)  # fmt: skip
            metrics["notifications"] = len(receiver.seen())
        stop.set()
        working.set()
        producers.join()
        workers.join()
        hooks.stop()
        report, history, snapshot = finish(
            cluster,
            recorder,
            name,
            [tenant],
            clients=[client],
            extras=extras,
            faults_injected=4,
        )
    return ScenarioOutcome(report, time.monotonic() - began, metrics, history, snapshot)
