"""The server behind a real PgBouncer in transaction mode (two server connections shared
by every client, as PgBouncer 1.18 does it): every route works, nothing is kept on a
session between transactions, and long polls still wake through the listener's own
direct session. PgBouncer is Debian's package, installed by the project's script."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import psycopg
import pytest

from queue_server.infra.embedded import SYSTEM_USER, EmbeddedPostgres
from queue_server.settings import Settings
from tests.helpers.api import Api, client_for, setup_tenant
from tests.helpers.server import LiveServer, make_admin_key

ENSURE = Path(__file__).resolve().parents[2] / "deploy" / "ensure-debian-packages.sh"
Db = psycopg.Connection[dict[str, object]]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def pgbouncer_bin() -> str:
    done = subprocess.run([str(ENSURE), "pgbouncer"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    path = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    assert Path(path).exists(), "pgbouncer is not on PATH after installing it"
    return path


@pytest.fixture
def pgbouncer(pgbouncer_bin: str, pg: EmbeddedPostgres) -> Iterator[int]:
    """PgBouncer on a loopback port, transaction pooling onto the embedded PostgreSQL."""
    port = _free_port()
    # Not under pytest's tmp_path: PgBouncer's user must be able to read its config.
    root = Path(tempfile.mkdtemp(prefix="qs-pgbouncer-"))
    # PgBouncer proves the server's password (SCRAM) on the clients' behalf.
    (root / "userlist.txt").write_text(f'"postgres" "{pg.password}"\n')
    (root / "pgbouncer.ini").write_text(
        f"""[databases]
* = host={pg.socket_dir} port={pg.port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {root}/userlist.txt
pool_mode = transaction
default_pool_size = 2
max_client_conn = 200
"""
    )
    # PgBouncer refuses to run as root: as root, run it as the embedded server's user.
    user = pwd.getpwnam(SYSTEM_USER) if os.geteuid() == 0 else None
    for path in (root, *root.iterdir()):
        path.chmod(0o755 if path.is_dir() else 0o600)
        if user is not None:
            os.chown(path, user.pw_uid, user.pw_gid)
    with (root / "log").open("wb") as log:
        proc = subprocess.Popen(
            [pgbouncer_bin, str(root / "pgbouncer.ini")],
            stdout=log,
            stderr=subprocess.STDOUT,
            user=user.pw_uid if user else None,
            group=user.pw_gid if user else None,
            extra_groups=[] if user else None,
        )
    deadline = time.monotonic() + 10
    while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
        assert proc.poll() is None, (root / "log").read_text()
        assert time.monotonic() < deadline, "PgBouncer did not listen"
        time.sleep(0.05)
    yield port
    proc.terminate()
    proc.wait(10)
    shutil.rmtree(root, ignore_errors=True)


def test_every_request_works_through_pgbouncer_in_transaction_mode(
    pgbouncer: int, database_url: str, db: Db, tmp_path: Path
) -> None:
    name = database_url.split("/")[3].split("?")[0]
    pooled = f"postgresql://postgres@127.0.0.1:{pgbouncer}/{quote(name)}"
    settings = Settings(
        data_dir=tmp_path,
        database_pooler="transaction",
        listen_database_url=database_url,
        pool_min_size=4,
        pool_max_size=12,
    )
    server = LiveServer(settings, pooled)
    server.start()
    try:
        admin = client_for(server.url, make_admin_key(settings, pooled))
        api: Api = setup_tenant(server.url, admin, "acme")
        api.approve("q", 16)
        statuses: Counter[int] = Counter()
        lock = threading.Lock()

        def record(response: httpx.Response) -> httpx.Response:
            with lock:
                statuses[response.status_code] += 1
            return response

        def work(n: int) -> None:
            with client_for(server.url, api.keys["worker"]) as client:
                base = f"/v1/tenants/{api.tenant}"
                for round_ in range(5):
                    key = f"{n}-{round_}-{uuid.uuid4().hex}"
                    body = {"items": [{"payload": {"n": n, "i": i}} for i in range(3)]}
                    for _ in range(2):  # the second is a replay
                        record(
                            client.post(
                                f"{base}/queues/q/items:batch",
                                json=body,
                                headers={"Idempotency-Key": key},
                            )
                        )
                    leases = record(
                        client.post(
                            f"{base}/queues/q/leases",
                            json={"worker": f"w{n}", "lease_ttl": 30, "max_items": 3},
                        )
                    ).json()["leases"]
                    for lease in leases:
                        item = f"{base}/items/{lease['item_id']}"
                        record(
                            client.post(
                                f"{item}/heartbeat",
                                json={"worker": f"w{n}", "fence": lease["fence"], "lease_ttl": 30},
                            )
                        )
                        record(
                            client.post(
                                f"{item}/complete",
                                json={"worker": f"w{n}", "fence": lease["fence"], "result": {}},
                                headers={"Idempotency-Key": uuid.uuid4().hex},
                            )
                        )
                        record(client.get(f"{item}/ledger"))
                    record(client.get(f"{base}/queues"))

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert sum(statuses.values()) > 100
        assert all(status < 400 for status in statuses), statuses

        # Long polls still wake at once: the listener has a session of its own.
        woke: dict[str, float] = {}

        def wait_for_work() -> None:
            answer = api.worker.post(
                f"/v1/tenants/{api.tenant}/queues/q/leases",
                json={"worker": "waiter", "lease_ttl": 30, "wait": 10},
            )
            woke["at"] = time.monotonic()
            woke["n"] = len(answer.json()["leases"])

        waiter = threading.Thread(target=wait_for_work)
        waiter.start()
        time.sleep(0.5)
        api.enqueue()
        enqueued = time.monotonic()
        waiter.join(15)
        assert woke["n"] == 1
        # The poll would wake it half a second after the enqueue; the watch (through
        # PgBouncer), at once
        # (a bound with room for a slow answer on a busy machine).
        assert woke["at"] - enqueued < 0.3
    finally:
        server.stop()

    # The session settings reach every server connection PgBouncer opens.
    with psycopg.connect(pooled, autocommit=True, prepare_threshold=None) as through:
        assert through.execute("SHOW statement_timeout").fetchone() == ("15s",)
        assert through.execute("SHOW plan_cache_mode").fetchone() == ("force_generic_plan",)
        assert through.execute("SHOW TimeZone").fetchone() == ("UTC",)
    assert db.execute("SELECT count(*) AS n FROM work_items WHERE state = 'completed'").fetchone()


def test_a_transaction_pooler_without_a_direct_listen_url_is_refused() -> None:
    with pytest.raises(ValueError, match="LISTEN_DATABASE_URL is required"):
        Settings(database_url="postgresql://pgbouncer/db", database_pooler="transaction")
