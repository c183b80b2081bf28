"""The embedded PostgreSQL admits only the server's own account: another local user can reach
neither its socket nor its password, TCP demands the password, and starting it changes the
permissions of no directory outside the data directory. A cluster made by an older version
(trust authentication) gets a password before it serves again, with its data."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from queue_server.infra.embedded import HBA, EmbeddedPostgres, EmbeddedPostgresError

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.geteuid() != 0,
        reason="needs root: connects as another local user (nobody), as CI and `make test` run",
    ),
]

# Run as `nobody` by the system's Python, standard library only (the project's virtual
# environment may be somewhere nobody can read): what can another local account do?
AS_ANOTHER_USER = r"""
import json, socket, struct, sys
socket_path, port, passfile = sys.argv[1], int(sys.argv[2]), sys.argv[3]
seen = {}
try:
    unix = socket.socket(socket.AF_UNIX)
    unix.connect(socket_path)
    seen["unix"] = "connected"
except OSError as exc:
    seen["unix"] = type(exc).__name__
try:
    open(passfile).read()
    seen["passfile"] = "read"
except OSError as exc:
    seen["passfile"] = type(exc).__name__
tcp = socket.create_connection(("127.0.0.1", port), timeout=10)
params = b"user\0postgres\0database\0postgres\0\0"
tcp.sendall(struct.pack("!ii", 8 + len(params), 196608) + params)
kind = tcp.recv(1)
length = struct.unpack("!i", tcp.recv(4))[0]
body = tcp.recv(length - 4)
# "R" with 0 is AuthenticationOk (let in without a password); 10 is SASL (prove it).
seen["tcp"] = [kind.decode(), struct.unpack("!i", body[:4])[0]]
print(json.dumps(seen))
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _modes(paths: list[Path]) -> dict[Path, int]:
    return {path: stat.S_IMODE(path.stat().st_mode) for path in paths}


def _python_for_nobody() -> str:
    """A Python interpreter `nobody` may run (ours may live under /root, as with pyenv)."""
    candidates = [os.path.realpath(sys.executable), "/usr/local/bin/python3", "/usr/bin/python3"]
    for candidate in candidates:
        try:
            subprocess.run(
                [candidate, "-I", "-S", "-c", "pass"], user="nobody", cwd="/", check=True
            )
        except (OSError, subprocess.CalledProcessError):
            continue
        return candidate
    raise AssertionError(f"no Python interpreter that nobody may run among {candidates}")


def _as_nobody(pg: EmbeddedPostgres) -> dict[str, object]:
    socket_path = pg.socket_dir / f".s.PGSQL.{pg.port}"
    done = subprocess.run(
        [
            _python_for_nobody(),
            "-I",
            "-S",
            "-c",
            AS_ANOTHER_USER,
            str(socket_path),
            str(pg.port),
            str(pg.password_file),
        ],
        user="nobody",
        capture_output=True,
        text=True,
        cwd="/",
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen: dict[str, object] = json.loads(done.stdout)
    return seen


@pytest.fixture
def place() -> Iterator[Path]:
    """A directory other users may traverse (0751), with one more level (0711) below it."""
    base = Path(tempfile.mkdtemp(prefix="qs-embedded-"))
    base.chmod(0o751)
    (base / "deep").mkdir()
    (base / "deep").chmod(0o711)
    yield base / "deep"
    EmbeddedPostgres(base / "deep" / "pgdata").stop("immediate")
    subprocess.run(["rm", "-rf", str(base)], check=False)


def test_another_local_user_gets_nothing_and_no_outside_directory_changes(place: Path) -> None:
    outside = [place, *place.parents]
    before = _modes(outside)
    pg = EmbeddedPostgres(place / "pgdata", tcp_port=_free_port())
    pg.start()
    try:
        assert _modes(outside) == before
        # Nothing new outside the data directory but, at most, a copy of the programs.
        extra = [p.name for p in place.iterdir() if p.name != "pgdata"]
        assert all(name.startswith(".postgres-") for name in extra), extra
        assert stat.S_IMODE(pg.pgdata.stat().st_mode) == 0o700
        assert stat.S_IMODE(pg.password_file.stat().st_mode) == 0o600
        assert pg.socket_dir == pg.pgdata
        assert (pg.pgdata / "pg_hba.conf").read_text() == HBA

        seen = _as_nobody(pg)
        assert seen == {"unix": "PermissionError", "passfile": "PermissionError", "tcp": ["R", 10]}

        # Without the password, or with a wrong one, the superuser is refused (TCP and socket).
        for conninfo in (
            f"host=127.0.0.1 port={pg.port} user=postgres dbname=postgres password=wrong",
            f"host={pg.socket_dir} port={pg.port} user=postgres dbname=postgres passfile=/dev/null",
        ):
            with pytest.raises(psycopg.OperationalError, match="password"):
                psycopg.connect(conninfo, connect_timeout=10).close()
        # With the data directory's passfile (what url() names), the server's account is in.
        for url in (pg.url(), pg.tcp_url()):
            with psycopg.connect(url) as conn:
                assert conn.execute("SELECT current_user").fetchone() == ("postgres",)
        assert pg.password not in pg.url() + pg.tcp_url()
    finally:
        pg.stop("immediate")
    assert _modes(outside) == before


def test_a_data_directory_the_server_user_cannot_reach_is_refused_and_left_alone() -> None:
    closed = Path(tempfile.mkdtemp(prefix="qs-closed-"))  # 0700: nobody else may traverse it
    try:
        pg = EmbeddedPostgres(closed / "pgdata")
        with pytest.raises(EmbeddedPostgresError, match="not searchable by other users"):
            pg.start()
        assert stat.S_IMODE(closed.stat().st_mode) == 0o700
        assert not pg.is_running()
    finally:
        subprocess.run(["rm", "-rf", str(closed)], check=False)


def test_a_cluster_made_with_trust_by_an_older_version_gets_a_password_and_keeps_its_data(
    place: Path,
) -> None:
    port = _free_port()
    pg = EmbeddedPostgres(place / "pgdata", tcp_port=port)
    # What the older version did: initdb --auth=trust, and serve (it is still running).
    pg.pgdata.mkdir(mode=0o700)
    os.chown(pg.pgdata, *_system_ids())
    legacy_socket = place / ".pgdata.sock"
    legacy_socket.mkdir()
    os.chown(legacy_socket, *_system_ids())
    legacy_socket.chmod(0o777)
    initdb = [str(pg.program("initdb")), "-D", str(pg.pgdata), "--auth=trust", "-U", "postgres"]
    subprocess.run(initdb, user="embedded_postgres", check=True, capture_output=True, cwd="/")
    options = f"-k {legacy_socket} -p {port} -h 127.0.0.1"
    started = [str(pg.program("pg_ctl")), "-D", str(pg.pgdata), "-w", "-o", options]
    subprocess.run(
        [*started, "-l", str(pg.log_file), "start"],
        user="embedded_postgres",
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd="/",
    )
    trusted = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
    with psycopg.connect(trusted, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (x int)")
        conn.execute("INSERT INTO kept VALUES (42)")
    assert _as_nobody(pg)["tcp"] == ["R", 0]  # the hole: let in without a password

    pg.start()
    try:
        assert stat.S_IMODE(pg.password_file.stat().st_mode) == 0o600
        assert _as_nobody(pg)["tcp"] == ["R", 10]
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(trusted, connect_timeout=10).close()
        with psycopg.connect(pg.tcp_url()) as conn:
            assert conn.execute("SELECT x FROM kept").fetchone() == (42,)
        assert not legacy_socket.exists()
    finally:
        pg.stop("immediate")


def _system_ids() -> tuple[int, int]:
    import pwd

    entry = pwd.getpwnam("embedded_postgres")
    return entry.pw_uid, entry.pw_gid


def test_programs_the_server_user_cannot_reach_are_copied_beside_the_data_directory(
    place: Path,
) -> None:
    # As when the project lives under /root: copy the installed programs somewhere closed.
    installed = EmbeddedPostgres.bin_dir.parent.parent  # site-packages/embedded_postgres
    closed = place / "closed"
    closed.mkdir(mode=0o700)
    for found in [installed, *installed.parent.glob(f"{installed.name}.libs")]:
        subprocess.run(["cp", "-a", str(found), str(closed)], check=True)
    before = _modes([closed, place, *place.parents])
    pg = EmbeddedPostgres(place / "pgdata")
    pg.bin_dir = closed / installed.name / "pginstall" / "bin"
    pg.start()
    try:
        with psycopg.connect(pg.url()) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert _modes([closed, place, *place.parents]) == before
        copies = [p.name for p in place.iterdir() if p.name.startswith(".postgres-")]
        assert len(copies) == 1
    finally:
        pg.stop("immediate")


def test_as_root_the_default_data_directory_is_one_the_server_user_can_reach(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from queue_server import settings

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(settings, "ROOT_DATA_DIR", tmp_path / "var-lib")
    assert settings.default_data_dir() == tmp_path / "var-lib"
    # An older version's data directory under root's home is kept while it is there.
    (tmp_path / "home" / "queue-server" / "pgdata").mkdir(parents=True)
    assert settings.default_data_dir() == tmp_path / "home" / "queue-server"
    (tmp_path / "var-lib").mkdir()
    assert settings.default_data_dir() == tmp_path / "var-lib"
