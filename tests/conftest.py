"""Fixtures: one embedded PostgreSQL per session (so per xdist worker), a migrated template, a
fresh database per test, and the real API: in process by default, under uvicorn on a loopback
port where a test takes `live` or is marked `live` (sockets, processes, disconnects)."""

from __future__ import annotations

import gc
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row
from pytest_postgresql.janitor import DatabaseJanitor

from queue_server.infra import migrate
from queue_server.infra.embedded import EmbeddedPostgres
from queue_server.settings import Settings
from tests.helpers.api import Api, client_for, setup_tenant
from tests.helpers.database import Clones, fast_logins, stop_now
from tests.helpers.scratch import use_scratch_dir
from tests.helpers.server import InProcessServer, LiveServer, make_admin_key

TEMPLATE_DB = "qs_template"

gc.disable()  # until the tests run: see pytest_runtestloop

# pytest's basetemp, every test database and the guides' HOME, and the subprocesses' files.
use_scratch_dir()
# `serve` notes the data directory it started on in the user's state directory, where the
# CLI looks for it (queue_server/infra/address.py): the suite's servers note theirs apart.
STATE_HOME = os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="qs-test-state-")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Give each run a temporary root of its own.

    pytest's default root (`/tmp/pytest-of-<user>/pytest-N`) keeps only the last three
    runs and deletes older ones, so a second test run on the same machine can delete the
    directories of a run still in progress. With `--basetemp` given, that is left as is.
    """
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        config.option.basetemp = tempfile.mkdtemp(prefix="qs-pytest-")
        config.add_cleanup(lambda: shutil.rmtree(config.option.basetemp, ignore_errors=True))
    # Removed as the run ends, not at exit: the contract's proofs end with os._exit.
    config.add_cleanup(lambda: shutil.rmtree(STATE_HOME, ignore_errors=True))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under xdist, each worker's first tests are its share of the `slow` ones.

    `--dist worksteal` hands each worker one contiguous slice of the collection and lets an
    idle worker take the later half of a busy one's remaining slice. A test of half a
    minute near the end of a slice runs alone while the other workers have finished: the
    run's tail. Dealt out to the slices' starts instead, the slow tests run while every
    worker is busy, and what is left to steal at the end is short tests.
    """
    workerinput: dict[str, object] | None = getattr(config, "workerinput", None)
    if workerinput is None:
        return
    workers = int(str(workerinput["workercount"]))
    slow = [item for item in items if item.get_closest_marker("slow")]
    if not slow or workers < 2:
        return
    rest = iter([item for item in items if not item.get_closest_marker("slow")])
    # The slices' sizes as the scheduler cuts them: each of the n idle workers in turn takes
    # len(pending) // (workers still to serve) from the front.
    sizes, left = [], len(items)
    for i in range(workers):
        sizes.append(left // (workers - i))
        left -= sizes[-1]
    ordered: list[pytest.Item] = []
    for i, size in enumerate(sizes):
        share = slow[i::workers]
        ordered += share + [next(rest) for _ in range(max(0, size - len(share)))]
    ordered += list(rest)  # more slow tests than a slice holds: never in practice
    items[:] = ordered


# A running embedded PostgreSQL to share, and a migrated template on it (the contract
# verifier runs many short sessions).
SHARED_PGDATA_ENV = "QUEUE_SERVER_TEST_PGDATA"
SHARED_TEMPLATE_ENV = "QUEUE_SERVER_TEST_TEMPLATE"
# Every test's API on a socket, as before the in-process default (to compare, or to debug).
LIVE_ENV = "QUEUE_SERVER_TEST_LIVE"


@pytest.fixture(scope="session")
def pg() -> Iterator[EmbeddedPostgres]:
    shared = os.environ.get(SHARED_PGDATA_ENV)
    if shared:
        yield EmbeddedPostgres(Path(shared))
        return
    # Not under pytest's basetemp: another pytest run on the machine may prune that.
    root = Path(tempfile.mkdtemp(prefix="qs-test-pg-"))
    # As root, PostgreSQL runs as a system user that must traverse to its data directory.
    root.chmod(0o711)
    # A TCP port too (loopback, password required): for tests that put a proxy in between.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        tcp_port = probe.getsockname()[1]
    server = EmbeddedPostgres(
        root / "data",
        tcp_port=tcp_port,
        # Commit timestamps: for tests that order events by when they committed.
        server_settings={"max_connections": "300", "fsync": "off", "track_commit_timestamp": "on"},
    )
    server.start()
    fast_logins(server)
    yield server
    stop_now(server)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def template_db(pg: EmbeddedPostgres) -> Iterator[str]:
    """A database migrated to head once; each test clones it (its own, on a shared server)."""
    shared_template = os.environ.get(SHARED_TEMPLATE_ENV)
    if shared_template:
        yield shared_template
        return
    name = f"{TEMPLATE_DB}_{os.getpid()}" if os.environ.get(SHARED_PGDATA_ENV) else TEMPLATE_DB
    janitor = DatabaseJanitor(
        user="postgres",
        password=pg.password,
        host=str(pg.socket_dir),
        port=pg.port,
        dbname=name,
        version=18,
        as_template=True,
    )
    janitor.init()
    migrate.upgrade(pg.url(name))
    yield name
    if os.environ.get(SHARED_PGDATA_ENV):
        janitor.drop()


@pytest.fixture(scope="session")
def clones(pg: EmbeddedPostgres, template_db: str) -> Iterator[Clones]:
    clones = Clones(pg, template_db)
    yield clones
    clones.close()


@pytest.fixture
def database_url(pg: EmbeddedPostgres, clones: Clones) -> Iterator[str]:
    with clones.clone() as name:
        yield pg.url(name)


@pytest.fixture
def db(database_url: str) -> Iterator[psycopg.Connection[dict[str, object]]]:
    """A direct connection for assertions on what the server stored."""
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as conn:
        yield conn


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """A test's server settings. Its pool opens one connection and grows as requests need
    more: each connection of a fresh database parses and plans every statement it runs
    anew, and the pool hands its connections out in turn, so four opened at start did that
    work up to four times over in nearly every test."""
    return Settings(data_dir=tmp_path, poll_interval=0.2, lock_timeout_ms=2000, pool_min_size=1)


@pytest.fixture
def live(settings: Settings, database_url: str) -> Iterator[LiveServer]:
    server = LiveServer(settings, database_url)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def admin_key(settings: Settings, database_url: str) -> str:
    return make_admin_key(settings, database_url)


@pytest.fixture
def server(
    request: pytest.FixtureRequest, settings: Settings, database_url: str
) -> Iterator[InProcessServer | LiveServer]:
    """The API under test: the `live` server when the test takes it or is marked `live` (or
    every test, with QUEUE_SERVER_TEST_LIVE=1 in the environment)."""
    marked = request.node.get_closest_marker("live") or os.environ.get(LIVE_ENV) == "1"
    if "live" in request.fixturenames or marked:
        live: LiveServer = request.getfixturevalue("live")
        yield live
        return
    in_process = InProcessServer(settings, database_url)
    in_process.start()
    yield in_process
    in_process.stop()


@pytest.fixture
def admin(server: InProcessServer | LiveServer, admin_key: str) -> Iterator[httpx.Client]:
    with client_for(server.url, admin_key) as client:
        yield client


@pytest.fixture
def api(server: InProcessServer | LiveServer, admin: httpx.Client) -> Api:
    return setup_tenant(server.url, admin, "acme")


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    """The tests run with what was imported and collected frozen (`gc.freeze`): the app, the
    SDK and the test modules, nearly all of what a process holds, are no longer walked by
    each collection of the garbage the tests make (a tenth of an API test's CPU). Until
    then the collector is off (from this module's import on): it found nothing to free,
    and it took a third of the collection of the tests."""
    gc.freeze()
    gc.enable()
