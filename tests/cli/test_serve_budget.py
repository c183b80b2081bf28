"""`serve`'s connection budget: many processes on the embedded database take a load without
one connection refused, and a configuration that cannot fit is refused at start."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from queue_server.infra.budget import (
    ConnectionBudgetError,
    Limits,
    embedded_max_connections,
    plan,
)
from queue_server.infra.embedded import EmbeddedPostgres
from queue_server.infra.serve import admin_key_path
from queue_server.settings import Settings
from queue_server.store.bootstrap import DATABASE_NAME, SERVER_ROLE
from tests.helpers import web

BIN = Path(sys.executable).parent / "queue-server"
PROCESSES = 16
CLIENTS = 64
LOAD_SECONDS = 5.0
RESERVE = 10  # QUEUE_SERVER_DATABASE_RESERVE's default
REFUSED = "too many clients"
START_LINE = re.compile(
    r"database connections: (\d+) processes x pool (\d+)-(\d+) \+ (\d+) listeners,"
    r" reserve (\d+), of max_connections (\d+) \((\d+) reserved for superusers"
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "QUEUE_SERVER_DATABASE_URL" and not k.startswith("QUEUE_SERVER_POOL_")
    }
    return {**env, **extra}


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory other users may traverse (as root, PostgreSQL runs as a system user)."""
    root = Path(tempfile.mkdtemp(prefix="qs-budget-"))
    root.chmod(0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)


class Output:
    """A server's output, read as it comes (a full pipe would stall the server)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert proc.stdout is not None
        stream = proc.stdout
        self._thread = threading.Thread(target=lambda: self.lines.extend(stream), daemon=True)
        self._thread.start()

    def text(self) -> str:
        return "".join(self.lines)

    def join(self) -> str:
        self._thread.join(timeout=30)
        return self.text()


def _server_sessions(pg: EmbeddedPostgres) -> Counter[str]:
    """The server's sessions by application name (read as the superuser, in its own slots)."""
    with psycopg.connect(pg.url(DATABASE_NAME), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT application_name, count(*) FROM pg_stat_activity WHERE usename = %s GROUP BY 1",
            (SERVER_ROLE,),
        ).fetchall()
    return Counter({name: count for name, count in rows})


@contextlib.contextmanager
def _peak_sessions(pg: EmbeddedPostgres) -> Iterator[list[int]]:
    """The most sessions the server held at once meanwhile (sampled every 0.1 s)."""
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], sum(_server_sessions(pg).values()))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        yield peak
    finally:
        done.set()
        sampler.join(timeout=30)


def _wait_for_every_process(
    port: int, proc: subprocess.Popen[str], pg: EmbeddedPostgres, processes: int
) -> None:
    """Until every process listens (its LISTEN session is up) and the API answers."""
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the server stopped"
        try:
            ready = web.get(f"http://127.0.0.1:{port}/readyz").status_code == 200
        except httpx.TransportError:
            ready = False
        if ready and _server_sessions(pg)["queue-server-listener"] >= processes:
            return
        time.sleep(0.5)
    raise AssertionError("the server's processes did not all start")


def _worker_key(url: str, data_dir: Path, tenant: str) -> str:
    """A worker key of a new tenant, made with the admin key the server wrote."""
    admin = {"Authorization": f"Bearer {admin_key_path(data_dir).read_text().strip()}"}
    put = web.put(f"{url}/v1/tenants/{tenant}", json={"backlog_cap": 10_000}, headers=admin)
    assert put.status_code == 200, put.text
    made = web.post(f"{url}/v1/tenants/{tenant}/keys", json={"role": "worker"}, headers=admin)
    assert made.status_code == 201, made.text
    secret: str = made.json()["secret"]
    return secret


def _load(
    url: str, tenant: str, key: str, clients: int = CLIENTS, seconds: float = LOAD_SECONDS
) -> tuple[Counter[int], int]:
    """`clients` clients, each on a connection of its own, enqueue, acquire and complete for
    `seconds` (at most 500 cycles each): the answers' statuses, and the items completed."""
    statuses: Counter[int] = Counter()
    completed = 0
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def client(n: int) -> None:
        nonlocal completed
        seen: Counter[int] = Counter()
        done = 0
        headers = {"Authorization": f"Bearer {key}"}
        with web.client(base_url=url, headers=headers, timeout=30) as http:
            for _ in range(500):
                if time.monotonic() > stop_at:
                    break
                queue = f"q{n % 8}"
                put = http.post(
                    f"/v1/tenants/{tenant}/queues/{queue}/items",
                    json={"payload": {"n": n}},
                    headers={"Idempotency-Key": uuid.uuid4().hex},
                )
                seen[put.status_code] += 1
                got = http.post(
                    f"/v1/tenants/{tenant}/queues/{queue}/leases",
                    json={"worker": f"w{n}", "lease_ttl": 30},
                )
                seen[got.status_code] += 1
                for lease in got.json().get("leases", []) if got.status_code == 200 else []:
                    end = http.post(
                        f"/v1/tenants/{tenant}/items/{lease['item_id']}/complete",
                        json={"worker": f"w{n}", "fence": lease["fence"]},
                        headers={"Idempotency-Key": uuid.uuid4().hex},
                    )
                    seen[end.status_code] += 1
                    done += end.status_code == 200
        with lock:
            statuses.update(seen)
            completed += done

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    assert not any(thread.is_alive() for thread in threads)
    return statuses, completed


def _stop(proc: subprocess.Popen[str]) -> None:
    """Stop a server as Ctrl-C does; killed, with everything it started, if it hangs."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _refused(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """`queue-server serve ARGS`, expected to stop at start: (exit code, stdout, stderr). One
    that serves instead is stopped, with everything it started, and fails the test."""
    proc = subprocess.Popen(
        [str(BIN), "serve", "--port", str(_free_port()), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=45)
    except subprocess.TimeoutExpired:
        _stop(proc)
        raise AssertionError("the server started instead of refusing") from None
    return proc.returncode, out, err


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_sixteen_processes_on_the_embedded_database_take_64_clients_without_a_refusal(
    open_dir: Path,
) -> None:
    data_dir = open_dir / "data"
    pg = EmbeddedPostgres(data_dir / "pgdata")
    port = _free_port()
    proc = subprocess.Popen(
        [str(BIN), "serve", "--port", str(port), "--data-dir", str(data_dir),
         "--workers", str(PROCESSES)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(),
        start_new_session=True,  # a failure below kills it with all it started
    )  # fmt: skip
    output = Output(proc)
    try:
        _wait_for_every_process(port, proc, pg, PROCESSES)
        line = START_LINE.search(output.text())
        assert line, output.text()
        processes, pool_min, pool_max, listeners, reserve, max_connections, reserved = map(
            int, line.groups()
        )
        assert (processes, listeners, reserve) == (PROCESSES, PROCESSES, RESERVE)
        # Every process's full pool, its listener, the reserve and the superusers' slots fit.
        assert processes * pool_max + listeners + reserve + reserved <= max_connections
        assert pool_min <= pool_max
        # The embedded database is started with room for every process's full pool.
        assert pool_max == 20  # QUEUE_SERVER_POOL_MAX_SIZE's default

        url = f"http://127.0.0.1:{port}"
        key = _worker_key(url, data_dir, "acme")
        reserve_held: list[psycopg.Connection[tuple[object, ...]]] = []
        with _peak_sessions(pg) as peak:
            try:
                statuses, completed = _load(url, "acme", key)
                # With the server under load, an application (a role without superuser's
                # slots) still gets the reserve's connections.
                app_url = pg.url(DATABASE_NAME, user=SERVER_ROLE)
                reserve_held.extend(psycopg.connect(app_url) for _ in range(RESERVE))
            finally:
                for conn in reserve_held:
                    conn.close()
        assert set(statuses) <= {200, 201}, statuses
        assert completed > 0
        assert peak[0] <= processes * (pool_max + 1), peak
    finally:
        _stop(proc)
    out = output.join()
    assert REFUSED not in out
    assert REFUSED not in pg.log_tail(10_000_000)
    assert "Traceback" not in out


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_budget_the_processes_cannot_fit_in_is_refused_at_start(open_dir: Path) -> None:
    data_dir = open_dir / "data"
    # 4 processes need 4 x (a minimum pool of 4 + a listener) + the reserve of 10 = 30.
    code, stdout, stderr = _refused(
        ["--data-dir", str(data_dir), "--workers", "4"], _env(QUEUE_SERVER_DATABASE_BUDGET="29")
    )
    message = " ".join(stderr.split())
    assert code == 1, stdout + stderr
    assert "4 server processes do not fit in the database's connections" in message
    assert "they need at least 30" in message
    assert "QUEUE_SERVER_DATABASE_BUDGET=29 leaves 29" in message
    assert "Traceback" not in stdout + stderr
    assert not EmbeddedPostgres(data_dir / "pgdata").is_running()  # stopped again

    # With a minimum pool of 3 they need 26: it fits, each pool capped at its share, 3.
    fits = _env(QUEUE_SERVER_DATABASE_BUDGET="29", QUEUE_SERVER_POOL_MIN_SIZE="3")
    port = _free_port()
    proc = subprocess.Popen(
        [str(BIN), "serve", "--port", str(port), "--data-dir", str(data_dir), "--workers", "4"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=fits,
        start_new_session=True,
    )  # fmt: skip
    output = Output(proc)
    try:
        deadline = time.monotonic() + 90
        while "database connections:" not in output.text() and time.monotonic() < deadline:
            assert proc.poll() is None, output.text()
            time.sleep(0.2)
        assert (
            "database connections: 4 processes x pool 3-3 + 4 listeners, reserve 10,"
            " of max_connections 100 (3 reserved for superusers, budget 29)"
        ) in output.text()
        pg = EmbeddedPostgres(data_dir / "pgdata")
        _wait_for_every_process(port, proc, pg, 4)
        url = f"http://127.0.0.1:{port}"
        key = _worker_key(url, data_dir, "acme")
        # More clients than the pools hold: each process stays within its share.
        with _peak_sessions(pg) as peak:
            statuses, _ = _load(url, "acme", key, clients=32, seconds=3)
        assert set(statuses) <= {200, 201}, statuses
        assert peak[0] <= 4 * (3 + 1), peak
    finally:
        _stop(proc)
    output.join()


@pytest.mark.slow
def test_a_database_whose_max_connections_cannot_hold_the_processes_is_refused(
    database_url: str, tmp_path: Path
) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT current_setting('max_connections')::int"
            " - current_setting('superuser_reserved_connections')::int"
            " - current_setting('reserved_connections')::int"
        ).fetchone()
    assert row is not None
    usable = row[0]
    # One process more than fits with a minimum pool of 4, a listener each and the reserve.
    processes = (usable - RESERVE) // 5 + 1
    code, stdout, stderr = _refused(
        ["--data-dir", str(tmp_path), "--workers", str(processes)],
        {**_env(), "QUEUE_SERVER_DATABASE_URL": database_url},
    )
    message = " ".join(stderr.split())
    assert code == 1, stdout + stderr
    assert f"{processes} server processes do not fit in the database's connections" in message
    assert f"they need at least {processes * 5 + RESERVE}" in message
    assert "the database's max_connections" in message


def _settings(**values: object) -> Settings:
    return Settings.model_validate({"database_url": "postgresql://db/qs", **values})


def test_the_metrics_listener_and_each_processs_listener_come_out_of_the_budget() -> None:
    limits = Limits(max_connections=101, reserved=3)
    # (98 - 10 - 8 listeners - 1 metrics listener) // 8 = 9 (10 without the metrics listener)
    budget = plan(_settings(), limits, processes=8, metrics_listener=True)
    assert (budget.pool_min, budget.pool_max, budget.listeners) == (4, 9, 9)
    assert budget.describe() == (
        "database connections: 8 processes x pool 4-9 + 9 listeners, reserve 10,"
        " of max_connections 101 (3 reserved for superusers)"
    )
    # A share above POOL_MAX_SIZE leaves the pool at it.
    assert plan(_settings(), limits, processes=1, metrics_listener=False).pool_max == 20


def test_a_budget_above_what_the_database_accepts_is_held_to_the_database() -> None:
    limits = Limits(max_connections=53, reserved=3)
    # (50 - 10 - 2 listeners) // 2 = 19, whatever the budget above 50 says.
    for budget in (None, 50, 1_000):
        planned = plan(
            _settings(database_budget=budget), limits, processes=2, metrics_listener=False
        )
        assert planned.pool_max == 19, budget
    assert (
        plan(_settings(database_budget=40), limits, processes=2, metrics_listener=False).pool_max
        == (40 - 10 - 2) // 2
    )


def test_through_a_transaction_pooler_the_budget_is_the_poolers() -> None:
    pooled = {"database_pooler": "transaction", "listen_database_url": "postgresql://pg/qs"}
    unchecked = plan(_settings(**pooled), None, processes=16, metrics_listener=False)
    assert (unchecked.pool_min, unchecked.pool_max) == (4, 20)
    assert "through a transaction pooler" in unchecked.describe()
    assert "unchecked: the pooler's max_client_conn is the budget" in unchecked.describe()
    assert "16 listeners direct to PostgreSQL" in unchecked.describe()
    # Stated: the listeners bypass the pooler, so only the pools and the reserve count.
    stated = plan(
        _settings(**pooled, database_budget=90), None, processes=16, metrics_listener=False
    )
    assert stated.pool_max == (90 - 10) // 16
    with pytest.raises(ConnectionBudgetError, match="QUEUE_SERVER_DATABASE_BUDGET=70 at the"):
        plan(_settings(**pooled, database_budget=70), None, processes=16, metrics_listener=False)


def test_the_embedded_database_gets_room_for_every_full_pool() -> None:
    assert embedded_max_connections(_settings(), processes=2, metrics_listener=False) == 100
    room = embedded_max_connections(_settings(), processes=16, metrics_listener=True)
    assert room == 16 * 20 + 16 + 1 + 10 + 3
    limits = Limits(max_connections=room, reserved=3)
    assert plan(_settings(), limits, processes=16, metrics_listener=True).pool_max == 20
