"""Installing the project puts one top-level package, `queue_server`, into site-packages.

The check builds the project from a copy of the repository (as a clean checkout would be
built), installs it without dependencies into an empty directory, and runs the installed copy.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from alembic.script import ScriptDirectory

ROOT = Path(__file__).resolve().parents[1]
NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", "*.egg-info", "build", ".mypy_cache", ".ruff_cache"
)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("install")
    source, target = work / "source", work / "target"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCES)
    offline = ["--quiet", "--no-deps", "--no-index", "--no-build-isolation"]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", *offline, "--target", str(target), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return target


def _run_installed(target: Path, *args: str) -> str:
    """Run a command with the installed copy first on the path, outside the repository."""
    done = subprocess.run(
        args,
        env={**os.environ, "PYTHONPATH": str(target)},
        cwd=target.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_install_yields_exactly_one_top_level_package(installed: Path) -> None:
    # `bin/` holds the console script; everything importable is queue_server.
    top = sorted(p.name for p in installed.iterdir() if p.name != "bin")
    assert top == ["queue_server", "queue_server-0.1.0.dist-info"]
    (dist_info,) = installed.glob("*.dist-info")
    assert (dist_info / "top_level.txt").read_text().split() == ["queue_server"]
    assert sorted(p.name for p in (installed / "bin").iterdir()) == ["queue-server"]


def test_installed_package_holds_the_cli_and_every_migration(installed: Path) -> None:
    package = installed / "queue_server"
    versions = {p.name for p in (ROOT / "queue_server/migrations/versions").glob("*.py")}
    assert {p.name for p in (package / "migrations/versions").glob("*.py")} == versions
    assert (package / "migrations/env.py").is_file()
    assert (package / "migrations/script.py.mako").is_file()
    assert (package / "py.typed").is_file()

    probe = (
        "import queue_server, queue_server.cli.main, queue_server.migrations as m;"
        "from pathlib import Path;"
        "from alembic.script import ScriptDirectory;"
        "print(queue_server.__file__);"
        "print(*sorted(ScriptDirectory(str(Path(m.__file__).parent)).get_heads()))"
    )
    where, heads = _run_installed(installed, sys.executable, "-c", probe).splitlines()
    assert Path(where).is_relative_to(installed)
    repo_heads = ScriptDirectory(str(ROOT / "queue_server/migrations")).get_heads()
    assert heads.split() == sorted(repo_heads)

    usage = _run_installed(installed, str(installed / "bin/queue-server"), "db", "--help")
    assert "upgrade" in usage
