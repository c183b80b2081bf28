"""Fixtures: one embedded PostgreSQL per session, a migrated template, a fresh database per test,
and the real API served by uvicorn on a loopback port."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
import pytest
import uvicorn
from psycopg.rows import dict_row
from pytest_postgresql.janitor import DatabaseJanitor

from queue_server.app import create_app
from queue_server.infra import migrate
from queue_server.infra.embedded import EmbeddedPostgres
from queue_server.infra.http_protocol import ProblemHttpToolsProtocol
from queue_server.infra.serve import create_admin_key
from queue_server.settings import Settings

TEMPLATE_DB = "qs_template"


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


# A running embedded PostgreSQL to share, and a migrated template on it (the contract
# verifier runs many short sessions).
SHARED_PGDATA_ENV = "QUEUE_SERVER_TEST_PGDATA"
SHARED_TEMPLATE_ENV = "QUEUE_SERVER_TEST_TEMPLATE"


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
        server_settings={"max_connections": "300", "fsync": "off"},
    )
    server.start()
    yield server
    server.stop("immediate")
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


@pytest.fixture
def database_url(pg: EmbeddedPostgres, template_db: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    with DatabaseJanitor(
        user="postgres",
        password=pg.password,
        host=str(pg.socket_dir),
        port=pg.port,
        dbname=name,
        template_dbname=template_db,
        version=18,
    ):
        yield pg.url(name)


@pytest.fixture
def db(database_url: str) -> Iterator[psycopg.Connection[dict[str, object]]]:
    """A direct connection for assertions on what the server stored."""
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as conn:
        yield conn


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path, poll_interval=0.2, lock_timeout_ms=2000)


class LiveServer:
    """The app under uvicorn in a thread, on a real loopback socket."""

    def __init__(self, settings: Settings, database_url: str) -> None:
        self.settings = settings
        self.database_url = database_url
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = create_app(settings, database_url)
        config = uvicorn.Config(
            self.app, log_level="warning", lifespan="on", http=ProblemHttpToolsProtocol
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]})

    def start(self) -> None:
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            threading.Event().wait(0.01)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


@pytest.fixture
def live(settings: Settings, database_url: str) -> Iterator[LiveServer]:
    server = LiveServer(settings, database_url)
    server.start()
    yield server
    server.stop()


def make_admin_key(settings: Settings, database_url: str) -> str:
    secret = create_admin_key(settings, database_url)
    assert secret is not None
    return secret


@dataclass
class Api:
    """HTTP clients of one tenant: admin, operator and worker keys."""

    url: str
    tenant: str
    admin: httpx.Client
    operator: httpx.Client
    worker: httpx.Client
    keys: dict[str, str] = field(default_factory=dict)

    def client(self, key: str) -> httpx.Client:
        return client_for(self.url, key)

    def enqueue(
        self, queue: str = "q", payload: object = None, **fields: object
    ) -> dict[str, object]:
        response = self.worker.post(
            f"/v1/tenants/{self.tenant}/queues/{queue}/items",
            json={"payload": payload, **fields},
            headers={"Idempotency-Key": uuid.uuid4().hex},
        )
        assert response.status_code == 201, response.text
        body: dict[str, object] = response.json()
        return body

    def acquire(
        self, queue: str = "q", worker: str = "w1", ttl: float = 30, **fields: object
    ) -> list[dict[str, object]]:
        response = self.worker.post(
            f"/v1/tenants/{self.tenant}/queues/{queue}/leases",
            json={"worker": worker, "lease_ttl": ttl, **fields},
        )
        assert response.status_code == 200, response.text
        leases: list[dict[str, object]] = response.json()["leases"]
        return leases

    def holder(
        self, action: str, item_id: object, key: str | None = None, **body: object
    ) -> httpx.Response:
        return self.worker.post(
            f"/v1/tenants/{self.tenant}/items/{item_id}/{action}",
            json=body,
            headers={"Idempotency-Key": key or uuid.uuid4().hex},
        )

    def approve(self, queue: str, max_concurrency: int) -> None:
        response = self.operator.post(
            f"/v1/tenants/{self.tenant}/queues/{queue}/spend-approvals",
            json={
                "approved_by": "ops@example.com",
                "max_concurrency": max_concurrency,
                "expires_at": "2999-01-01T00:00:00Z",
                "reason": "load test",
            },
            headers={"Idempotency-Key": uuid.uuid4().hex},
        )
        assert response.status_code == 201, response.text


def client_for(url: str, key: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=url, headers=headers, timeout=30)


def setup_tenant(url: str, admin: httpx.Client, tenant: str, backlog_cap: int = 1000) -> Api:
    response = admin.put(
        f"/v1/tenants/{tenant}",
        json={"backlog_cap": backlog_cap, "default_max_acquisitions": 3},
    )
    assert response.status_code == 200, response.text
    keys = {}
    for role in ("worker", "operator"):
        created = admin.post(f"/v1/tenants/{tenant}/keys", json={"role": role})
        assert created.status_code == 201, created.text
        keys[role] = created.json()["secret"]
    return Api(
        url=url,
        tenant=tenant,
        admin=admin,
        operator=client_for(url, keys["operator"]),
        worker=client_for(url, keys["worker"]),
        keys=keys,
    )


@pytest.fixture
def admin_key(settings: Settings, database_url: str) -> str:
    return make_admin_key(settings, database_url)


@pytest.fixture
def admin(live: LiveServer, admin_key: str) -> Iterator[httpx.Client]:
    with client_for(live.url, admin_key) as client:
        yield client


@pytest.fixture
def api(live: LiveServer, admin: httpx.Client) -> Api:
    return setup_tenant(live.url, admin, "acme")


def policy_file(path: Path, cells: dict[str, dict[str, object]], revision: str = "test") -> Path:
    """A policy document of one's own: the built-in one with `cells` ({class: {dimension:
    cell}}) replaced, written to `path` for --policy / QUEUE_SERVER_POLICY / Settings.policy."""
    import copy
    import json

    from queue_server.policy.v2 import OPERATION_RELIABILITY_V2

    doc = copy.deepcopy(OPERATION_RELIABILITY_V2)
    doc["revision"] = revision
    for cls, replaced in cells.items():
        doc["classes"][cls].update(replaced)
    path.write_text(json.dumps(doc))
    return path


@contextlib.contextmanager
def live_api(settings: Settings, database_url: str, tenant: str = "acme") -> Iterator[Api]:
    """A live server with `settings` (e.g. a policy file) and one tenant with its keys."""
    server = LiveServer(settings, database_url)
    server.start()
    try:
        with client_for(server.url, make_admin_key(settings, database_url)) as admin:
            yield setup_tenant(server.url, admin, tenant)
    finally:
        server.stop()
