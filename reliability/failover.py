"""The failover scenario, on the local HA topology of ``deploy/local-ha/ha.py``.

Producers and workers run through the API's load balancer (HAProxy in front of
two or more ``queue-server serve`` processes, every statement through PgBouncer
to the Patroni leader) while, one round at a time:

1. the leader's postmaster is SIGKILLed (Patroni fails over: primary_start_timeout 0);
2. the leader's Patroni is stopped (SIGTERM: it shuts PostgreSQL down and hands over);
3. a switchover is requested with ``patronictl switchover``;

then the API processes are restarted one by one (drained in HAProxy first). Between
rounds the topology is brought back to a leader, a synchronous standby and a replica.

The history checkers judge the whole run (no acknowledged enqueue or completion
lost, one effect per Idempotency-Key, fences strictly rising per item, backlog
never above the cap, nothing but 503 among 5xx, problem+json errors, the ledger
folding back to every row, ``queue-server ledger verify`` passing). Each round
reports its write outage (the longest gap between acknowledged writes around the
fault; judged against 30 s for a kill or a stopped Patroni, 5 s for a switchover),
when the new leader took over, the errors clients saw, and whether fences issued
after the round rose above those issued before it. After each round a waiting
acquire must wake within 1 s of an enqueue on another API process, and a revoked
key must be refused at once by every API process.

``python -m reliability.failover`` (``make failover``) brings the topology up if it
is not (and down again afterwards), and writes ``reliability/results/failover.md``
and ``failover.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
from psycopg.rows import dict_row

from reliability.checkers import CheckReport, DatabaseSnapshot, Violation, render_summary_table
from reliability.client import RecordingClient
from reliability.cluster import HARNESS_APP, TenantKeys, create_tenant, say, venv_bin
from reliability.history import ENQUEUES, History, HistoryRecorder, JSONValue, Operation, OpKind
from reliability.scenarios import (
    Load,
    ScenarioOutcome,
    finish,
    probe_backlog,
    receipt_violations,
    with_extras,
)

__all__ = ["Topology", "failover", "main", "outage_window"]

REPO_ROOT = Path(__file__).resolve().parents[1]
HA_SCRIPT = REPO_ROOT / "deploy" / "local-ha" / "ha.py"
RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_DIR = Path(os.environ.get("QS_HA_DIR", "/var/tmp/queue-server-ha"))

#: Write outage bounds per round (seconds).
OUTAGE_BOUND = {"kill": 30.0, "stop-patroni": 30.0, "switchover": 5.0}
#: A waiting acquire wakes within this of an enqueue, listener or not.
WAKE_BOUND = 1.0
#: Writes whose acknowledgement shows the database took a write.
WRITES = frozenset({*ENQUEUES, OpKind.COMPLETE, OpKind.REQUEUE})


# ----------------------------------------------------------------- topology


class Topology:
    """The running local HA topology, as ``ha.py`` describes it in ``state.json``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.state: dict[str, Any] = json.loads((root / "state.json").read_text())
        self.tenant: str | None = None

    @property
    def api_url(self) -> str:
        return str(self.state["urls"]["api"])

    @property
    def api_ports(self) -> dict[str, int]:
        return {str(k): int(v) for k, v in self.state["api"].items()}

    @property
    def nodes(self) -> dict[str, dict[str, Any]]:
        nodes: dict[str, dict[str, Any]] = self.state["nodes"]
        return nodes

    @property
    def admin_key(self) -> str:
        return Path(self.state["urls"]["admin_key_file"]).read_text().strip()

    def ha(self, *args: str, timeout: float = 240) -> str:
        done = subprocess.run(
            [sys.executable, str(HA_SCRIPT), "--dir", str(self.root), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"ha.py {' '.join(args)} failed:\n{done.stderr[-3000:]}")
        return done.stdout

    # ---------------------------------------------------------------- Patroni

    def members(self) -> list[dict[str, Any]]:
        for node in self.nodes.values():
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                answer = httpx.get(f"http://127.0.0.1:{node['rest_port']}/cluster", timeout=1)
                members: list[dict[str, Any]] = answer.json()["members"]
                return members
        return []

    def role_of(self, role: str) -> str | None:
        for member in self.members():
            if member.get("role") == role and member.get("state") in ("running", "streaming"):
                return str(member["name"])
        return None

    def healthy(self) -> bool:
        running = [m for m in self.members() if m.get("state") in ("running", "streaming")]
        roles = sorted(str(m.get("role")) for m in running)
        wanted = sorted(["leader", "sync_standby"] + ["replica"] * (len(self.nodes) - 2))
        return roles == wanted

    def wait(self, what: str, check: Callable[[], object], timeout: float) -> float:
        began = time.monotonic()
        while not check():
            if time.monotonic() - began > timeout:
                raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.1)
        return time.monotonic() - began

    def postmaster_pid(self, node: str) -> int:
        text = (Path(self.nodes[node]["data_dir"]) / "postmaster.pid").read_text()
        return int(text.split()[0])

    def switchover(self, leader: str, candidate: str) -> None:
        subprocess.run(
            [
                "patronictl",
                "-c",
                str(self.state["urls"]["patronictl_config"]),
                "switchover",
                "--leader",
                leader,
                "--candidate",
                candidate,
                "--scheduled",
                "now",
                "--force",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )

    # ------------------------------------------------- SystemUnderTest protocol

    def admin_client(self, base_url: str | None = None) -> httpx.Client:
        return httpx.Client(
            base_url=base_url or self.api_url,
            headers={"Authorization": f"Bearer {self.admin_key}"},
            timeout=30,
        )

    @contextlib.contextmanager
    def db(self) -> Iterator[psycopg.Connection[dict[str, Any]]]:
        """A direct session on the leader (through HAProxy), named so faults spare it."""
        with psycopg.connect(
            str(self.state["urls"]["leader"]),
            autocommit=True,
            row_factory=dict_row,
            application_name=HARNESS_APP,
            connect_timeout=5,
        ) as conn:
            yield conn

    def state_counts(self, tenant: str) -> dict[str, int]:
        with self.db() as conn:
            rows = conn.execute(
                "SELECT state::text AS state, count(*) AS n FROM work_items "
                "WHERE tenant_id = %s GROUP BY state",
                (tenant,),
            ).fetchall()
        return {str(r["state"]): int(r["n"]) for r in rows}

    def snapshot(self) -> DatabaseSnapshot:
        """The scenario tenant's items and ledgers (the database outlives one run)."""
        with self.db() as conn:
            items = conn.execute(
                "SELECT tenant_id, item_id::text AS item_id, state::text AS state, fence, "
                "acquisition_count FROM work_items WHERE tenant_id = %s "
                "ORDER BY tenant_id, item_id",
                (self.tenant,),
            ).fetchall()
            events = conn.execute(
                "SELECT tenant_id, item_id::text AS item_id, seq, kind, fence "
                "FROM item_events WHERE tenant_id = %s ORDER BY tenant_id, item_id, seq",
                (self.tenant,),
            ).fetchall()
        return DatabaseSnapshot.from_rows(items, events)


# ------------------------------------------------------------- measurements


def outage_window(history: History, fault: float, horizon: float = 90.0) -> tuple[float, float]:
    """(write outage, writes resumed after the fault): the longest gap between
    consecutive acknowledged writes that spans or follows the fault, and when the
    first acknowledgement after that gap came, relative to the fault."""
    acks = sorted(
        op.end_mono
        for op in history.operations
        if op.accepted
        and not op.replayed
        and (op.kind in WRITES or (op.kind is OpKind.ACQUIRE and op.leases()))
    )
    best, resumed = 0.0, 0.0
    previous = None
    for at in acks:
        if previous is not None and at >= fault and previous <= fault + horizon:
            gap = at - max(previous, fault - 5.0)
            if gap > best:
                best, resumed = gap, at - fault
        previous = at
    return round(best, 2), round(resumed, 2)


def _label(op: Operation) -> str:
    if op.status is None:
        return f"no answer ({(op.error or '').split(':', 1)[0]})"
    code = op.problem_code
    return f"{op.status} {code}" if code else str(op.status)


def errors_seen(history: History, start: float, end: float) -> dict[str, JSONValue]:
    """What clients saw other than success in [start, end], by status and problem code."""
    seen = Counter(
        _label(op)
        for op in history.operations
        if start <= op.start_mono <= end and not op.accepted and op.status != 429
    )
    return dict(sorted(seen.items()))


def fence_violations(
    history: History, before: float, after: float, label: str
) -> tuple[list[Violation], int]:
    """Every fence handed out after ``after`` is above every fence of the same item
    handed out before ``before``; also how many items were leased on both sides."""
    low: dict[tuple[str, str], int] = {}
    high: dict[tuple[str, str], int] = {}
    for op in history.operations:
        for item_id, fence in op.leases():
            key = (op.tenant, item_id)
            if op.end_mono < before:
                high[key] = max(high.get(key, 0), fence)
            elif op.start_mono > after:
                low[key] = min(low.get(key, fence), fence)
    violations = [
        Violation(
            "fences",
            f"{label}: fence {fence} issued after the round is not above {high[key]}",
            key[0],
            key[1],
        )
        for key, fence in low.items()
        if key in high and fence <= high[key]
    ]
    return violations, sum(1 for key in low if key in high)


def unresolved_requests(history: History) -> list[Violation]:
    """Keyed requests whose every attempt went unanswered or failed with a 5xx: a
    request the client could not complete by retrying with its key."""
    attempts: dict[tuple[str, str], list[Operation]] = {}
    for op in history.operations:
        if op.idempotency_key is not None:
            attempts.setdefault((op.tenant, op.idempotency_key), []).append(op)
    out: list[Violation] = []
    for (tenant, key), ops in attempts.items():
        if all(op.indeterminate for op in ops):
            last = max(ops, key=lambda op: op.end_mono)
            out.append(
                Violation(
                    "retryable",
                    f"{last.kind} with key {key}: {len(ops)} attempts, none answered "
                    f"(last: {_label(last)})",
                    tenant,
                    last.item_id,
                    tuple(op.op_id for op in ops[:5]),
                )
            )
    return out


@dataclass
class Probes:
    """After each round: a waiting acquire wakes on an enqueue made through another API
    process, and a revoked key is refused at once by every API process."""

    topo: Topology
    keys: TenantKeys
    recorder: HistoryRecorder
    results: list[dict[str, JSONValue]] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)

    def run(self, label: str) -> dict[str, JSONValue]:
        ports = sorted(self.topo.api_ports.values())
        first, second = ports[0], ports[-1]
        out: dict[str, JSONValue] = {"after": label}
        waiter = RecordingClient(
            f"http://127.0.0.1:{first}", self.keys.worker, self.keys.tenant, self.recorder
        )
        producer = RecordingClient(
            f"http://127.0.0.1:{second}", self.keys.worker, self.keys.tenant, self.recorder
        )
        try:
            answered: list[Operation] = []
            thread = threading.Thread(
                target=lambda: answered.append(waiter.acquire("wake", "waker", ttl=30, wait=10))
            )
            thread.start()
            time.sleep(1.5)
            enqueued = producer.enqueue("wake", {"probe": label})
            thread.join(15)
            leases = answered[0].leases() if answered else []
            if not enqueued.accepted or not leases:
                wake = None
            else:
                wake = round(max(0.0, answered[0].end_mono - enqueued.end_mono), 3)
            out["wake_after_enqueue_s"] = wake
            if wake is None or wake > WAKE_BOUND:
                self.violations.append(
                    Violation("wake-up", f"after {label}: a waiting acquire woke after {wake} s")
                )
            for item_id, fence in leases:
                waiter.complete(item_id, "waker", fence, {"probe": label})
        finally:
            waiter.close()
            producer.close()
        out["revoked_key_refused_by"] = self._revocation(label)
        self.results.append(out)
        return out

    def _revocation(self, label: str) -> list[JSONValue]:
        tenant = self.keys.tenant
        with self.topo.admin_client() as admin:
            created = admin.post(f"/v1/tenants/{tenant}/keys", json={"role": "worker"}).json()
            secret, key_id = str(created["secret"]), str(created["key_id"])
            headers = {"Authorization": f"Bearer {secret}"}
            ports = sorted(self.topo.api_ports.values())
            for port in ports:  # every process has the key in its cache now
                httpx.get(f"http://127.0.0.1:{port}/v1/tenants/{tenant}/queues", headers=headers)
            admin.delete(f"/v1/tenants/{tenant}/keys/{key_id}")
        refused: list[JSONValue] = []
        for port in ports:
            status = httpx.get(
                f"http://127.0.0.1:{port}/v1/tenants/{tenant}/queues", headers=headers
            ).status_code
            if status == 401:
                refused.append(port)
            else:
                self.violations.append(
                    Violation("revocation", f"after {label}: API :{port} answered {status}")
                )
        return refused


# -------------------------------------------------------------------- rounds


@dataclass
class Round:
    name: str
    fault: str
    old_leader: str
    fault_at: float = 0.0
    new_leader: str | None = None
    leader_after_s: float | None = None
    healthy_after_s: float | None = None


def _inject(topo: Topology, kind: str, recorder: HistoryRecorder) -> Round:
    leader = topo.role_of("leader")
    standby = topo.role_of("sync_standby")
    if leader is None or standby is None:
        raise RuntimeError(f"no leader or sync standby before the round: {topo.members()}")
    if kind == "kill":
        pid = topo.postmaster_pid(leader)
        fault = Round(kind, f"SIGKILL of {leader}'s postmaster (pid {pid})", leader)
        fault.fault_at = recorder.note_fault("sigkill-postmaster", f"{leader} pid {pid}").mono
        os.kill(pid, signal.SIGKILL)
    elif kind == "stop-patroni":
        fault = Round(kind, f"SIGTERM of {leader}'s Patroni", leader)
        fault.fault_at = recorder.note_fault("stop-patroni", leader).mono
        topo.ha("stop", leader)
    else:
        fault = Round(kind, f"patronictl switchover {leader} -> {standby}", leader)
        fault.fault_at = recorder.note_fault("switchover", f"{leader} -> {standby}").mono
        topo.switchover(leader, standby)
    say(f"failover: round {kind}: {fault.fault}")

    def moved() -> bool:
        now = topo.role_of("leader")
        if now is not None and now != leader:
            fault.new_leader = now
            return True
        return False

    topo.wait("a new leader", moved, 90)
    fault.leader_after_s = round(time.monotonic() - fault.fault_at, 2)
    if kind == "stop-patroni":
        topo.ha("start", leader)
    topo.wait("a leader, a sync standby and a replica", topo.healthy, 120)
    fault.healthy_after_s = round(time.monotonic() - fault.fault_at, 2)
    say(
        f"failover: {fault.new_leader} leads {fault.leader_after_s} s after the fault; "
        f"all three nodes back after {fault.healthy_after_s} s"
    )
    return fault


def failover(
    topo: Topology,
    *,
    steady: float = 8.0,
    cap: int = 1500,
    producers: int = 2,
    workers: int = 3,
    name: str = "failover (HA)",
) -> ScenarioOutcome:
    """Kill the leader's postmaster, stop its Patroni, switch over, restart the APIs."""
    began = time.monotonic()
    topo.wait("a healthy cluster", topo.healthy, 120)
    tenant = f"failover{int(time.time())}"
    topo.tenant = tenant
    keys = create_tenant(
        topo.api_url,
        topo.admin_key,
        tenant,
        backlog_cap=cap,
        # The built-in policy's attempt cap: a tenant default above it is refused (422).
        max_acquisitions=5,
        max_concurrency=64,
        queues=("q", "wake"),
    )
    recorder = HistoryRecorder(source="harness")
    stop = threading.Event()
    client = RecordingClient(
        topo.api_url, keys.worker, tenant, recorder, timeout=30, retry_for=120, stop=stop
    )
    probe = probe_backlog(topo, [tenant], recorder, stop)
    load = Load(client, stop, ttl=5.0, max_items_total=10**9, producers=producers, workers=workers)
    probes = Probes(topo, keys, recorder)
    rounds: list[Round] = []
    extras: list[Violation] = []
    metrics: dict[str, JSONValue] = {}
    restart: dict[str, JSONValue] = {}
    restart_from = restart_to = 0.0
    try:
        time.sleep(steady)
        probes.run("start")
        for kind in ("kill", "stop-patroni", "switchover"):
            rounds.append(_inject(topo, kind, recorder))
            time.sleep(steady)
            probes.run(kind)
        metrics["api_metrics_before_restart"] = _scrape(topo)
        say("failover: rolling restart of the API processes")
        restart_from = recorder.note_fault("rolling-restart", "every API process").mono
        took = json.loads(topo.ha("restart-api").strip().splitlines()[-1])
        restart_to = time.monotonic()
        restart = {"seconds_per_process": took, "window_s": round(restart_to - restart_from, 2)}
        time.sleep(steady)
        probes.run("rolling restart")
    finally:
        stop.set()
        load.join(150)
        probe.join(5)
    report, history, snapshot = finish(topo, recorder, name, [tenant], clients=[client])
    extras += receipt_violations(topo, history)
    extras += unresolved_requests(history)
    extras += probes.violations
    table: list[JSONValue] = []
    for fault in rounds:
        outage, resumed = outage_window(history, fault.fault_at)
        bound = OUTAGE_BOUND[fault.name]
        if outage > bound:
            extras.append(
                Violation(
                    "outage", f"{fault.name}: writes stopped for {outage} s (bound {bound} s)"
                )
            )
        if fault.new_leader is None or fault.new_leader == fault.old_leader:
            extras.append(Violation("failover", f"{fault.name}: the leader did not change"))
        after = fault.fault_at + max(outage, resumed) + 0.5
        fenced, both_sides = fence_violations(history, fault.fault_at, after, fault.name)
        extras += fenced
        table.append(
            {
                "round": fault.name,
                "fault": fault.fault,
                "leader": f"{fault.old_leader} -> {fault.new_leader}",
                "write_outage_s": outage,
                "bound_s": bound,
                "writes_resumed_after_fault_s": resumed,
                "new_leader_after_s": fault.leader_after_s,
                "three_nodes_back_after_s": fault.healthy_after_s,
                "items_leased_before_and_after": both_sides,
                "errors_clients_saw": errors_seen(
                    history, fault.fault_at - 1.0, fault.fault_at + resumed + 2.0
                ),
            }
        )
    if restart:
        restart["errors_clients_saw"] = errors_seen(history, restart_from, restart_to)
        metrics["rolling_restart"] = restart
    metrics["rounds"] = table
    metrics["after_each_round"] = list(probes.results)
    statuses = Counter(op.status for op in history.operations)
    metrics["answers"] = {str(k): v for k, v in sorted(statuses.items(), key=lambda kv: kv[0] or 0)}
    metrics["retries_with_the_same_key"] = client.retries
    metrics["backlog_max_seen_vs_cap"] = [
        max((sample.backlog for sample in history.samples), default=0),
        cap,
    ]
    metrics["completed"] = load.completed
    metrics["items"] = len(snapshot.items)
    metrics["acknowledged_writes"] = sum(
        1 for op in history.operations if op.accepted and op.kind in WRITES and not op.replayed
    )
    extras += _ledger_verify(topo, tenant, metrics)
    client.close()
    report = with_extras(report, extras)
    return ScenarioOutcome(report, time.monotonic() - began, metrics, history, snapshot)


def _scrape(topo: Topology) -> dict[str, JSONValue]:
    """Per API process: the 503s it answered for a failed database connection, by cause,
    and the LISTEN sessions it lost (from its /metrics)."""
    out: dict[str, JSONValue] = {}
    for name, port in sorted(topo.api_ports.items()):
        seen: dict[str, JSONValue] = {}
        with contextlib.suppress(httpx.HTTPError):
            text = httpx.get(
                f"http://127.0.0.1:{port}/metrics",
                headers={"Authorization": f"Bearer {topo.admin_key}"},
                timeout=5,
            ).text
            for line in text.splitlines():
                if line.startswith("queue_server_database_unavailable_total{"):
                    cause = line.split('cause="', 1)[1].split('"', 1)[0]
                    seen[f"503 {cause}"] = int(float(line.rsplit(" ", 1)[1]))
                elif line.startswith("queue_server_listener_disconnects_total "):
                    seen["listener sessions lost"] = int(float(line.rsplit(" ", 1)[1]))
        out[name] = seen
    return out


def _ledger_verify(topo: Topology, tenant: str, metrics: dict[str, JSONValue]) -> list[Violation]:
    done = subprocess.run(
        [
            venv_bin("queue-server"),
            "ledger",
            "verify",
            "--url",
            topo.api_url,
            "--key",
            topo.admin_key,
            "--tenant",
            tenant,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
    metrics["ledger_verify"] = {"exit": done.returncode, "output": list[JSONValue](tail)}
    if done.returncode != 0:
        return [Violation("ledger-verify", f"queue-server ledger verify exited {done.returncode}")]
    return []


# ---------------------------------------------------------------------- main


def _write(
    outcome: ScenarioOutcome, topo: Topology, out: Path, total: float, load: list[float]
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    report: CheckReport = outcome.report
    metrics = outcome.metrics
    versions = topo.state.get("versions", {})
    lines = [
        "# Failover scenario: latest run",
        "",
        f"Run {stamp} on {platform.node() or 'this machine'} ({os.cpu_count()} CPUs), "
        f"{total:.0f} s in all. Topology: `deploy/local-ha/ha.py` "
        f"({', '.join(f'{k} {v}' for k, v in versions.items())}); "
        f"{len(topo.api_ports)} API processes behind HAProxy, "
        f"{'PgBouncer (transaction mode)' if topo.state.get('via') != 'haproxy' else 'no pooler'}"
        f" to the Patroni leader. Load average at the start: {load} (the cores are shared)."
        " Figures as measured in this run.",
        "",
        render_summary_table([report]),
        "",
        "## Rounds",
        "",
        "| round | fault | leader | write outage | bound | writes resumed after | new leader after |"
        " three nodes back after | items leased before and after (fences rose) |"
        " errors clients saw |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    rounds = metrics.get("rounds", [])
    assert isinstance(rounds, list)
    for row in rounds:
        assert isinstance(row, dict)
        errors = row["errors_clients_saw"]
        assert isinstance(errors, dict)
        seen = ", ".join(f"{k}: {v}" for k, v in errors.items()) or "none"
        lines.append(
            f"| {row['round']} | {row['fault']} | {row['leader']} | {row['write_outage_s']} s "
            f"| {row['bound_s']} s | {row['writes_resumed_after_fault_s']} s "
            f"| {row['new_leader_after_s']} s | {row['three_nodes_back_after_s']} s "
            f"| {row['items_leased_before_and_after']} | {seen} |"
        )
    restart = metrics.get("rolling_restart")
    if isinstance(restart, dict):
        errors = restart.get("errors_clients_saw", {})
        assert isinstance(errors, dict)
        seen = ", ".join(f"{k}: {v}" for k, v in errors.items()) or "none"
        lines += [
            "",
            f"Rolling restart of the API processes (drain in HAProxy, SIGTERM, start, ready): "
            f"{restart.get('window_s')} s in all, per process "
            f"{json.dumps(restart.get('seconds_per_process'))}; errors clients saw: {seen}.",
        ]
    lines += ["", "## Metrics", ""]
    for key, value in metrics.items():
        if key != "rounds":
            lines.append(f"- {key}: `{json.dumps(value)}`")
    lines.append("")
    checks = ", ".join(f"{k} {v}" for k, v in report.by_checker.items())
    lines.append(f"Violations by checker: {checks}.")
    for violation in report.violations[:50]:
        lines.append(f"- VIOLATION {violation}")
    lines.append("")
    (out / "failover.md").write_text("\n".join(lines), encoding="utf-8")
    data: dict[str, JSONValue] = {
        "run_at": stamp,
        "seconds": round(total, 1),
        "versions": versions,
        "load_average_at_start": list[JSONValue](load),
        "result": report.result,
        "operations": report.operations,
        "lost": report.lost,
        "duplicated": report.duplicated,
        "violations": [str(v) for v in report.violations[:200]],
        "by_checker": dict(report.by_checker),
        "metrics": metrics,
    }
    (out / "failover.json").write_text(json.dumps(data, indent=2, sort_keys=True), "utf-8")
    say(f"wrote {out / 'failover.md'} and {out / 'failover.json'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reliability.failover", description=__doc__)
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="the topology's state dir")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    parser.add_argument(
        "--steady", type=float, default=None, help="seconds of load between rounds (default 8)"
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="every round once under a small load (3 s between rounds, one producer and two"
        " workers), judged by the same checkers; for CI. Results go to --out"
        " (default reliability/results/quick)",
    )
    parser.add_argument(
        "--keep-up",
        action="store_true",
        help="leave a topology this run brought up running (by default it is taken down at"
        " the end, also when the scenario fails)",
    )
    args = parser.parse_args(argv)
    steady = args.steady if args.steady is not None else (3.0 if args.quick else 8.0)
    out = args.out if args.out != RESULTS or not args.quick else RESULTS / "quick"
    began = time.monotonic()
    load = [round(v, 2) for v in os.getloadavg()]
    brought_up = not (args.dir / "state.json").exists()
    try:
        if brought_up:
            say("failover: the HA topology is not up; bringing it up (make ha-up)")
            subprocess.run(
                [sys.executable, str(HA_SCRIPT), "--dir", str(args.dir), "up"],
                check=True,
                stdout=subprocess.DEVNULL,
            )
        topo = Topology(args.dir)
        if args.quick:
            outcome = failover(topo, steady=steady, cap=600, producers=1, workers=2)
        else:
            outcome = failover(topo, steady=steady)
    finally:
        if brought_up and not args.keep_up:
            say("failover: taking the HA topology down (make ha-down)")
            subprocess.run(
                [sys.executable, str(HA_SCRIPT), "--dir", str(args.dir), "down"],
                check=False,
                stdout=subprocess.DEVNULL,
            )
    total = time.monotonic() - began
    report = outcome.report
    print(render_summary_table([report]))
    for violation in report.violations[:20]:
        print(f"  {violation}")
    rounds = outcome.metrics.get("rounds")
    for row in rounds if isinstance(rounds, list) else []:
        print(f"  {json.dumps(row)}")
    print(f"\n{report.result} in {total:.0f}s")
    _write(outcome, topo, out, total, load)
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
