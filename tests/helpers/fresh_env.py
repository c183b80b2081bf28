"""Fresh virtual environments built offline, and the two distributions of this repository.

The server (`pyproject.toml`) and the SDK (`client/pyproject.toml`, `queue-server-client`)
share the namespace package `queue_server`. A fresh environment is made without pip, its
dependencies copied from this environment file by file (each distribution's RECORD), and a
project installed from a wheel built here (`--no-build-isolation`: no index is reached).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
# The distributions of this repository, by name: where their pyproject.toml is.
PROJECTS = {"queue-server": ROOT, "queue-server-client": ROOT / "client"}
NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", "*.egg-info", "build", ".mypy_cache", ".ruff_cache"
)


def project(name: str) -> dict[str, Any]:
    """The `[project]` table of one of this repository's distributions."""
    table: dict[str, Any] = tomllib.loads((PROJECTS[name] / "pyproject.toml").read_text())[
        "project"
    ]
    return table


def requirements(name: str, extras: tuple[str, ...] = ()) -> list[Requirement]:
    """What installing `name` with `extras` asks for: from its pyproject.toml when it is one of
    this repository's (installed or not), else from its installed metadata."""
    if canonicalize_name(name) in PROJECTS:
        table = project(canonicalize_name(name))
        texts: list[str] = list(table["dependencies"])
        optional: dict[str, list[str]] = table.get("optional-dependencies", {})
        for extra in extras:
            texts += optional[extra]
    else:
        texts = metadata.requires(name) or []
    found = []
    for text in texts:
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in {"", *extras}):
            found.append(req)
    return found


def closure(name: str, extras: tuple[str, ...] = ()) -> set[str]:
    """Every distribution installing `name` with `extras` brings (itself included), read from
    this repository's pyproject files and the installed distributions' metadata."""
    seen: dict[str, set[str]] = {canonicalize_name(name): set(extras)}
    todo = list(requirements(name, extras))
    while todo:
        req = todo.pop()
        key = canonicalize_name(req.name)
        if key in seen and set(req.extras) <= seen[key]:
            continue
        seen[key] = wanted = seen.get(key, set()) | set(req.extras)
        todo += requirements(key, tuple(sorted(wanted)))
    return set(seen)


def copy_distribution(name: str, site: Path) -> None:
    """Install `name` into `site` by copying its files from this environment (its RECORD)."""
    dist = metadata.distribution(name)
    base = Path(str(dist.locate_file(""))).resolve()
    assert dist.files is not None, f"{name} has no RECORD to copy it by"
    for file in dist.files:
        source = Path(str(dist.locate_file(file))).resolve()
        if not source.is_relative_to(base) or not source.is_file():
            continue  # console scripts in bin/: none is needed
        target = site / source.relative_to(base)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)


def as_unprivileged() -> list[str]:
    """As root, the prefix that runs a command as `nobody`; otherwise none."""
    if os.geteuid() != 0:
        return []
    return [shutil.which("runuser") or "/usr/sbin/runuser", "-u", "nobody", "--"]


def base_python() -> str:
    """A Python of this version that the serving user can run: this one's base, or one of
    the system's (as root, this one may sit under /root, which `nobody` cannot reach)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    base: str = getattr(sys, "_base_executable", sys.executable)
    candidates = [base, shutil.which(version), f"/usr/bin/{version}"]
    for python in filter(None, candidates):
        probe = [*as_unprivileged(), python, "-c", "import venv"]
        if subprocess.run(probe, capture_output=True, check=False).returncode == 0:
            return python
    pytest.fail(f"no {version} that an unprivileged user can run: tried {candidates}")


def clean_env() -> dict[str, str]:
    """This environment less PYTHONPATH: what it names (a checkout's own sources) is
    neither installed in the fresh environment nor to be seen from it."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def pip(*args: str) -> None:
    """This environment's pip, offline: no index, no dependencies."""
    offline = ["--quiet", "--no-deps", "--no-index"]
    argv = [sys.executable, "-m", "pip", *args[:-1], *offline, args[-1]]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=300, check=False, env=clean_env()
    )
    assert done.returncode == 0, done.stdout + done.stderr


def build_wheels(sources: list[Path], wheels: Path) -> list[Path]:
    """The wheels of the projects at `sources`, built here without an index."""
    for source in sources:
        pip("wheel", "--no-build-isolation", "--wheel-dir", str(wheels), str(source))
    return sorted(wheels.glob("*.whl"))


def new_venv(where: Path) -> tuple[Path, Path]:
    """A fresh virtual environment with no pip and nothing else: (its python, its site)."""
    subprocess.run([base_python(), "-m", "venv", "--without-pip", str(where)], check=True)
    (site,) = where.glob("lib/python3*/site-packages")
    return where / "bin" / "python", site


def installed(python: Path) -> set[str]:
    """The distributions the environment of `python` holds, by canonical name."""
    listed = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.metadata as m;"
            "print(*sorted(d.metadata['Name'] for d in m.distributions()), sep='\\n')",
        ],
        # Not from a checkout: an editable install leaves its metadata (*.egg-info) there.
        cwd=python.parent,
        capture_output=True,
        text=True,
        check=True,
        env=clean_env(),
    ).stdout.split()
    return {canonicalize_name(n) for n in listed}
