"""The system under test as real processes: an embedded PostgreSQL on a loopback
TCP port, the API under uvicorn as a subprocess (``queue-server serve``), and
helpers to crash, restart and inspect both.

Everything listens on 127.0.0.1 and lives in a temporary directory that
:meth:`Cluster.stop` removes. The harness reads the database only to set up
faults and to take the final snapshot.
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
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

import httpx
import psycopg
from psycopg.rows import dict_row

from queue_server.client.connection import tls_context
from queue_server.infra.embedded import EmbeddedPostgres
from queue_server.infra.serve import ensure_admin_key
from queue_server.settings import Settings
from queue_server.store.bootstrap import DATABASE_NAME
from reliability.checkers import SNAPSHOT_EVENTS_SQL, SNAPSHOT_ITEMS_SQL, DatabaseSnapshot

__all__ = [
    "HOST",
    "Cluster",
    "SystemUnderTest",
    "TenantKeys",
    "create_tenant",
    "free_port",
    "say",
    "venv_bin",
]

HOST = "127.0.0.1"
# A spend approval lasts at most a year: this one, 30 days from the start of the run.
SOON = (datetime.now(UTC) + timedelta(days=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
#: The harness's own database sessions carry this name, so faults can spare them.
HARNESS_APP = "reliability-harness"
# What the sweeper writes on its own clock: never a request's effect (see `table_digest`).
SAMPLED_TABLES = frozenset({"queue_samples", "queue_day_samples"})
# The counters' deltas and bases, which the fold rewrites on its own clock (a second) without
# changing a total: their totals (the view counter_totals) are digested instead.
FOLDED_TABLES = frozenset({"counter_deltas", "counter_bases"})


def say(message: str) -> None:
    """Progress on stderr, flushed at once."""
    print(f"[reliability {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def wait_answering(
    url: str, *, timeout: float = 60.0, proc: subprocess.Popen[bytes] | None = None
) -> bool:
    """Wait until `url` answers 200; False at the timeout, or as soon as `proc` has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2, verify=tls_context()).status_code == 200:
                return True
        if proc is not None and proc.poll() is not None:
            return False
        time.sleep(0.1)
    return False


def venv_bin(name: str) -> str:
    """A console script next to the running interpreter (the project's .venv)."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


class SystemUnderTest(Protocol):
    """What the checkers need of a running system: an admin client, per-tenant counts,
    the final snapshot and a direct database session (a :class:`Cluster`, or the HA
    topology of :mod:`reliability.failover`)."""

    def admin_client(self, base_url: str | None = None) -> httpx.Client: ...

    def state_counts(self, tenant: str) -> dict[str, int]: ...

    def snapshot(self) -> DatabaseSnapshot: ...

    def db(self) -> contextlib.AbstractContextManager[psycopg.Connection[dict[str, Any]]]: ...


@dataclass(frozen=True)
class TenantKeys:
    tenant: str
    worker: str
    operator: str
    worker_key_id: str


class Cluster:
    """PostgreSQL + migrated database + one API process, started fresh."""

    def __init__(
        self,
        *,
        name: str = "cluster",
        api_env: Mapping[str, str] | None = None,
        pg_settings: Mapping[str, str] | None = None,
        pg_bin_dir: Path | None = None,
        api_prefix: Sequence[str] = (),
        api_args: Sequence[str] = (),
    ) -> None:
        """``pg_bin_dir``: another PostgreSQL's binaries (initdb, pg_ctl, postgres) instead
        of the embedded one's; ``api_prefix``: a command the API runs under (``faketime``);
        ``api_args``: more arguments of its ``serve``."""
        self.name = name
        self.root = Path(tempfile.mkdtemp(prefix=f"qs-rel-{name}-"))
        self.root.chmod(0o711)  # as root, PostgreSQL's system user traverses to its data
        settings = {"fsync": "off", "max_connections": "200", **(pg_settings or {})}
        self.pg = EmbeddedPostgres(
            self.root / "pgdata", tcp_port=free_port(), server_settings=settings
        )
        if pg_bin_dir is not None:
            self.pg.bin_dir = pg_bin_dir
        self.api_prefix = list(api_prefix)
        self.api_args = list(api_args)
        self.api_port = free_port()
        self.base_url = f"http://{HOST}:{self.api_port}"
        # Over TCP, with the password from the cluster's own passfile.
        self.db_url = self.pg.tcp_url(DATABASE_NAME, HOST)
        self.api_env = dict(api_env or {})
        self.api_log = self.root / "api.log"
        self.api_proc: subprocess.Popen[bytes] | None = None
        self.admin_key = ""
        self.api_starts = 0

    # ------------------------------------------------------------ lifecycle

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        self.pg.start()
        with psycopg.connect(self.pg.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DATABASE_NAME}")
        env = self._env()
        subprocess.run(
            [venv_bin("queue-server"), "db", "upgrade"],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        settings = Settings(database_url=self.db_url, data_dir=self.root / "data")
        secret = ensure_admin_key(settings, self.db_url)
        if secret is None:
            raise RuntimeError("a fresh database already had an admin key")
        self.admin_key = secret
        self.start_api()

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "QUEUE_SERVER_DATABASE_URL": self.db_url,
            "QUEUE_SERVER_DATA_DIR": str(self.root / "data"),
            **self.api_env,
        }

    def start_api(self, timeout: float = 60.0) -> None:
        """Start the API subprocess and wait until /readyz answers 200."""
        if self.api_proc is not None and self.api_proc.poll() is None:
            raise RuntimeError("the API is already running")
        with self.api_log.open("ab") as log:
            self.api_proc = subprocess.Popen(
                [
                    *self.api_prefix,
                    venv_bin("queue-server"),
                    "serve",
                    "--host",
                    HOST,
                    "--port",
                    str(self.api_port),
                    "--workers",
                    "1",
                    "--log-level",
                    "warning",
                    *self.api_args,
                ],
                env=self._env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.api_starts += 1
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 60.0) -> float:
        """Wait for /readyz 200; returns the seconds waited."""
        begin = time.monotonic()
        deadline = begin + timeout
        with httpx.Client(base_url=self.base_url, timeout=2.0) as client:
            while True:
                proc = self.api_proc
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(f"the API exited:\n{self.api_log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get("/readyz").status_code == 200:
                        return time.monotonic() - begin
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the API did not become ready:\n{self.api_log_tail()}")
                time.sleep(0.05)

    def api_rss(self) -> int:
        """Resident memory of the API process and its children, in bytes (0 if it is gone)."""
        import psutil

        proc = self.api_proc
        if proc is None:
            return 0
        try:
            root = psutil.Process(proc.pid)
            return sum(int(p.memory_info().rss) for p in [root, *root.children(recursive=True)])
        except psutil.Error:
            return 0

    def api_cpu_seconds(self) -> float:
        """CPU time (user + system) the API process and its children used so far."""
        import psutil

        proc = self.api_proc
        if proc is None:
            return 0.0
        try:
            root = psutil.Process(proc.pid)
            total = 0.0
            for p in [root, *root.children(recursive=True)]:
                times = p.cpu_times()
                total += float(times.user) + float(times.system)
            return total
        except psutil.Error:
            return 0.0

    def pg_cpu_seconds(self) -> float:
        """CPU time (user + system) of the PostgreSQL postmaster and its backends so far."""
        import psutil

        try:
            pid = int((self.pg.pgdata / "postmaster.pid").read_text().split()[0])
            root = psutil.Process(pid)
            total = 0.0
            for p in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    times = p.cpu_times()
                    total += float(times.user) + float(times.system)
            return total
        except (OSError, ValueError, IndexError, psutil.Error):
            return 0.0

    def pg_version(self) -> str:
        with self.db() as conn:
            row = conn.execute("SHOW server_version").fetchone()
        return str(row["server_version"]) if row else ""

    def api_log_tail(self, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return self.api_log.read_text(errors="replace")[-chars:]
        return ""

    def kill_api(self) -> None:
        """SIGKILL the API process (a crash: no shutdown, no rollback beyond PostgreSQL's)."""
        proc = self.api_proc
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        self._wait_port_free()
        self.api_proc = None

    def stop_api(self) -> None:
        proc = self.api_proc
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill_api()
        self._wait_port_free()
        self.api_proc = None

    def _wait_port_free(self, timeout: float = 10.0) -> None:
        """Wait until nothing listens on the API's port any more: a child of the old
        process still serving it would answer for a restarted API (or keep it from binding)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                sock.settimeout(0.5)
                if sock.connect_ex((HOST, self.api_port)) != 0:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"port {self.api_port} is still served after the API stopped")

    def crash_pg(self) -> None:
        """``pg_ctl stop -m immediate``: every backend dies, recovery runs on the next start."""
        self.pg.stop("immediate")

    def start_pg(self) -> None:
        self.pg.start()

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self.stop_api()
        with contextlib.suppress(Exception):
            self.pg.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.pg.socket_dir, ignore_errors=True)

    # -------------------------------------------------------------- database

    @contextlib.contextmanager
    def db(self) -> Iterator[psycopg.Connection[dict[str, Any]]]:
        """A direct autocommit connection (named, so faults can spare it)."""
        with psycopg.connect(
            self.db_url, autocommit=True, row_factory=dict_row, application_name=HARNESS_APP
        ) as conn:
            yield conn

    def snapshot(self) -> DatabaseSnapshot:
        with self.db() as conn:
            items = conn.execute(SNAPSHOT_ITEMS_SQL).fetchall()
            events = conn.execute(SNAPSHOT_EVENTS_SQL).fetchall()
        return DatabaseSnapshot.from_rows(items, events)

    def state_counts(self, tenant: str) -> dict[str, int]:
        with self.db() as conn:
            rows = conn.execute(
                "SELECT state::text AS state, count(*) AS n FROM work_items "
                "WHERE tenant_id = %s GROUP BY state",
                (tenant,),
            ).fetchall()
        return {str(r["state"]): int(r["n"]) for r in rows}

    def table_digest(self) -> dict[str, str]:
        """A digest of every table's full content, to prove a request changed nothing.

        The sweeper's samples of the queues (`SAMPLED_TABLES`) are left out: it writes them
        on its own clock, a few seconds after what it samples changed, whatever the request
        in flight; a request's own writes show in the items, ledgers and counters they
        sample. The counters are digested as their totals (`FOLDED_TABLES`)."""
        out: dict[str, str] = {}
        with self.db() as conn:
            tables = conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"
            ).fetchall()
            for row in tables:
                name = str(row["tablename"])
                if name in SAMPLED_TABLES or name in FOLDED_TABLES:
                    continue
                out[name] = self._digest(conn, name)
            out["counter_totals"] = self._digest(conn, "counter_totals")
        return out

    @staticmethod
    def _digest(conn: Any, name: str) -> str:
        digest = conn.execute(
            f"SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) AS d FROM \"{name}\" t"
        ).fetchone()
        return str(digest["d"]) if digest else ""

    def terminate_api_backends(self) -> int:
        """pg_terminate_backend every client session but the harness's; returns how many."""
        with self.db() as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) AS t FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid() "
                "AND backend_type = 'client backend' AND application_name <> %s",
                (DATABASE_NAME, HARNESS_APP),
            ).fetchall()
        return sum(1 for r in rows if r["t"])

    def idle_in_transaction(self, older_than_s: float) -> int:
        """API sessions idle in a transaction for longer than ``older_than_s``."""
        with self.db() as conn:
            row = conn.execute(
                "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = %s "
                "AND application_name <> %s AND state LIKE 'idle in transaction%%' "
                "AND now() - state_change > make_interval(secs => %s)",
                (DATABASE_NAME, HARNESS_APP, older_than_s),
            ).fetchone()
        return int(row["n"]) if row else 0

    # --------------------------------------------------------------- tenants

    def admin_client(self, base_url: str | None = None) -> httpx.Client:
        return httpx.Client(
            base_url=base_url or self.base_url,
            headers={"Authorization": f"Bearer {self.admin_key}"},
            timeout=30,
        )

    def create_tenant(
        self,
        tenant: str,
        *,
        backlog_cap: int = 10_000,  # the built-in policy's max-queued
        max_acquisitions: int = 5,
        max_concurrency: int | None = None,
        queues: tuple[str, ...] = ("q",),
    ) -> TenantKeys:
        return create_tenant(
            self.base_url,
            self.admin_key,
            tenant,
            backlog_cap=backlog_cap,
            max_acquisitions=max_acquisitions,
            max_concurrency=max_concurrency,
            queues=queues,
        )


def create_tenant(
    base_url: str,
    admin_key: str,
    tenant: str,
    *,
    backlog_cap: int = 10_000,  # the built-in policy's max-queued
    max_acquisitions: int = 5,
    max_concurrency: int | None = None,
    queues: tuple[str, ...] = ("q",),
) -> TenantKeys:
    """A tenant with a worker and an operator key, and spend approvals for its queues."""
    admin_client = httpx.Client(
        base_url=base_url, headers={"Authorization": f"Bearer {admin_key}"}, timeout=30
    )
    with admin_client as admin:
        response = admin.put(
            f"/v1/tenants/{tenant}",
            # The default lease TTL is the policy's attempt timeout (30 s in v2).
            json={"backlog_cap": backlog_cap, "default_max_acquisitions": max_acquisitions},
        )
        response.raise_for_status()
        keys: dict[str, str] = {}
        key_ids: dict[str, str] = {}
        for role in ("worker", "operator"):
            created = admin.post(f"/v1/tenants/{tenant}/keys", json={"role": role})
            created.raise_for_status()
            keys[role] = created.json()["secret"]
            key_ids[role] = created.json()["key_id"]
    if max_concurrency is not None:
        with httpx.Client(
            base_url=base_url,
            headers={"Authorization": f"Bearer {keys['operator']}"},
            timeout=30,
        ) as operator:
            for queue in queues:
                approval = operator.post(
                    f"/v1/tenants/{tenant}/queues/{queue}/spend-approvals",
                    json={
                        "max_concurrency": max_concurrency,
                        "expires_at": SOON,
                        "reason": "reliability suite",
                    },
                    headers={"Idempotency-Key": uuid.uuid4().hex},
                )
                approval.raise_for_status()
    return TenantKeys(tenant, keys["worker"], keys["operator"], key_ids["worker"])
