"""The system under test: a fresh embedded PostgreSQL, the server as a subprocess, and probes.

Everything listens on loopback (PostgreSQL on a Unix socket) and lives in a
temporary directory that is removed afterwards.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg

from bench.progress import say
from bench.stats import PhaseLoad
from queue_server.infra.embedded import EmbeddedPostgres
from queue_server.infra.serve import ensure_admin_key
from queue_server.settings import Settings
from queue_server.store.bootstrap import DATABASE_NAME

HOST = "127.0.0.1"
SERVER_START_TIMEOUT = 60.0
# Seconds between the server's retention rounds during a benchmark (default 60).
RETENTION_INTERVAL = 2.0
# A spend approval lasts at most a year: this one, 30 days from the start of the run.
# The benchmark's tenants hold backlogs far above the built-in's max-queued (10,000): the
# server runs under a policy version of the benchmark's own that raises only that.
BENCH_MAX_QUEUED = 100_000_000


def bench_policy(path: Path) -> Path:
    """The built-in policy as `bench.v1`, durable-leased-work max-queued BENCH_MAX_QUEUED."""
    import copy
    import json

    from queue_server.policy.v2 import OPERATION_RELIABILITY_V2

    doc = copy.deepcopy(OPERATION_RELIABILITY_V2)
    doc["version"] = "bench.v1"
    doc["classes"]["durable-leased-work"]["backpressure"]["max-queued"] = BENCH_MAX_QUEUED
    path.write_text(json.dumps(doc))
    return path


# The most a spend approval may raise a queue to (the built-in policy's max-approved).
MAX_APPROVED = 1000
SOON = (datetime.now(UTC) + timedelta(days=30)).strftime("%Y-%m-%dT%H:%M:%SZ")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def venv_bin(name: str) -> str:
    """A console script next to the running interpreter (the project's .venv)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


def _tree(root: psutil.Process) -> list[psutil.Process]:
    """A process and its live descendants ([] once it is gone)."""
    try:
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def _total_cpu(proc: psutil.Process) -> float:
    """CPU of a process and of every descendant it has reaped (user + system)."""
    with contextlib.suppress(psutil.Error):
        t = proc.cpu_times()
        return float(t.user + t.system + t.children_user + t.children_system)
    return 0.0


def _machine_cpu() -> tuple[float, float]:
    """(busy, steal): CPU seconds of the machine since boot, summed over cores.

    Busy is every state but idle and iowait; guest time is already inside user.
    """
    t = psutil.cpu_times()
    busy = t.user + t.nice + t.system
    for name in ("irq", "softirq", "steal"):
        busy += getattr(t, name, 0.0)
    return busy, getattr(t, "steal", 0.0)


@dataclass(frozen=True)
class Snapshot:
    """Cumulative CPU seconds of the machine and of each party at one instant.

    Each party is a process tree, each process counted once with what it has
    reaped (so the `true` that `queue-server work` ran counts as the benchmark's);
    `others` is every other live process's name, start time and own CPU, to name
    the busiest.
    """

    at: float
    busy: float
    steal: float
    server: float
    postgres: float
    bench: float
    load: float
    others: dict[int, tuple[str, float, float]]

    def until(self, later: Snapshot, *, cores: int) -> PhaseLoad:
        """What ran between this snapshot and `later`."""
        grew: list[tuple[str, float]] = []
        for pid, (name, started, cpu) in later.others.items():
            # The same process (a kernel worker renames itself after its work item); one
            # started since counts from nothing.
            before = self.others.get(pid)
            spent = cpu - (before[2] if before and before[1] == started else 0.0)
            if spent >= 0.05:
                grew.append((name, spent))
        grew.sort(key=lambda x: -x[1])
        return PhaseLoad(
            wall=later.at - self.at,
            cores=cores,
            busy=later.busy - self.busy,
            server=later.server - self.server,
            postgres=later.postgres - self.postgres,
            bench=later.bench - self.bench,
            steal=later.steal - self.steal,
            load_start=self.load,
            load_end=later.load,
            top_other=tuple(grew[:5]),
        )


def _tree_rss(root: psutil.Process) -> int:
    """The memory the server's processes hold: one process's RSS; for several (serve's
    default, a process per core), their PSS summed, so that the pages they share (the
    interpreter, the imported packages) count once and not once per process."""
    with contextlib.suppress(psutil.Error):
        procs = [root, *root.children(recursive=True)]
        if len(procs) == 1:
            return int(root.memory_info().rss)
        total = 0
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                total += int(proc.memory_full_info().pss)
        return total
    return 0


@dataclass
class Monitor:
    """Samples the server's process-tree RSS in a thread; keeps the peak."""

    server: psutil.Process
    interval: float = 0.2
    peak_rss: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rss-monitor", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak_rss = max(self.peak_rss, _tree_rss(self.server))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


@dataclass
class Tenant:
    name: str
    worker_key: str
    operator_key: str


class Environment:
    """PostgreSQL + migrated database + queue-server, all started fresh.

    `server_workers` is the server's `--workers`; None leaves it to `serve`'s own
    default (one process per core). `restart_server` swaps the server for one in
    another mode over the same database.
    """

    def __init__(self, *, server_workers: int | None, keep: bool = False) -> None:
        self.server_workers = server_workers
        self.keep = keep
        self.root = Path(tempfile.mkdtemp(prefix="qs-bench-"))
        self.root.chmod(0o711)  # as root, PostgreSQL's system user traverses to its data
        self.pg = EmbeddedPostgres(self.root / "pgdata")
        self.port = free_port()
        self.base_url = f"http://{HOST}:{self.port}"
        self.server_proc: subprocess.Popen[bytes] | None = None
        self.server_ps: psutil.Process | None = None
        self.monitor: Monitor | None = None
        self.admin: httpx.Client | None = None
        self.admin_key = ""
        self.url = ""
        self.server_log = self.root / "server.log"
        self.batch_completion_route = False
        self.cores = os.cpu_count() or 1
        self._self = psutil.Process()
        self._postmaster: psutil.Process | None = None

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> None:
        say(f"starting embedded PostgreSQL in {self.root}")
        self.pg.start()
        with psycopg.connect(self.pg.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DATABASE_NAME}")
        self.url = self.pg.url(DATABASE_NAME)
        say("migrating (queue-server db upgrade)")
        subprocess.run(
            [venv_bin("queue-server"), "db", "upgrade"],
            env={**os.environ, "QUEUE_SERVER_DATABASE_URL": self.url},
            check=True,
            stdout=subprocess.DEVNULL,
        )
        settings = Settings(database_url=self.url, data_dir=self.root / "data")
        admin_key = ensure_admin_key(settings, self.url)
        if admin_key is None:
            raise RuntimeError("a fresh database already had an admin key")
        self.admin_key = admin_key
        self._start_server()

    @property
    def mode(self) -> str:
        """`--workers 1`, or `default: a process per core, 2` for serve's own default."""
        if self.server_workers is not None:
            return f"--workers {self.server_workers}"
        return f"default: a process per core, {self.cores}"

    def _start_server(self) -> None:
        env = {**os.environ, "QUEUE_SERVER_DATABASE_URL": self.url}
        env["QUEUE_SERVER_DATA_DIR"] = str(self.root / "data")
        env["QUEUE_SERVER_POLICY"] = str(bench_policy(self.root / "bench-policy.json"))
        # Retention rounds every few seconds, so the churn's short-retention tenant shows them.
        env["QUEUE_SERVER_RETENTION_INTERVAL"] = str(RETENTION_INTERVAL)
        command = [venv_bin("queue-server"), "serve", "--host", HOST, "--port", str(self.port)]
        if self.server_workers is not None:
            command += ["--workers", str(self.server_workers)]
        command += ["--log-level", "warning"]
        say(f"starting {' '.join(command[1:])}")
        with self.server_log.open("ab") as log:
            self.server_proc = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        self.server_ps = psutil.Process(self.server_proc.pid)
        self.admin = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {self.admin_key}"},
            timeout=60,
        )
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while True:
            if self.server_proc.poll() is not None:
                raise RuntimeError(f"the server exited:\n{self.server_log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if self.admin.get("/readyz").status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not become ready")
            time.sleep(0.1)
        if self.server_workers is None:
            # Every worker process up before anything is measured (readyz answers from one).
            while len(self.server_pids()) < self.cores and time.monotonic() < deadline:
                time.sleep(0.1)
        paths = self.admin.get("/openapi.json").json().get("paths", {})
        self.batch_completion_route = "/v1/tenants/{tenant}/completions" in paths
        self.monitor = Monitor(self.server_ps)
        self.monitor.start()

    def _stop_server(self) -> None:
        if self.monitor is not None:
            self.monitor.stop()
        if self.admin is not None:
            self.admin.close()
        if self.server_proc is not None and self.server_proc.poll() is None:
            self.server_proc.send_signal(signal.SIGTERM)
            try:
                self.server_proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.server_proc.kill()
                self.server_proc.wait()

    def restart_server(self, server_workers: int | None) -> None:
        """Stop the server and start it again in another mode, over the same database."""
        self._stop_server()
        self.server_workers = server_workers
        self.port = free_port()
        self.base_url = f"http://{HOST}:{self.port}"
        self._start_server()

    def stop(self) -> None:
        self._stop_server()
        self.pg.stop("fast")
        if not self.keep:
            shutil.rmtree(self.root, ignore_errors=True)
            shutil.rmtree(self.pg.socket_dir, ignore_errors=True)

    # -- probes ------------------------------------------------------------

    def postmaster(self) -> psutil.Process:
        if self._postmaster is None or not self._postmaster.is_running():
            pid = int((self.pg.pgdata / "postmaster.pid").read_text().splitlines()[0])
            self._postmaster = psutil.Process(pid)
        return self._postmaster

    def server_pids(self) -> list[int]:
        """The pids that serve requests (the uvicorn workers, or the one process)."""
        assert self.server_ps is not None
        children = [p.pid for p in self.server_ps.children(recursive=True)]
        return [*children] if children else [self.server_ps.pid]

    def snapshot(self) -> Snapshot:
        """CPU so far of the machine, the server's tree, PostgreSQL's and the benchmark's."""
        assert self.server_ps is not None
        busy, steal = _machine_cpu()
        server = _tree(self.server_ps)
        postgres = _tree(self.postmaster())
        taken = {p.pid for p in server} | {p.pid for p in postgres}
        bench = [p for p in _tree(self._self) if p.pid not in taken]
        taken |= {p.pid for p in bench}
        others: dict[int, tuple[str, float, float]] = {}
        for proc in psutil.process_iter(["name", "create_time", "cpu_times"]):
            times, started = proc.info["cpu_times"], proc.info["create_time"]
            if proc.pid not in taken and times is not None and started is not None:
                # A kernel worker's name ends in its current work item: `kworker/u8:3-iou_exit`.
                name = str(proc.info["name"])
                name = name.split("-", 1)[0] if name.startswith("kworker/") else name
                others[proc.pid] = (name, float(started), times.user + times.system)
        return Snapshot(
            at=time.time(),
            busy=busy,
            steal=steal,
            server=sum(_total_cpu(p) for p in server),
            postgres=sum(_total_cpu(p) for p in postgres),
            bench=sum(_total_cpu(p) for p in bench),
            load=os.getloadavg()[0],
            others=others,
        )

    def load_since(self, start: Snapshot) -> PhaseLoad:
        """What ran on the machine from `start` until now."""
        return start.until(self.snapshot(), cores=self.cores)

    def peak_rss(self) -> int:
        return self.monitor.peak_rss if self.monitor else 0

    def sql(self, statement: str, params: Any = None, *, dbname: str = DATABASE_NAME) -> list[Any]:
        with psycopg.connect(self.pg.url(dbname), autocommit=True) as conn:
            cur = conn.execute(statement, params)
            return cur.fetchall() if cur.description else []

    # -- tenants -----------------------------------------------------------

    def tenant(
        self,
        name: str,
        *,
        backlog_cap: int = BENCH_MAX_QUEUED,
        queues: tuple[str, ...] = ("q",),
        retention: float | None = None,
    ) -> Tenant:
        """A tenant with worker and operator keys and a spend approval on each queue."""
        assert self.admin is not None
        settings: dict[str, Any] = {
            "backlog_cap": backlog_cap,
            "default_max_acquisitions": 5,
            "default_lease_ttl": 30,
        }
        if retention is not None:
            settings["retention"] = retention
        response = self.admin.put(f"/v1/tenants/{name}", json=settings)
        response.raise_for_status()
        keys = {}
        for role in ("worker", "operator"):
            created = self.admin.post(f"/v1/tenants/{name}/keys", json={"role": role})
            created.raise_for_status()
            keys[role] = created.json()["secret"]
        with httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {keys['operator']}"},
            timeout=60,
        ) as operator:
            for queue in queues:
                approved = operator.post(
                    f"/v1/tenants/{name}/queues/{queue}/spend-approvals",
                    json={
                        "max_concurrency": MAX_APPROVED,
                        "expires_at": SOON,
                        "reason": "benchmark",
                    },
                    headers={"Idempotency-Key": uuid.uuid4().hex},
                )
                approved.raise_for_status()
        return Tenant(name=name, worker_key=keys["worker"], operator_key=keys["operator"])


@contextlib.contextmanager
def environment(*, server_workers: int | None, keep: bool = False) -> Iterator[Environment]:
    env = Environment(server_workers=server_workers, keep=keep)
    try:
        env.start()
        yield env
    finally:
        env.stop()


# `n` ready items of one queue, each as an enqueue makes it (the row and its `enqueued`
# ledger event), in one statement: the prefill of the benchmark and of the scale curve.
# Ready items of `keys` ordering keys with the rest of each key's line waiting behind them,
# as an enqueue with `ordering_key` makes them (migration 0031): the first of each key ready.
ORDERED_PREFILL = """
WITH ins AS (
    INSERT INTO work_items (tenant_id, item_id, queue, payload, priority, state, available_at,
                            max_acquisitions, event_seq, created_at, updated_at, ordering_key,
                            ordering_seq)
    SELECT %(tenant)s, gen_random_uuid(), %(queue)s, jsonb_build_object('n', g), 0,
           CASE WHEN g <= %(keys)s THEN 'ready' ELSE 'waiting' END::item_state,
           statement_timestamp(), 5, 1, statement_timestamp(), statement_timestamp(),
           'key-' || (g %% %(keys)s), nextval('work_items_ordering_seq')
    FROM generate_series(1, %(n)s) AS g
    RETURNING tenant_id, item_id, queue, payload, priority, available_at, max_acquisitions,
              created_at, state, ordering_key
)
INSERT INTO item_events (tenant_id, item_id, seq, at, kind, fence, actor, data)
SELECT tenant_id, item_id, 0, created_at, 'enqueued', 0, 'bench-prefill',
       jsonb_build_object('queue', queue, 'payload', payload, 'priority', priority,
                          'available_at', available_at, 'max_acquisitions', max_acquisitions,
                          'ordering_key', ordering_key)
       || CASE WHEN state = 'waiting' THEN '{"state": "waiting"}'::jsonb ELSE '{}' END
FROM ins
"""

# `n` items of the queue waiting for one item of another queue that no bench worker takes
# (migration 0035): what a queue full of dependents costs an acquire of its ready items.
WAITING_PREFILL = """
WITH blocker AS (
    INSERT INTO work_items (tenant_id, item_id, queue, payload, priority, state, available_at,
                            max_acquisitions, event_seq, created_at, updated_at, has_dependents)
    VALUES (%(tenant)s, gen_random_uuid(), 'blockers', '{}', 0, 'ready', statement_timestamp(),
            5, 1, statement_timestamp(), statement_timestamp(), true)
    RETURNING tenant_id, item_id
), waiting AS (
    INSERT INTO work_items (tenant_id, item_id, queue, payload, priority, state, available_at,
                            max_acquisitions, event_seq, created_at, updated_at,
                            on_dependency_failure)
    SELECT %(tenant)s, gen_random_uuid(), %(queue)s, jsonb_build_object('n', g), 0, 'waiting',
           statement_timestamp(), 5, 1, statement_timestamp(), statement_timestamp(), 'cancel'
    FROM generate_series(1, %(n)s) AS g
    RETURNING tenant_id, item_id
)
INSERT INTO item_dependencies (tenant_id, item_id, depends_on)
SELECT w.tenant_id, w.item_id, b.item_id FROM waiting w CROSS JOIN blocker b
"""

PREFILL = """
WITH ins AS (
    INSERT INTO work_items (tenant_id, item_id, queue, payload, priority, state, available_at,
                            max_acquisitions, event_seq, created_at, updated_at)
    SELECT %(tenant)s, gen_random_uuid(), %(queue)s, jsonb_build_object('n', g), 0, 'ready',
           statement_timestamp(), 5, 1, statement_timestamp(), statement_timestamp()
    FROM generate_series(1, %(n)s) AS g
    RETURNING tenant_id, item_id, queue, payload, priority, available_at, max_acquisitions,
              created_at
)
INSERT INTO item_events (tenant_id, item_id, seq, at, kind, fence, actor, data)
SELECT tenant_id, item_id, 0, created_at, 'enqueued', 0, 'bench-prefill',
       jsonb_build_object('queue', queue, 'payload', payload, 'priority', priority,
                          'available_at', available_at, 'max_acquisitions', max_acquisitions)
FROM ins
"""
