"""Schedules while the API processes are SIGKILLed: one item per tick, no tick lost.

Two API processes run their scheduler loops on one database. `every: 1` schedules fire
while each process in turn is SIGKILLed and restarted, and once both at the same time
for longer than the grace (so the ticks of that outage are missed ticks, caught up by
the `all-bounded` rule and dropped by `skip`). At the end every tick of the
`all-bounded` schedules, from the first to the last, has exactly one item; no schedule
has two items for one tick; every item's ledger starts with `enqueued` and names its
schedule and tick.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx

from reliability.checkers import CheckReport, Violation
from reliability.cluster import HOST, Cluster, free_port, say, venv_bin, wait_answering
from reliability.history import JSONValue
from reliability.scenarios import FAST_API_ENV, ScenarioOutcome, ledger_fold_violations

TENANT = "sched"
# Two schedules per catch-up rule that must not lose a tick, one that may skip.
ALL_BOUNDED = ("every-second-a", "every-second-b")
SKIP = "every-second-skip"
# A tick older than this is missed: the both-down outage below is longer.
GRACE = 1.0
BOTH_DOWN = 3.0


class ApiProcess:
    """Another `queue-server serve` on the cluster's database (the cluster runs the first)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with (self.cluster.root / f"api-{self.port}.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [venv_bin("queue-server"), "serve", "--host", HOST, "--port", str(self.port)],
                env=self.cluster._env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        if not wait_answering(f"{self.url}/readyz"):
            raise RuntimeError("the second API process did not become ready")

    def kill(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.proc = None


@contextlib.contextmanager
def _second_api(cluster: Cluster) -> Iterator[ApiProcess]:
    second = ApiProcess(cluster)
    second.start()
    try:
        yield second
    finally:
        second.kill()


def _operator(cluster: Cluster, key: str) -> httpx.Client:
    return httpx.Client(
        base_url=cluster.base_url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    )


def _effect(client: httpx.Client, method: str, path: str, body: Any = None) -> None:
    for _ in range(50):  # the API may be restarting
        try:
            response = client.request(
                method, path, json=body, headers={"Idempotency-Key": uuid.uuid4().hex}
            )
        except httpx.TransportError:
            time.sleep(0.2)
            continue
        if response.status_code < 300:
            return
        if response.status_code != 503:
            raise RuntimeError(f"{method} {path}: {response.status_code} {response.text}")
        time.sleep(0.2)
    raise RuntimeError(f"{method} {path}: no answer")


def _ticks(cluster: Cluster) -> dict[str, list[tuple[datetime, str, float]]]:
    """Per schedule: (tick, item id, seconds from tick to enqueue) of each item it enqueued."""
    with cluster.db() as conn:
        rows = conn.execute(
            "SELECT e.data->>'schedule' AS schedule, (e.data->>'tick_at')::timestamptz AS tick,"
            " e.item_id::text AS item_id,"
            " extract(epoch FROM w.created_at - (e.data->>'tick_at')::timestamptz)::float8 AS lag"
            " FROM item_events e JOIN work_items w USING (tenant_id, item_id)"
            " WHERE e.kind = 'scheduled' AND e.tenant_id = %s ORDER BY 1, 2",
            (TENANT,),
        ).fetchall()
    out: dict[str, list[tuple[datetime, str, float]]] = {}
    for row in rows:
        out.setdefault(row["schedule"], []).append((row["tick"], row["item_id"], row["lag"]))
    return out


def _violations(
    ticks: dict[str, list[tuple[datetime, str, float]]], expected: set[str]
) -> tuple[list[Violation], int, int]:
    """(violations, lost ticks, duplicated ticks)."""
    found: list[Violation] = []
    lost = duplicated = 0
    for name in sorted(expected):
        got = ticks.get(name, [])
        if not got:
            found.append(Violation("schedules", f"{name}: no item at all", TENANT))
            continue
        counts = Counter(tick for tick, _, _ in got)
        for tick, n in counts.items():
            if n > 1:
                duplicated += n - 1
                found.append(
                    Violation("one-item-per-tick", f"{name}: {n} items for {tick}", TENANT)
                )
        if name in ALL_BOUNDED:
            seconds = sorted(int(t.timestamp()) for t in counts)
            missing = sorted(set(range(seconds[0], seconds[-1] + 1)) - set(seconds))
            lost += len(missing)
            for second in missing[:20]:
                found.append(
                    Violation(
                        "no-lost-tick",
                        f"{name}: no item for the tick at {datetime.fromtimestamp(second, UTC).isoformat()}",
                        TENANT,
                    )
                )
    return found, lost, duplicated


def schedules_under_kills(
    *, kills: int = 6, duration: float = 30.0, name: str = "schedules under SIGKILL"
) -> ScenarioOutcome:
    """SIGKILL the API processes while every-second schedules fire; one item per tick, none lost."""
    began = time.monotonic()
    env = {**FAST_API_ENV, "QUEUE_SERVER_SCHEDULE_GRACE": str(GRACE)}
    with Cluster(name="schedules", api_env=env) as cluster:
        keys = cluster.create_tenant(TENANT)
        metrics: dict[str, JSONValue] = {}
        with _second_api(cluster) as second, _operator(cluster, keys.operator) as operator:
            for schedule in ALL_BOUNDED:
                _effect(
                    operator,
                    "PUT",
                    f"/v1/tenants/{TENANT}/schedules/{schedule}",
                    {"queue": "q", "every": 1, "catch_up": "all-bounded"},
                )
            _effect(
                operator,
                "PUT",
                f"/v1/tenants/{TENANT}/schedules/{SKIP}",
                {"queue": "q", "every": 1, "catch_up": "skip"},
            )
            rng = random.Random(17)
            restarts: list[JSONValue] = []
            for n in range(kills):
                time.sleep(rng.uniform(1.0, 2.5))
                if n == kills // 2:
                    say(f"{name}: both API processes killed for {BOTH_DOWN:.0f}s")
                    cluster.kill_api()
                    second.kill()
                    time.sleep(BOTH_DOWN)
                    start = time.monotonic()
                    cluster.start_api()
                    second.start()
                else:
                    victim = "first" if n % 2 == 0 else "second"
                    say(f"{name}: killed the {victim} API process ({n + 1}/{kills})")
                    start = time.monotonic()
                    if victim == "first":
                        cluster.kill_api()
                        cluster.start_api()
                    else:
                        second.kill()
                        second.start()
                restarts.append(round(time.monotonic() - start, 2))
            while time.monotonic() - began < duration:
                time.sleep(0.2)
            for schedule in (*ALL_BOUNDED, SKIP):
                _effect(operator, "POST", f"/v1/tenants/{TENANT}/schedules/{schedule}/pause")
            time.sleep(1.0)  # a pass that held a row when its pause came has committed
        ticks = _ticks(cluster)
        snapshot = cluster.snapshot()
        violations, lost, duplicated = _violations(ticks, {*ALL_BOUNDED, SKIP})
        violations += ledger_fold_violations(snapshot)
        scheduled = {item_id for got in ticks.values() for _, item_id, _ in got}
        strays = [i.item_id for i in snapshot.items if i.item_id not in scheduled]
        if strays:
            violations.append(
                Violation("schedules", f"{len(strays)} items no schedule names", TENANT)
            )
        lags = sorted(lag for got in ticks.values() for _, _, lag in got)
        with cluster.db() as conn:
            skipped = conn.execute(
                "SELECT name, skipped FROM schedules WHERE tenant_id = %s ORDER BY name",
                (TENANT,),
            ).fetchall()
        metrics.update(
            {
                "kills": kills + 1,
                "restart_seconds": restarts,
                "items_per_schedule": {k: len(v) for k, v in sorted(ticks.items())},
                "skipped_ticks": {r["name"]: r["skipped"] for r in skipped},
                "lag_p50_s": round(lags[len(lags) // 2], 3) if lags else None,
                "lag_max_s": round(lags[-1], 3) if lags else None,
            }
        )
        by_checker: dict[str, int] = {}
        for violation in violations:
            by_checker[violation.checker] = by_checker.get(violation.checker, 0) + 1
        report = CheckReport(
            scenario=name,
            operations=len(scheduled),
            faults_injected=kills + 1,
            lost=lost,
            duplicated=duplicated,
            violations=tuple(violations),
            by_checker=by_checker or {"one-item-per-tick": 0, "no-lost-tick": 0, "ledger-fold": 0},
        )
    return ScenarioOutcome(report, time.monotonic() - began, metrics, None, snapshot)
