"""Database-side hazards against the real server: row locks held by another
session (lock and statement timeouts), a long-open snapshot holding back vacuum
under load, and the claim storm on a second PostgreSQL major version.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg.rows import dict_row

from reliability.checkers import CheckReport, Violation
from reliability.client import RecordingClient
from reliability.cluster import HARNESS_APP, Cluster, say
from reliability.debian import ensure_packages
from reliability.history import HistoryRecorder, JSONValue, OpKind
from reliability.scenarios import (
    FAST_API_ENV,
    Load,
    ScenarioOutcome,
    claim_storm,
    fill,
    finish,
    percentile,
    probe_backlog,
    with_extras,
)

__all__ = [
    "PG15_BIN",
    "IdleInTransactionWatch",
    "claim_storm_pg15",
    "lock_timeouts",
    "long_transaction",
]

PG15_BIN = Path("/usr/lib/postgresql/15/bin")
#: Slack on top of a timeout for the round trip, the rollback and the answer.
SLACK = 1.5


@contextlib.contextmanager
def holding(cluster: Cluster, sql: str, params: tuple[Any, ...]) -> Iterator[None]:
    """Run ``sql`` (a ``SELECT ... FOR UPDATE``) in an open transaction of the
    harness's and hold its locks until the block ends."""
    with (
        psycopg.connect(cluster.db_url, application_name=HARNESS_APP, row_factory=dict_row) as c,
        c.transaction(),
    ):
        rows = c.execute(sql, params).fetchall()
        if not rows:
            raise RuntimeError(f"nothing to lock: {sql} {params}")
        yield


class IdleInTransactionWatch:
    """Samples pg_stat_activity every 0.25 s for API sessions idle in a transaction
    for longer than ``older_than`` seconds; keeps the worst count seen."""

    def __init__(self, cluster: Cluster, older_than: float = 1.0) -> None:
        self.cluster = cluster
        self.older_than = older_than
        self.worst = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="idle-in-tx", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            with contextlib.suppress(psycopg.Error):
                self.worst = max(self.worst, self.cluster.idle_in_transaction(self.older_than))
                self.samples += 1

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return self.worst


@dataclass
class Blocked:
    label: str
    status: int | None
    code: str | None
    seconds: float
    problem_json: bool

    def describe(self) -> str:
        return f"{self.status} {self.code or ''} in {self.seconds:.2f}s".replace("  ", " ")


def _call(
    http: httpx.Client, label: str, method: str, path: str, body: JSONValue, key: str | None
) -> Blocked:
    headers = {"Idempotency-Key": key} if key else {}
    start = time.monotonic()
    try:
        response = http.request(method, path, json=body, headers=headers)
    except httpx.HTTPError as exc:
        return Blocked(label, None, type(exc).__name__, time.monotonic() - start, False)
    seconds = time.monotonic() - start
    code = None
    if response.status_code >= 400:
        with contextlib.suppress(ValueError, AttributeError):
            code = str(response.json().get("code"))
    ctype = response.headers.get("content-type", "")
    return Blocked(
        label,
        response.status_code,
        code,
        seconds,
        response.status_code < 400 or ctype.startswith("application/problem+json"),
    )


def lock_timeouts(*, name: str = "lock and statement timeouts") -> ScenarioOutcome:
    """Requests blocked by row locks another session holds answer 503 ``timeout``
    within the configured bound (never hang), write nothing, and leave no API
    session idle in a transaction; the same request succeeds once the lock is gone."""
    began = time.monotonic()
    violations: list[Violation] = []
    metrics: dict[str, JSONValue] = {}
    operations = 0
    phases: list[tuple[str, dict[str, str], float]] = [
        ("lock_timeout 500 ms", {"QUEUE_SERVER_LOCK_TIMEOUT_MS": "500"}, 0.5),
        (
            "statement_timeout 1000 ms (lock_timeout 60 s)",
            {
                "QUEUE_SERVER_LOCK_TIMEOUT_MS": "60000",
                "QUEUE_SERVER_STATEMENT_TIMEOUT_MS": "1000",
            },
            1.0,
        ),
        ("defaults (lock_timeout 5 s)", {}, 5.0),
    ]
    with Cluster(name="locks", api_env=FAST_API_ENV) as cluster:
        keys = cluster.create_tenant("locks", max_concurrency=8)
        worker = {"Authorization": f"Bearer {keys.worker}"}
        watch = IdleInTransactionWatch(cluster)
        for phase_no, (label, env, bound) in enumerate(phases):
            cluster.stop_api()
            cluster.api_env = {**FAST_API_ENV, **env}
            cluster.start_api()
            limit = bound + SLACK
            results: dict[str, JSONValue] = {}
            with httpx.Client(
                base_url=cluster.base_url, headers=worker, timeout=bound + 30
            ) as http:
                base = "/v1/tenants/locks"
                made = http.post(
                    f"{base}/queues/q/items:batch",
                    json={"items": [{"payload": {"n": n}} for n in range(3)]},
                    headers={"Idempotency-Key": uuid.uuid4().hex},
                )
                made.raise_for_status()
                lease = http.post(
                    f"{base}/queues/q/leases", json={"worker": "w", "lease_ttl": 30}
                ).json()["leases"][0]
                item, fence = str(lease["item_id"]), int(lease["fence"])
                checks: list[tuple[str, str, tuple[Any, ...], str, str, JSONValue, bool]] = [
                    (
                        "enqueue under the tenant row lock",
                        "SELECT 1 FROM tenants WHERE tenant_id = %s FOR UPDATE",
                        ("locks",),
                        "POST",
                        f"{base}/queues/q/items",
                        {"payload": {"blocked": True}},
                        True,
                    ),
                    (
                        "heartbeat under the item row lock",
                        "SELECT 1 FROM work_items WHERE item_id = %s FOR UPDATE",
                        (item,),
                        "POST",
                        f"{base}/items/{item}/heartbeat",
                        {"worker": "w", "fence": fence, "lease_ttl": 30},
                        False,
                    ),
                    (
                        "complete under the item row lock",
                        "SELECT 1 FROM work_items WHERE item_id = %s FOR UPDATE",
                        (item,),
                        "POST",
                        f"{base}/items/{item}/complete",
                        {"worker": "w", "fence": fence, "result": {}},
                        True,
                    ),
                ]
                if phase_no > 0:
                    checks = checks[:1]
                for what, sql, params, method, path, body, effecting in checks:
                    key = uuid.uuid4().hex if effecting else None
                    with holding(cluster, sql, params):
                        got = _call(http, what, method, path, body, key)
                        # Acquire skips locked rows: it must not wait on the lock at all.
                        skip = _call(
                            http,
                            "acquire meanwhile",
                            "POST",
                            f"{base}/queues/q/leases",
                            {"worker": "w2", "lease_ttl": 5},
                            None,
                        )
                    operations += 2
                    results[what] = got.describe()
                    results[f"acquire during '{what}'"] = skip.describe()
                    if got.status != 503 or got.code != "timeout" or not got.problem_json:
                        violations.append(
                            Violation("timeouts", f"{label}: {what}: {got.describe()}")
                        )
                    if got.seconds > limit:
                        violations.append(
                            Violation(
                                "timeouts",
                                f"{label}: {what} took {got.seconds:.2f}s (bound {limit:.1f}s)",
                            )
                        )
                    if skip.status != 200 or skip.seconds > 1.0:
                        violations.append(
                            Violation(
                                "timeouts",
                                f"{label}: an acquire while '{what}' held its lock: "
                                f"{skip.describe()}",
                            )
                        )
                    if key is not None and _receipts(cluster, key):
                        violations.append(
                            Violation("timeouts", f"{label}: {what} left an idempotency receipt")
                        )
                    if effecting:
                        again = _call(http, what, method, path, body, key)
                        operations += 1
                        results[f"{what}, retried after the lock"] = again.describe()
                        if again.status is None or not 200 <= again.status < 300:
                            violations.append(
                                Violation(
                                    "timeouts",
                                    f"{label}: {what} retried with the same key after the "
                                    f"lock was released: {again.describe()}",
                                )
                            )
            metrics[label] = results
            say(f"{name}: {label}: {results}")
        idle = watch.stop()
        metrics["api_sessions_idle_in_transaction_over_1s"] = idle
        metrics["idle_in_transaction_samples"] = watch.samples
        if idle:
            violations.append(
                Violation("idle-in-transaction", f"{idle} API sessions idle in a transaction")
            )
    by_checker: dict[str, int] = {"timeouts": 0, "idle-in-transaction": 0}
    for violation in violations:
        by_checker[violation.checker] = by_checker.get(violation.checker, 0) + 1
    report = CheckReport(
        scenario=name,
        operations=operations,
        faults_injected=operations // 2,
        lost=0,
        duplicated=0,
        violations=tuple(violations),
        by_checker=by_checker,
    )
    return ScenarioOutcome(report, time.monotonic() - began, metrics)


def _receipts(cluster: Cluster, key: str) -> int:
    with cluster.db() as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM idempotency_receipts"
            " WHERE idempotency_key = %s OR split_part(idempotency_key, ' ', 2) = %s",
            (key, key),
        ).fetchone()
    return int(row["n"]) if row else 0


def _dead_tuples(cluster: Cluster) -> int:
    with cluster.db() as conn:
        row = conn.execute(
            "SELECT coalesce(sum(n_dead_tup), 0) AS n FROM pg_stat_user_tables "
            "WHERE relname IN ('work_items', 'item_events')"
        ).fetchone()
    return int(row["n"]) if row else 0


def _vacuum(cluster: Cluster) -> int:
    """VACUUM the hot table, then its dead tuples as the statistics report them."""
    with cluster.db() as conn:
        conn.execute("VACUUM work_items")
        conn.execute("SELECT pg_stat_force_next_flush()")
        time.sleep(0.6)
        row = conn.execute(
            "SELECT n_dead_tup AS n FROM pg_stat_user_tables WHERE relname = 'work_items'"
        ).fetchone()
    return int(row["n"]) if row else 0


def _latency(values: list[float]) -> dict[str, JSONValue]:
    return {
        "p50_ms": round(percentile(values, 0.5) * 1000, 2),
        "p99_ms": round(percentile(values, 0.99) * 1000, 2),
        "max_ms": round(max(values, default=0.0) * 1000, 2),
        "n": len(values),
    }


def long_transaction(
    *, phase: float = 12.0, p99_bound: float = 1.0, name: str = "long-open transaction"
) -> ScenarioOutcome:
    """A REPEATABLE READ snapshot held open under load holds back vacuum; acquire
    latency stays bounded (p50/p99 with and without it) and no API session is left
    idle in a transaction."""
    began = time.monotonic()
    with Cluster(name="longtx", api_env=FAST_API_ENV) as cluster:
        tenant = "longtx"
        keys = cluster.create_tenant(tenant, max_concurrency=16)
        recorder = HistoryRecorder(source="harness")
        stop = threading.Event()
        client = RecordingClient(cluster.base_url, keys.worker, tenant, recorder, stop=stop)
        fill(client, "q", 1000)
        probe = probe_backlog(cluster, [tenant], recorder, stop)
        watch = IdleInTransactionWatch(cluster)
        load = Load(
            client,
            stop,
            producers=2,
            workers=3,
            ttl=5.0,
            max_items_total=10**9,
            requeue_ratio=0.1,
            producer_pause=0.01,
        )
        time.sleep(1.0)
        marks = {"base": time.monotonic()}
        say(f"{name}: baseline load for {phase:.0f}s")
        time.sleep(phase)
        marks["hold"] = time.monotonic()
        with psycopg.connect(cluster.db_url, application_name=HARNESS_APP) as snap:
            snap.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            snap.execute("SELECT count(*) FROM work_items").fetchone()
            say(f"{name}: a REPEATABLE READ snapshot is open; load for {phase:.0f}s")
            time.sleep(phase)
            marks["held"] = time.monotonic()
            with cluster.db() as conn:
                row = conn.execute(
                    "SELECT age(backend_xmin) AS age FROM pg_stat_activity "
                    "WHERE application_name = %s AND backend_xmin IS NOT NULL "
                    "ORDER BY age(backend_xmin) DESC LIMIT 1",
                    (HARNESS_APP,),
                ).fetchone()
            xmin_age = int(row["age"]) if row and row["age"] is not None else 0
            dead_held = _vacuum(cluster)
            snap.rollback()
        dead_released = _vacuum(cluster)
        stop.set()
        load.join()
        probe.join(5)
        idle = watch.stop()
        report, history, snapshot = finish(cluster, recorder, name, [tenant], clients=[client])
        acquires = [op for op in history.operations if op.kind is OpKind.ACQUIRE]

        def window(start: float, end: float) -> list[float]:
            return [
                op.end_mono - op.start_mono
                for op in acquires
                if start <= op.start_mono and op.end_mono <= end
            ]

        without = window(marks["base"], marks["hold"])
        held = window(marks["hold"], marks["held"])
        extras: list[Violation] = []
        if idle:
            extras.append(
                Violation("idle-in-transaction", f"{idle} API sessions idle in a transaction")
            )
        if not held or percentile(held, 0.99) > p99_bound:
            extras.append(
                Violation(
                    "latency",
                    f"acquire p99 {percentile(held, 0.99) * 1000:.0f} ms with the snapshot "
                    f"held (bound {p99_bound * 1000:.0f} ms; {len(held)} acquires)",
                )
            )
        if dead_held <= dead_released:
            extras.append(
                Violation(
                    "harness",
                    f"the snapshot did not hold back vacuum (dead tuples {dead_held} held, "
                    f"{dead_released} released)",
                )
            )
        report = with_extras(report, extras)
        statuses = Counter(op.status for op in history.operations)
        metrics: dict[str, JSONValue] = {
            "acquire_without_snapshot": _latency(without),
            "acquire_with_snapshot_held": _latency(held),
            "p50_ratio": round(
                percentile(held, 0.5) / percentile(without, 0.5) if without else 0.0, 2
            ),
            "snapshot_xmin_age_xids": xmin_age,
            "work_items_dead_tuples_after_vacuum": {
                "snapshot_held": dead_held,
                "snapshot_released": dead_released,
            },
            "api_sessions_idle_in_transaction_over_1s": idle,
            "completed": load.completed,
            "answers": {str(k): v for k, v in sorted(statuses.items(), key=lambda kv: kv[0] or 0)},
        }
        client.close()
    return ScenarioOutcome(report, time.monotonic() - began, metrics, history, snapshot)


def claim_storm_pg15(
    *,
    items: int = 1500,
    duration: float = 30.0,
    bin_dir: Path = PG15_BIN,
    name: str = "claim storm (PostgreSQL 15)",
) -> ScenarioOutcome:
    """The claim storm, smaller, against Debian's PostgreSQL 15 binaries."""
    missing = ensure_packages("postgresql-15") if bin_dir == PG15_BIN else None
    if not (bin_dir / "postgres").exists():
        report = CheckReport(
            scenario=name,
            operations=0,
            faults_injected=0,
            lost=0,
            duplicated=0,
            violations=(
                Violation("harness", f"no PostgreSQL binaries under {bin_dir}: {missing}"),
            ),
            by_checker={"harness": 1},
        )
        return ScenarioOutcome(report, 0.0, {"pg_bin_dir": str(bin_dir), "available": False})
    return claim_storm(
        items=items,
        processes=4,
        threads=4,
        ttl=1.5,
        duration=duration,
        name=name,
        pg_bin_dir=bin_dir,
    )
