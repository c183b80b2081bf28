"""A queue's rate limit held for a minute by four worker processes racing through two API
processes: never more than the limit in any window, and within 5 % of it over the run.

The queue holds `limit` leases per `per` seconds (the whole queue's limit, then a limit per
partition key with two keys). Four worker processes acquire and complete as fast as they
can through an API served by two processes; what was handed out is read from the ledgers'
`acquired` events, by the database's clock. Two checkers: `ceiling` (no window of `per`
seconds holds more than the limit, for the queue or for either key) and `accuracy` (over
whole windows from the first lease to the last, at least 95 % of the limit's worth, and
leases to within two windows of the run's end).
"""

from __future__ import annotations

import multiprocessing
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

import httpx

from reliability.checkers import CheckReport, Violation
from reliability.cluster import Cluster, say
from reliability.history import JSONValue
from reliability.scenarios import ScenarioOutcome

TENANT = "rated"
WORKERS = 4


def _ready(_: int) -> bool:
    time.sleep(0.1)  # long enough that every process of the pool takes one
    return True


def _work(url: str, key: str, worker: str, queue: str, until: float) -> int:
    """One worker process: acquire (no long poll) and complete, as fast as it can."""
    done = 0
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}) as client:
        while time.time() < until:
            answer = client.post(
                f"/v1/tenants/{TENANT}/queues/{queue}/leases",
                json={"worker": worker, "lease_ttl": 30, "max_items": 5},
            )
            if answer.status_code != 200:
                continue
            for lease in answer.json()["leases"]:
                client.post(
                    f"/v1/tenants/{TENANT}/items/{lease['item_id']}/complete",
                    json={"worker": worker, "fence": lease["fence"]},
                    headers={"Idempotency-Key": uuid.uuid4().hex},
                )
                done += 1
    return done


def busiest(times: list[datetime], per: float) -> int:
    """The most acquisitions in any window of `per` seconds."""
    span, most, first = timedelta(seconds=per), 0, 0
    for last, at in enumerate(times):
        while times[first] <= at - span:
            first += 1
        most = max(most, last - first + 1)
    return most


def _acquired(cluster: Cluster, queue: str) -> dict[str, list[datetime]]:
    """The instants of the queue's `acquired` events, per partition key ('' for none)."""
    with cluster.db() as conn:
        rows = conn.execute(
            "SELECT coalesce(w.partition_key, '') AS k, e.at FROM item_events e"
            " JOIN work_items w USING (tenant_id, item_id)"
            " WHERE e.tenant_id = %s AND w.queue = %s AND e.kind = 'acquired' ORDER BY e.at",
            (TENANT, queue),
        ).fetchall()
    by_key: dict[str, list[datetime]] = {}
    for row in rows:
        by_key.setdefault(row["k"], []).append(row["at"])
    return by_key


def _phase(
    cluster: Cluster,
    keys: Any,
    queue: str,
    *,
    limit: int,
    per: float,
    partitioned: bool,
    duration: float,
    partitions: tuple[str, ...],
) -> tuple[dict[str, list[datetime]], int]:
    with httpx.Client(base_url=cluster.base_url, timeout=30) as http:
        operator = {"Authorization": f"Bearer {keys.operator}"}
        settings = http.put(
            f"/v1/tenants/{TENANT}/queues/{queue}/settings",
            json={"rate_limit": {"limit": limit, "per": per, "partitioned": partitioned}},
            headers={**operator, "Idempotency-Key": uuid.uuid4().hex},
        )
        settings.raise_for_status()
        # More than the run can take: the limit, not the backlog, holds the workers back.
        total = int(limit / per * duration * 1.5 * max(1, len(partitions))) + 50
        worker = {"Authorization": f"Bearer {keys.worker}"}
        for start in range(0, total, 500):
            batch: list[dict[str, Any]] = [
                {"payload": n, "partition_key": partitions[n % len(partitions)]}
                if partitions
                else {"payload": n}
                for n in range(start, min(total, start + 500))
            ]
            made = http.post(
                f"/v1/tenants/{TENANT}/queues/{queue}/items:batch",
                json={"items": batch},
                headers={**worker, "Idempotency-Key": uuid.uuid4().hex},
            )
            made.raise_for_status()
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(WORKERS) as pool:
        assert pool.map(_ready, range(WORKERS * 2)) == [True] * (WORKERS * 2)
        until = time.time() + duration
        done = pool.starmap(
            _work,
            [(cluster.base_url, keys.worker, f"w{n}", queue, until) for n in range(WORKERS)],
        )
    return _acquired(cluster, queue), sum(done)


def _judge(
    name: str,
    times: list[datetime],
    *,
    limit: int,
    per: float,
    duration: float,
    violations: list[Violation],
) -> dict[str, JSONValue]:
    most = busiest(times, per)
    if most > limit:
        violations.append(Violation("ceiling", f"{name}: {most} leases within {per:g}s"))
    # The whole windows from the first lease to the last (the run's end cuts a window
    # short), and a run that leased to near its end: a stall is not a shorter run.
    span = (times[-1] - times[0]).total_seconds() if times else 0.0
    if span < duration - 2 * per:
        violations.append(Violation("accuracy", f"{name}: leases for {span:.1f}s only"))
    windows = int(span / per)
    got = sum(1 for t in times if t < times[0] + timedelta(seconds=windows * per))
    expected = windows * limit
    if got < 0.95 * expected:
        violations.append(
            Violation("accuracy", f"{name}: {got} leases in {windows} windows, expected {expected}")
        )
    return {"busiest_window": most, "in_whole_windows": got, "expected": expected,
            "ratio": round(got / expected, 3) if expected else None}  # fmt: skip


def rate_accuracy(
    *, name: str = "rate accuracy", duration: float = 60.0, limit: int = 40, per: float = 1.0
) -> ScenarioOutcome:
    """Four worker processes racing a queue's rate limit, then a limit per partition key."""
    began = time.monotonic()
    violations: list[Violation] = []
    metrics: dict[str, JSONValue] = {"duration_s": duration, "limit": limit, "per_s": per}
    operations = 0
    with Cluster(name="rated", api_args=["--workers", "2"]) as cluster:
        keys = cluster.create_tenant(
            TENANT, backlog_cap=10_000, max_concurrency=50, queues=("whole", "keyed")
        )
        say(f"{name}: {limit} per {per:g}s over the queue, {WORKERS} processes, {duration:g}s")
        whole, done = _phase(
            cluster, keys, "whole", limit=limit, per=per, partitioned=False,
            duration=duration, partitions=(),
        )  # fmt: skip
        times = sorted(t for ts in whole.values() for t in ts)
        if done != len(times):
            violations.append(Violation("ledger", f"{done} completed, {len(times)} ledgered"))
        operations += done
        metrics["whole_queue"] = _judge(
            "the queue", times, limit=limit, per=per, duration=duration, violations=violations
        )
        keyed_limit = limit // 2
        say(f"{name}: {keyed_limit} per {per:g}s per partition key, two keys, {duration:g}s")
        keyed, done = _phase(
            cluster, keys, "keyed", limit=keyed_limit, per=per, partitioned=True,
            duration=duration, partitions=("north", "south"),
        )  # fmt: skip
        operations += done
        for key in ("north", "south"):
            metrics[f"key_{key}"] = _judge(
                f"key {key}", keyed.get(key, []), limit=keyed_limit, per=per,
                duration=duration, violations=violations,
            )  # fmt: skip
    by_checker: dict[str, int] = {}
    for violation in violations:
        by_checker[violation.checker] = by_checker.get(violation.checker, 0) + 1
    report = CheckReport(
        scenario=name,
        operations=operations,
        faults_injected=0,
        lost=0,
        duplicated=0,
        violations=tuple(violations),
        by_checker=by_checker,
    )
    return ScenarioOutcome(report, time.monotonic() - began, metrics)
