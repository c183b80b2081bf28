"""Point-in-time restore after an operator's mistake, with its RPO and RTO.

`queue-server serve --backup-repo` streams its WAL into a Barman repository while a
workload enqueues items and completes them, every request with an idempotency key.
A base backup (`queue-server backup create`) runs under that load; the workload goes on.
At T an operator deletes the tenant (the mistake); the server is stopped. `queue-server
restore --to T` restores into a new directory and a server is started on it. Then:

- every enqueue and completion acknowledged before T is there (the item, its state,
  payload and fence), and `queue-server ledger verify` passes;
- receipts are intact: a retried request with an old key replays its original answer;
- nothing sent after T exists: no item, no completion, and the tenant is not deleted.

Reported: RPO, the most the repository lagged behind the database while the workload
ran (how much a lost database would have cost then), and RTO, the time from the restore
command to the restored server's first ready `/readyz`.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from queue_server.client.connection import tls_context
from queue_server.infra import backup
from queue_server.infra.embedded import EmbeddedPostgres
from reliability.checkers import CheckReport, Violation
from reliability.cluster import free_port, say, venv_bin
from reliability.history import JSONValue
from reliability.scenarios import ScenarioOutcome

TENANT = "acme"
QUEUES = ("q0", "q1", "q2")
REPLAYS = 40  # receipts retried after the restore, of each kind


@dataclass
class Op:
    """One effecting request of the workload: when it was sent and acknowledged."""

    kind: str  # enqueue, complete
    key: str
    path: str
    body: dict[str, Any]
    sent: float
    acked: float | None = None
    answer: dict[str, Any] | None = None


@dataclass
class Workload:
    """Producers enqueue, one worker per queue leases and completes; every op is recorded."""

    url: str
    key: str
    stop: threading.Event = field(default_factory=threading.Event)
    ops: list[Op] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    errors: list[str] = field(default_factory=list)

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {self.key}"}, timeout=30
        )

    def _send(self, c: httpx.Client, kind: str, path: str, body: dict[str, Any]) -> Op | None:
        op = Op(kind, f"{kind[0]}-{os.urandom(8).hex()}", path, body, time.time())
        try:
            r = c.post(path, json=body, headers={"Idempotency-Key": op.key})
        except httpx.HTTPError as exc:
            self.errors.append(f"{kind}: {exc}")
            return None
        if r.status_code in (200, 201):
            op.acked = time.time()
            op.answer = r.json()
        with self.lock:
            self.ops.append(op)
        return op

    def produce(self, seed: int) -> None:
        rng = random.Random(seed)
        with self.client() as c:
            n = 0
            while not self.stop.is_set():
                queue = rng.choice(QUEUES)
                path = f"/v1/tenants/{TENANT}/queues/{queue}/items"
                self._send(c, "enqueue", path, {"payload": {"seed": seed, "n": n}})
                n += 1
                time.sleep(0.01)

    def work(self, queue: str) -> None:
        with self.client() as c:
            while not self.stop.is_set():
                try:
                    r = c.post(
                        f"/v1/tenants/{TENANT}/queues/{queue}/leases",
                        json={"worker": f"w-{queue}", "lease_ttl": 30, "max_items": 1},
                    )
                except httpx.HTTPError as exc:
                    self.errors.append(f"acquire: {exc}")
                    continue
                leases = r.json().get("leases", []) if r.status_code == 200 else []
                if not leases:
                    time.sleep(0.05)
                    continue
                lease = leases[0]
                body = {"worker": f"w-{queue}", "fence": lease["fence"], "result": {"ok": True}}
                path = f"/v1/tenants/{TENANT}/items/{lease['item_id']}/complete"
                self._send(c, "complete", path, body)


class LagSampler:
    """How far the repository's WAL lags behind the database's, sampled while writes go on."""

    def __init__(self, repo: backup.Repository, stop: threading.Event) -> None:
        self.repo = repo
        self.stop = stop
        self.lags: list[float] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.25):
            last = self.repo.last_wal_at()
            if last is not None:
                self.lags.append(max(0.0, time.time() - last))


def _serve(data_dir: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_SERVER_")}
    proc = subprocess.Popen(
        [
            venv_bin("queue-server"),
            *("serve", "--port", str(port), "--workers", "1", "--data-dir", str(data_dir)),
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    return proc, f"http://127.0.0.1:{port}"


def _ready(proc: subprocess.Popen[str], url: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited: {proc.stdout.read() if proc.stdout else ''}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2, verify=tls_context()).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError("the server did not become ready")


def _stop(proc: subprocess.Popen[str], data_dir: Path) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        EmbeddedPostgres(data_dir / "pgdata").stop(mode="immediate")
    return out or ""


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUEUE_SERVER_")}
    return subprocess.run(
        [venv_bin("queue-server"), *args],
        capture_output=True,
        text=True,
        env={**env, "COLUMNS": "200"},
        timeout=600,
        check=False,
    )


def restore_after_mistake(*, duration: float = 24.0, producers: int = 3) -> ScenarioOutcome:
    """Restore to just before a tenant's deletion; every acknowledged op before it is back."""
    began = time.monotonic()
    name = "restore"
    violations: list[Violation] = []
    metrics: dict[str, JSONValue] = {"workload_seconds": duration, "producers": producers}
    root = Path(tempfile.mkdtemp(prefix="qs-restore-"))
    root.chmod(0o711)  # the embedded PostgreSQL's system user reaches its data directories
    data, repo_dir, new = root / "data", root / "repo", root / "restored"
    repo = backup.Repository(repo_dir)
    before: list[Op] = []
    after: list[Op] = []
    try:
        proc, url = _serve(data, "--backup-repo", str(repo_dir))
        try:
            _ready(proc, url)
            key = (data / "admin.key").read_text().strip()
            admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"})
            made_tenant = admin.put(f"/v1/tenants/{TENANT}", json={"backlog_cap": 10_000})
            if made_tenant.status_code != 200:
                raise RuntimeError(f"PUT tenant: {made_tenant.status_code} {made_tenant.text}")
            load = Workload(url, key)
            sampler = LagSampler(repo, load.stop)
            threads = [
                threading.Thread(target=load.produce, args=(i,), daemon=True)
                for i in range(producers)
            ] + [threading.Thread(target=load.work, args=(q,), daemon=True) for q in QUEUES]
            for t in [*threads, sampler.thread]:
                t.start()
            working = time.monotonic()
            time.sleep(duration * 0.2)
            say(f"{name}: a base backup under load")
            started = time.monotonic()
            made = _cli("backup", "create", "--data-dir", str(data), "--json")
            metrics["backup_seconds"] = round(time.monotonic() - started, 2)
            if made.returncode != 0:
                violations.append(Violation("backup", f"backup create failed: {made.stderr}"))
            # The workload goes on after the backup; then the mistake.
            time.sleep(max(0.0, working + duration - time.monotonic()))
            moment = time.time()
            time.sleep(0.2)
            deleted = admin.delete(f"/v1/tenants/{TENANT}")
            say(f"{name}: the tenant deleted ({deleted.status_code}); the server stops")
            time.sleep(0.3)
            load.stop.set()
            for t in threads:
                t.join(timeout=30)
            sampler.thread.join(timeout=5)
            admin.close()
        finally:
            out = _stop(proc, data)
        if proc.returncode != 0:
            violations.append(Violation("serve", f"serve exited {proc.returncode}: {out[-500:]}"))
        lags = sorted(sampler.lags)
        metrics["rpo_seconds_max"] = round(lags[-1], 3) if lags else None
        metrics["rpo_seconds_p50"] = round(lags[len(lags) // 2], 3) if lags else None
        before = [op for op in load.ops if op.acked is not None and op.acked < moment]
        after = [op for op in load.ops if op.sent > moment]
        metrics["acknowledged_before_t"] = {
            "enqueue": sum(op.kind == "enqueue" for op in before),
            "complete": sum(op.kind == "complete" for op in before),
        }
        metrics["sent_after_t"] = len(after)

        say(f"{name}: restore to T into a new directory")
        started = time.monotonic()
        restored = _cli(
            "restore",
            "--to",
            datetime.fromtimestamp(moment, UTC).isoformat(),
            "--data-dir",
            str(new),
            "--backup-repo",
            str(repo_dir),
        )
        metrics["restore_seconds"] = round(time.monotonic() - started, 2)
        if restored.returncode != 0:
            violations.append(Violation("restore", restored.stdout + restored.stderr))
            raise _CannotGoOnError
        proc, url = _serve(new)
        try:
            _ready(proc, url)
            metrics["rto_seconds"] = round(time.monotonic() - started, 2)
            # The key the workload sent with: a retried request replays only for the API key
            # that sent it (the restore writes an admin key of its own as well).
            key = load.key
            with httpx.Client(
                base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30
            ) as c:
                earlier = [op for op in load.ops if op.sent <= moment]
                violations += _check(c, before, after, earlier)
            verified = _cli("ledger", "verify", "--data-dir", str(new), "--json")
            result = json.loads(verified.stdout or "{}")
            metrics["ledgers_verified"] = result.get("checked")
            if verified.returncode != 0 or result.get("mismatches"):
                violations.append(Violation("ledger", f"ledger verify: {verified.stdout[-500:]}"))
        finally:
            _stop(proc, new)
    except _CannotGoOnError:
        pass
    finally:
        shutil.rmtree(root, ignore_errors=True)
    lost = sum(v.checker == "lost" for v in violations)
    report = CheckReport(
        scenario=name,
        operations=len(before) + len(after),
        faults_injected=1,
        lost=lost,
        duplicated=0,
        violations=tuple(violations),
        by_checker={v.checker: sum(w.checker == v.checker for w in violations) for v in violations},
    )
    return ScenarioOutcome(report, time.monotonic() - began, metrics)


class _CannotGoOnError(Exception):
    """The scenario cannot go on (its violation is recorded)."""


def _items(c: httpx.Client) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    cursor = None
    while True:
        params: dict[str, Any] = {"limit": 500, **({"cursor": cursor} if cursor else {})}
        r = c.get(f"/v1/tenants/{TENANT}/items", params=params)
        if r.status_code != 200:
            return found
        page = r.json()
        found |= {i["item_id"]: i for i in page["items"]}
        cursor = page["next_cursor"]
        if cursor is None:
            return found


def _check(
    c: httpx.Client, before: list[Op], after: list[Op], earlier: list[Op]
) -> list[Violation]:
    """What must be there (acknowledged before T), what must not (sent after T; `earlier`
    were sent before it), receipts."""
    violations: list[Violation] = []
    if c.get(f"/v1/tenants/{TENANT}").status_code != 200:
        return [Violation("after-t", "the tenant is gone: the deletion after T was restored")]
    items = _items(c)
    for op in before:
        answer = op.answer or {}
        item = items.get(str(answer.get("item_id")))
        if item is None:
            violations.append(Violation("lost", f"{op.kind} {op.key} acknowledged before T"))
        elif op.kind == "enqueue" and item["payload"] != op.body["payload"]:
            violations.append(Violation("lost", f"{op.key}: payload {item['payload']}"))
        elif op.kind == "complete" and (item["state"], item["fence"]) != (
            "completed",
            op.body["fence"],
        ):
            violations.append(
                Violation("lost", f"{op.key}: {item['state']} at fence {item['fence']}")
            )
    for op in after:
        answer = op.answer or {}
        item = items.get(str(answer.get("item_id")))
        if op.kind == "enqueue" and item is not None:
            violations.append(Violation("after-t", f"enqueue {op.key} sent after T exists"))
        # Completed, unless by a request of its own sent before T.
        if (
            op.kind == "complete"
            and item is not None
            and item["state"] == "completed"
            and not any(o.kind == "complete" and o.path == op.path for o in earlier)
        ):
            violations.append(Violation("after-t", f"complete {op.key} sent after T is done"))
    rng = random.Random(7)
    for kind in ("enqueue", "complete"):
        of_kind = [op for op in before if op.kind == kind]
        for op in rng.sample(of_kind, min(REPLAYS, len(of_kind))):
            again = c.post(op.path, json=op.body, headers={"Idempotency-Key": op.key})
            if again.headers.get("idempotent-replayed") != "true" or again.json() != op.answer:
                violations.append(
                    Violation("receipts", f"{op.key} answered {again.status_code} anew")
                )
    return violations
