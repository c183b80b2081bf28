"""`make soak`: a steady mixed load for an hour (``--minutes``), with faults on a timetable.

One server (embedded PostgreSQL, `serve --metrics-listen`), watched by Debian's Prometheus
and Alertmanager with deploy/prometheus's rules as they ship. The load:

- harness producers and workers on queue ``q`` (every operation recorded: the usual
  checkers judge the history at the end);
- SDK worker processes (`queue_server.client.Worker`) on queue ``sdk``, fed by a producer
  and by a schedule that fires every 10 seconds;
- a watcher of completions, with `queue-server deliver` sending to a receiver.

The faults, at fixed shares of the run: an SDK worker process SIGKILLed (and started
again), the API process restarted, the database restarted, a REPEATABLE READ snapshot
held. Every 10 seconds the API's and the workers' RSS and the database's connections are
sampled. At the end: every acknowledged item completed once (`ledger verify` clean, the
checkers), each SLO's attainment per hour outside the faults' windows (from Prometheus),
the RSS growth after the first ten minutes, table and index sizes. The report goes to
soak.md and soak.json in the results directory (`--out`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg

from reliability.alerts import AlertReceiver, Monitoring
from reliability.checkers import Violation
from reliability.client import RecordingClient
from reliability.cluster import HARNESS_APP, HOST, Cluster, free_port, say, venv_bin
from reliability.debian import ensure_packages
from reliability.history import HistoryRecorder
from reliability.scenarios import Load, finish
from reliability.webhooks import WebhookRun

RESULTS = Path(__file__).resolve().parent / "results"
SAMPLE_EVERY = 10.0
# What "outside the faults" leaves out: from a fault's start to this long after its end
# (the rules' five-minute windows, and the backlog a fault left, drain in that time).
AFTER_A_FAULT = 300.0
# The SLOs as the recording rules compute them, each with its bound (docs/slos.md).
INDICATORS = {
    "late leases (<= 1%)": ("max(queue_server:late_leases:ratio_rate5m)", 0.01),
    "5xx answers (<= 0.1%)": ("max(queue_server:request_errors:ratio_rate5m)", 0.001),
    "API p99 latency (<= 0.5 s)": ("max(queue_server:request_seconds:p99_5m)", 0.5),
    "oldest ready item (<= 300 s)": ("max(queue_server_queue_oldest_ready_age_seconds)", 300.0),
    "webhook lag (<= 300 s)": ("max(queue_server_watcher_oldest_pending_age_seconds)", 300.0),
}
TABLES = ("work_items", "item_events", "idempotency_receipts", "outbox_deliveries",
          "counter_deltas", "counter_bases", "queue_samples")  # fmt: skip

SDK_WORKER = """
import sys
from queue_server.client import QueueClient, Worker
with QueueClient() as qs:
    Worker(qs, sys.argv[1], lambda job: {"ok": True}, concurrency=4).run()
"""


@dataclass
class Fault:
    name: str
    at: float  # share of the run
    began: float = 0.0
    ended: float = 0.0


@dataclass
class Samples:
    rows: list[dict[str, float]] = field(default_factory=list)


class SdkWorkers:
    """SDK worker processes on one queue, each a `Worker` of its own."""

    def __init__(self, cluster: Cluster, key: str, queue: str, count: int) -> None:
        self.env = {
            **os.environ,
            "QUEUE_SERVER_URL": cluster.base_url,
            "QUEUE_SERVER_KEY": key,
        }
        self.queue = queue
        self.log = (cluster.root / "sdk-workers.log").open("ab")
        self.procs = [self._start() for _ in range(count)]

    def _start(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [sys.executable, "-c", SDK_WORKER, self.queue], env=self.env, stdout=self.log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip

    def kill_one(self) -> None:
        """SIGKILL the first worker (its leases expire and are taken again), start another."""
        victim = self.procs.pop(0)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(victim.pid, signal.SIGKILL)
        victim.wait(timeout=10)
        self.procs.append(self._start())

    def rss(self) -> float:
        total = 0.0
        for proc in self.procs:
            with contextlib.suppress(psutil.Error):
                total += psutil.Process(proc.pid).memory_info().rss
        return total

    def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        self.log.close()


def _feed(base_url: str, key: str, tenant: str, queue: str, stop: threading.Event) -> list[int]:
    """Enqueue 10 items a second to `queue` until `stop`; the count acknowledged (201)."""
    acked = [0]

    def run() -> None:
        with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"},
                          timeout=10) as client:  # fmt: skip
            while not stop.wait(0.1):
                with contextlib.suppress(httpx.HTTPError):
                    answer = client.post(
                        f"/v1/tenants/{tenant}/queues/{queue}/items",
                        json={"payload": {"at": time.time()}},
                        headers={"Idempotency-Key": uuid.uuid4().hex},
                    )
                    acked[0] += answer.status_code == 201

    threading.Thread(target=run, daemon=True, name="sdk-feed").start()
    return acked


def _attainment(
    monitoring: Monitoring, start: float, end: float, faults: list[Fault]
) -> dict[str, dict[str, Any]]:
    """Per SLO and per hour of the run: the share of its minutes, outside the faults'
    windows, in which the indicator was within its bound."""
    wall = time.time() - time.monotonic()
    out: dict[str, dict[str, Any]] = {}
    for name, (expr, bound) in INDICATORS.items():
        answer = httpx.get(
            f"http://{HOST}:{monitoring.prometheus_port}/api/v1/query_range",
            params={"query": expr, "start": start + wall, "end": end + wall, "step": "60"},
            timeout=30,
        ).json()
        values = [
            (float(t) - wall, float(v))
            for series in answer["data"]["result"]
            for t, v in series["values"]
            if v not in ("NaN", "+Inf")
        ]
        hours: dict[int, list[bool]] = {}
        for at, value in values:
            if any(f.began <= at <= f.ended + AFTER_A_FAULT for f in faults):
                continue
            hours.setdefault(int((at - start) // 3600), []).append(value <= bound)
        out[name] = {
            f"hour {hour + 1}": (round(sum(met) / len(met), 4) if met else None, len(met))
            for hour, met in sorted(hours.items())
        }
    return out


def soak(*, minutes: float = 60.0, out: Path = RESULTS) -> int:
    """Run the soak; write its report; 0 when everything held, 1 otherwise."""
    began = time.monotonic()
    length = minutes * 60
    missing = ensure_packages("prometheus", "prometheus-alertmanager")
    if missing is not None:
        raise SystemExit(f"Prometheus and Alertmanager are needed: {missing}")
    metrics_port = free_port()
    violations: list[Violation] = []
    report: dict[str, Any] = {"minutes": minutes}
    faults = [
        Fault("an SDK worker process SIGKILLed", 0.2),
        Fault("the API process restarted", 0.35),
        Fault("the database restarted", 0.5),
        Fault("a snapshot held for 2% of the run", 0.7),
    ]
    with (
        Cluster(
            name="soak",
            api_env={"QUEUE_SERVER_TRANSPORT_ALLOW": f'["{HOST}"]'},
            api_args=["--metrics-listen", f"{HOST}:{metrics_port}"],
        ) as cluster,
        AlertReceiver() as receiver,
        Monitoring(cluster, receiver, metrics_port=metrics_port, scale=1.0) as monitoring,
    ):
        tenant = "soak"
        keys = cluster.create_tenant(tenant, max_concurrency=16)
        # The SDK workers' tenant of its own: its items are not in the harness's history,
        # which the checkers hold to every item of theirs.
        sdk_keys = cluster.create_tenant("soak-sdk", max_concurrency=16, queues=("sdk",))
        recorder = HistoryRecorder(source="harness")
        stop = threading.Event()
        client = RecordingClient(cluster.base_url, keys.worker, tenant, recorder, stop=stop)
        load = Load(client, stop, producers=2, workers=3, requeue_ratio=0.02,
                    producer_pause=0.2, max_items_total=10**9, ttl=10.0)  # fmt: skip
        hooks = WebhookRun(cluster, tenant, keys.operator)
        sdk = SdkWorkers(cluster, sdk_keys.worker, "sdk", 2)
        fed = _feed(cluster.base_url, sdk_keys.worker, "soak-sdk", "sdk", stop)
        subprocess.run(
            [venv_bin("queue-server"), "schedules", "put", "tick", "-q", "sdk", "--every", "10",
             "--payload", '{"scheduled": true}', "--url", cluster.base_url,
             "--key", sdk_keys.operator],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        monitoring.wait_scraping()
        start = time.monotonic()
        samples: list[dict[str, float]] = []
        held: list[psycopg.Connection[Any]] = []

        def sample() -> None:
            with cluster.db() as conn:
                row = conn.execute(
                    "SELECT count(*) AS n FROM pg_stat_activity WHERE backend_type = 'client backend'"
                ).fetchone()
                done = conn.execute(
                    "SELECT count(*) AS n FROM work_items WHERE state = 'completed'"
                ).fetchone()
            samples.append({
                "t": round(time.monotonic() - start, 1),
                "api_rss_mb": round(cluster.api_rss() / 2**20, 1),
                "sdk_rss_mb": round(sdk.rss() / 2**20, 1),
                "connections": float(row["n"] if row else 0),
                "completed": float(done["n"] if done else 0),
            })  # fmt: skip

        def run_fault(fault: Fault) -> None:
            say(f"soak: {fault.name}")
            fault.began = time.monotonic()
            if fault.name.startswith("an SDK worker"):
                sdk.kill_one()
            elif fault.name.startswith("the API"):
                cluster.kill_api()
                cluster.start_api()
            elif fault.name.startswith("the database"):
                cluster.crash_pg()
                time.sleep(10)
                cluster.start_pg()
            else:
                conn = psycopg.connect(cluster.db_url, application_name=HARNESS_APP)
                conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
                conn.execute("SELECT count(*) FROM work_items").fetchone()
                held.append(conn)
                time.sleep(0.02 * length)
                conn.rollback()
                conn.close()
            fault.ended = time.monotonic()

        pending = list(faults)
        while (now := time.monotonic()) - start < length:
            while pending and now - start >= pending[0].at * length:
                run_fault(pending.pop(0))
            with contextlib.suppress(psycopg.Error):
                sample()
            elapsed = time.monotonic() - start
            if int(elapsed // 300) != int((elapsed - SAMPLE_EVERY) // 300):
                say(f"soak: {elapsed / 60:.0f} of {minutes:.0f} minutes")
            time.sleep(SAMPLE_EVERY)
        end = time.monotonic()
        say("soak: the load stops; draining")
        stop.set()
        load.join()
        drained = _drain(cluster, tenant, timeout=120) and _drain(cluster, "soak-sdk", 120)
        sdk.stop()
        hooks.wait_drained(120)
        hooks.stop()
        report["attainment"] = _attainment(monitoring, start, end, faults)
        report["alerts_fired"] = sorted({n.alert for n in receiver.seen() if n.status == "firing"})
        report["faults"] = [
            {"name": f.name, "at_minute": round((f.began - start) / 60, 1),
             "seconds": round(f.ended - f.began, 1)} for f in faults
        ]  # fmt: skip
        report["samples"] = samples
        report["sizes_mb"] = _sizes(cluster)
        report["ledger_verify"] = {}
        for key in (keys.operator, sdk_keys.operator):
            verify = subprocess.run(
                [venv_bin("queue-server"), "ledger", "verify", "--url", cluster.base_url,
                 "--key", key, "--json"],
                capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            owner = tenant if key == keys.operator else "soak-sdk"
            report["ledger_verify"][owner] = verify.returncode
            if verify.returncode != 0:
                violations.append(
                    Violation("ledger", f"ledger verify of {owner} exited {verify.returncode}:"
                                        f" {verify.stdout[-500:]}")
                )  # fmt: skip
        report["sdk_queue"] = _sdk_items(cluster, "soak-sdk", acked=fed[0])
        if report["sdk_queue"]["lost"] or report["sdk_queue"]["duplicated"] or not drained:
            violations.append(Violation("sdk", f"sdk queue: {report['sdk_queue']}"))
        checked, _, _ = finish(cluster, recorder, "soak", [tenant], clients=[client])
        # The checkers read every tenant's items; the SDK tenant's are not in the harness's
        # history (its producer, schedule and workers are not recorded): it is judged by
        # its own counts above and its ledger verify.
        checked_violations = [v for v in checked.violations if "[soak-sdk]" not in str(v)]
        report["checkers"] = {
            "operations": checked.operations, "lost": checked.lost,
            "duplicated": checked.duplicated,
            "violations": [str(v) for v in checked_violations][:20],
        }  # fmt: skip
        violations += checked_violations
    report["rss_growth_after_10_min"] = _rss_growth(samples)
    for name, hours in report["attainment"].items():
        for hour, (share, minutes_seen) in hours.items():
            if share is not None and share < 1.0:
                violations.append(Violation("slo", f"{name}, {hour}: met in {share:.1%} of "
                                                   f"{minutes_seen} minutes"))  # fmt: skip
    growth = report["rss_growth_after_10_min"]
    if growth is not None and growth > 0.10:
        violations.append(
            Violation("rss", f"API RSS grew {growth:.1%} after the first ten minutes")
        )
    report["violations"] = [str(v) for v in violations]
    report["seconds"] = round(time.monotonic() - began)
    _write(out, report)
    return 0 if not violations else 1


def _drain(cluster: Cluster, tenant: str, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        counts = cluster.state_counts(tenant)
        if not counts.get("ready") and not counts.get("leased"):
            return True
        time.sleep(1)
    return False


def _sdk_items(cluster: Cluster, tenant: str, *, acked: int) -> dict[str, int]:
    with cluster.db() as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE w.payload ? 'at') AS fed,"
            " count(*) FILTER (WHERE w.state = 'completed') AS completed,"
            " coalesce(sum((SELECT count(*) FROM item_events e WHERE e.tenant_id = w.tenant_id"
            "  AND e.item_id = w.item_id AND e.kind = 'completed') - 1)"
            "  FILTER (WHERE w.state = 'completed'), 0) AS extra"
            " FROM work_items w WHERE w.tenant_id = %s AND w.queue = 'sdk'",
            (tenant,),
        ).fetchone()
    fed = int(row["fed"]) if row else 0
    return {
        "acknowledged": acked,
        "stored": fed,
        "completed": int(row["completed"]) if row else 0,
        "lost": max(0, acked - fed),
        "duplicated": int(row["extra"]) if row else 0,
    }


def _sizes(cluster: Cluster) -> dict[str, dict[str, float]]:
    with cluster.db() as conn:
        rows = conn.execute(
            "SELECT relname, pg_table_size(oid) AS t, pg_indexes_size(oid) AS i"
            " FROM pg_class WHERE relname = ANY(%s)",
            (list(TABLES),),
        ).fetchall()
    return {
        str(r["relname"]): {"table": round(r["t"] / 2**20, 2), "indexes": round(r["i"] / 2**20, 2)}
        for r in rows
    }


def _rss_growth(samples: list[dict[str, float]]) -> float | None:
    """The API's RSS at the end against ten minutes into its last life (the API restart
    starts a new process); None when that life was shorter."""
    lives: list[list[dict[str, float]]] = [[]]
    for s in samples:
        if lives[-1] and s["api_rss_mb"] < 0.5 * lives[-1][-1]["api_rss_mb"]:
            lives.append([])
        lives[-1].append(s)
    last = lives[-1]
    if len(last) < 2:
        return None
    settled = [s for s in last if s["t"] - last[0]["t"] >= 600]
    if len(settled) < 2:
        return None
    return settled[-1]["api_rss_mb"] / settled[0]["api_rss_mb"] - 1


def _write(out: Path, report: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.json").write_text(json.dumps(report, indent=1) + "\n")
    lines = [
        f"# Soak: {report['minutes']:.0f} minutes",
        "",
        f"Result: {'PASS' if not report['violations'] else 'FAIL'} in {report['seconds']} s.",
        "",
        "## SLO attainment outside the faults' windows (share of minutes within the bound)",
        "",
    ]
    hours = sorted({h for by_hour in report["attainment"].values() for h in by_hour})
    lines.append("| SLO | " + " | ".join(hours) + " |")
    lines.append("| --- |" + " ---: |" * len(hours))
    for name, by_hour in report["attainment"].items():
        cells = []
        for hour in hours:
            share, seen = by_hour.get(hour, (None, 0))
            cells.append(f"{share:.1%} of {seen} min" if share is not None else "no data")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "## Faults", ""]
    lines += [
        f"- minute {f['at_minute']}: {f['name']} ({f['seconds']} s)" for f in report["faults"]
    ]
    lines += [
        "",
        f"Alerts that fired: {', '.join(report['alerts_fired']) or 'none'}.",
        "",
        "## Nothing lost, nothing duplicated",
        "",
        f"- harness history: {report['checkers']}",
        f"- SDK queue: {report['sdk_queue']}",
        f"- `ledger verify`, exit status by tenant: {report['ledger_verify']}",
        "",
        "## Memory and connections (every minute)",
        "",
        "| minute | API RSS MB | SDK workers RSS MB | connections | completed |",
        "| ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in report["samples"][:: max(1, int(60 / SAMPLE_EVERY))]:
        lines.append(
            f"| {s['t'] / 60:.0f} | {s['api_rss_mb']} | {s['sdk_rss_mb']} |"
            f" {s['connections']:.0f} | {s['completed']:.0f} |"
        )
    growth = report["rss_growth_after_10_min"]
    lines += [
        "",
        "API RSS growth after the first ten minutes of its last life: "
        + ("not measured (too short)" if growth is None else f"{growth:.1%}"),
        "",
        "## Table and index sizes at the end (MB)",
        "",
        "| table | table | indexes |",
        "| --- | ---: | ---: |",
    ]
    lines += [f"| {t} | {v['table']} | {v['indexes']} |" for t, v in report["sizes_mb"].items()]
    if report["violations"]:
        lines += ["", "## Violations", ""] + [f"- {v}" for v in report["violations"]]
    (out / "soak.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m reliability.soak",
        description="A steady mixed load with faults on a timetable; writes soak.md and"
        " soak.json into the results directory.",
    )
    parser.add_argument("--minutes", type=float, default=60.0, help="how long (default 60)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the report goes")
    args = parser.parse_args(argv)
    return soak(minutes=args.minutes, out=args.out)


if __name__ == "__main__":
    sys.exit(main())
