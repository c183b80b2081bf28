"""A worker machine installs the SDK alone: `queue-server-client` (client/pyproject.toml).

Its wheel is built offline from a copy of client/ and nothing else of the repository, and
installed into a fresh virtual environment that holds only its dependencies (httpx, pydantic,
tenacity, orjson and what they bring, copied from this environment by their RECORD files).
There a worker runs against a live server. Importing the SDK, there or here beside the server,
loads no module of the server's distribution and none of the server's own dependencies.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.helpers.api import Api
from tests.helpers.fresh_env import (
    NOT_SOURCES,
    build_wheels,
    clean_env,
    closure,
    copy_distribution,
    installed,
    new_venv,
    pip,
)
from tests.helpers.server import LiveServer

ROOT = Path(__file__).resolve().parents[1]
CLIENT = "queue-server-client"
CLIENT_TREE = ROOT / "client" / "queue_server"
# The server's dependencies that a worker machine must never need.
SERVER_ONLY = (
    "fastapi",
    "starlette",
    "sqlalchemy",
    "psycopg",
    "alembic",
    "uvicorn",
    "rich",
    "typer",
)
PROBE = "import json, sys\nimport {}\nprint(json.dumps(sorted(sys.modules)))"
SDK = "queue_server.client"
# The SDK's dependencies, which load what they find installed (httpx its command line's rich
# and click, tenacity tornado): beside the server, those are theirs, not the SDK's.
DEPENDENCIES = "httpx, pydantic, tenacity, orjson"


def client_modules() -> set[str]:
    """Every module the client distribution ships (its share of the namespace package)."""
    base = CLIENT_TREE.parent
    return {
        ".".join(path.relative_to(base).with_suffix("").parts).removesuffix(".__init__")
        for path in CLIENT_TREE.rglob("*.py")
    }


def offending(loaded: set[str]) -> list[str]:
    """The loaded modules a worker machine must not need: the server's dependencies and any
    module of `queue_server` that is not the client distribution's."""
    ours = client_modules() | {"queue_server"}
    return sorted(
        name
        for name in loaded
        if name.split(".")[0] in SERVER_ONLY
        or (name.split(".")[0] == "queue_server" and name not in ours)
    )


def _loaded(
    python: str | Path, cwd: Path, env: dict[str, str] | None = None, imports: str = SDK
) -> set[str]:
    """The modules a fresh interpreter holds after importing `imports`."""
    done = subprocess.run(
        [str(python), "-c", PROBE.format(imports)],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


@pytest.fixture(scope="module")
def client_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The client's wheel, built from client/ alone."""
    work = tmp_path_factory.mktemp("client-wheel")
    source = work / "client"
    shutil.copytree(ROOT / "client", source, ignore=NOT_SOURCES)
    (wheel,) = build_wheels([source], work / "wheels")
    return wheel


@pytest.fixture(scope="module")
def client_venv(client_wheel: Path) -> Iterator[Path]:
    """A fresh environment with the client and its dependencies' closure, nothing else: its
    python."""
    root = Path(tempfile.mkdtemp(prefix="qs-client-venv-"))
    try:
        python, site = new_venv(root / "venv")
        for name in sorted(closure(CLIENT) - {CLIENT}):
            copy_distribution(name, site)
        pip("--python", str(python), "install", str(client_wheel))
        yield python
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_client_wheel_holds_the_sdk_the_policy_and_the_wire_shapes_only(
    client_wheel: Path,
) -> None:
    with zipfile.ZipFile(client_wheel) as wheel:
        names = wheel.namelist()
        (metadata_file,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = wheel.read(metadata_file).decode()
    shipped = {n for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert {n.split("/")[1] for n in shipped} == {"client", "policy", "wire.py"}
    assert "queue_server/__init__.py" not in shipped  # a namespace package, shared
    requires = [
        Requirement(line.removeprefix("Requires-Dist: "))
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist: ")
    ]
    plain = sorted(r.name for r in requires if r.marker is None)
    assert plain == ["httpx", "orjson", "pydantic", "tenacity"]
    extra = [r for r in requires if r.marker is not None]
    assert [r.name for r in extra] == ["opentelemetry-api"]
    (marker,) = [r.marker for r in extra]
    assert marker is not None
    assert marker.evaluate({"extra": "tracing"})


def test_a_worker_machine_installs_fewer_than_twenty_packages(client_venv: Path) -> None:
    names = installed(client_venv)
    assert CLIENT in names
    assert "queue-server" not in names
    assert sorted(n for n in names if n in SERVER_ONLY) == []
    assert len(names) < 20, sorted(names)


def test_importing_the_sdk_on_a_worker_machine_loads_no_server_module(
    client_venv: Path, tmp_path: Path
) -> None:
    loaded = _loaded(client_venv, tmp_path, clean_env())
    assert "queue_server.client.worker" in loaded
    assert offending(loaded) == []


def test_importing_the_sdk_beside_the_server_loads_no_server_module() -> None:
    """Here the server is installed too: an import of it from the SDK would succeed, and is
    caught all the same."""
    loaded = _loaded(sys.executable, ROOT)
    assert "queue_server.policy.retry" in loaded
    assert offending(loaded - _loaded(sys.executable, ROOT, imports=DEPENDENCIES)) == []


def test_the_check_finds_a_server_module_and_a_server_dependency() -> None:
    loaded = {
        "queue_server",
        "queue_server.client.core",
        "queue_server.wire",
        "queue_server.errors",
        "queue_server.transport.broker",
        "fastapi.routing",
        "rich",
        "httpx",
    }
    assert offending(loaded) == [
        "fastapi.routing",
        "queue_server.errors",
        "queue_server.transport.broker",
        "rich",
    ]


WORKER = textwrap.dedent(
    """
    import json, sys
    from queue_server.client import Job, QueueClient, Worker

    def double(job: Job) -> dict:
        return {"doubled": job.payload["n"] * 2}

    with QueueClient(sys.argv[1], sys.argv[2]) as qs:
        ids = [qs.enqueue("fresh", {"n": n}).item_id for n in range(5)]
        handled = Worker(qs, "fresh", double).run(drain=True)
    print(json.dumps({"ids": ids, "handled": handled, "modules": sorted(sys.modules)}))
    """
)


@pytest.mark.slow
def test_a_worker_on_a_worker_machine_runs_against_a_live_server(
    client_venv: Path, live: LiveServer, api: Api, tmp_path: Path
) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {k: v for k, v in clean_env().items() if not k.startswith("QUEUE_SERVER_")}
    done = subprocess.run(
        [str(client_venv), str(script), live.url, api.keys["worker"]],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    answer = json.loads(done.stdout.splitlines()[-1])
    assert answer["handled"] == 5
    assert offending(set(answer["modules"])) == []
    for n, item_id in enumerate(answer["ids"]):
        item = api.worker.get(f"/v1/tenants/{api.tenant}/items/{item_id}").json()
        assert item["state"] == "completed", item
        assert item["result"] == {"doubled": n * 2}, item
