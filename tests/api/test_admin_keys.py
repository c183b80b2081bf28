"""Admin keys: more than one, each revocable by another admin at once in every API process,
never the last one; and `queue-server keys rotate-admin` on the server's machine."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from queue_server.auth import parse_bearer
from queue_server.client import AsyncQueueClient, QueueClient
from queue_server.settings import Settings
from tests.helpers.api import Api, client_for
from tests.helpers.server import LiveServer

BIN = Path(sys.executable).parent / "queue-server"


@pytest.fixture
def second(settings: Settings, database_url: str) -> Iterator[LiveServer]:
    """Another API process on the same database, with its own key cache and listener."""
    server = LiveServer(settings, database_url)
    server.start()
    yield server
    server.stop()


def _refused_within(client: httpx.Client, seconds: float = 2.0) -> bool:
    """The key is refused (401) on this server within `seconds` (a notification's trip)."""
    deadline = time.monotonic() + seconds
    while client.get("/v1/tenants/acme").status_code != 401:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_an_admin_key_is_revoked_by_another_admin_at_once_in_every_process(
    api: Api, second: LiveServer
) -> None:
    created = api.admin.post("/v1/admin-keys")
    assert created.status_code == 201, created.text
    body = created.json()
    assert (body["role"], body["tenant"]) == ("admin", None)
    on_first = api.client(body["secret"])
    on_second = client_for(second.url, body["secret"])
    # Both processes have the key cached now.
    assert on_first.get("/v1/tenants/acme").status_code == 200
    assert on_second.get("/v1/tenants/acme").status_code == 200
    listed = {k["key_id"]: k for k in api.admin.get("/v1/admin-keys").json()["admin_keys"]}
    assert listed[body["key_id"]]["revoked_at"] is None
    assert "secret" not in listed[body["key_id"]]

    revoked = api.admin.delete(f"/v1/admin-keys/{body['key_id']}")
    assert revoked.status_code == 204, revoked.text
    assert on_first.get("/v1/tenants/acme").status_code == 401
    assert _refused_within(on_second)
    assert api.admin.get("/v1/tenants/acme").status_code == 200


def test_the_last_admin_key_cannot_be_revoked_and_the_other_can_revoke_the_first(
    api: Api, admin_key: str
) -> None:
    first_id = admin_key.split("_")[1]
    alone = api.admin.delete(f"/v1/admin-keys/{first_id}")
    assert alone.status_code == 409
    assert alone.json()["code"] == "last-admin-key"
    other = api.client(api.admin.post("/v1/admin-keys").json()["secret"])
    assert other.delete(f"/v1/admin-keys/{first_id}").status_code == 204
    assert api.admin.get("/v1/tenants/acme").status_code == 401
    other_id = str(other.headers["Authorization"]).split("_")[1]
    last = other.delete(f"/v1/admin-keys/{other_id}")
    assert last.status_code == 409
    assert other.get("/v1/tenants/acme").status_code == 200


def test_tenant_keys_cannot_create_list_or_revoke_admin_keys(api: Api, admin_key: str) -> None:
    admin_id = admin_key.split("_")[1]
    for client in (api.worker, api.operator):
        assert client.post("/v1/admin-keys").status_code == 403
        assert client.get("/v1/admin-keys").status_code == 403
        assert client.delete(f"/v1/admin-keys/{admin_id}").status_code == 403
    # The tenant route names tenant keys only: an admin key is not one of acme's.
    assert api.admin.delete(f"/v1/tenants/acme/keys/{admin_id}").status_code == 404
    worker_id = api.keys["worker"].split("_")[1]
    assert api.admin.delete(f"/v1/admin-keys/{worker_id}").status_code == 404
    assert api.admin.get("/v1/tenants/acme").status_code == 200


def _rotate(database_url: str, data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "QUEUE_SERVER_DATABASE_URL": database_url}
    done = subprocess.run(
        [str(BIN), "keys", "rotate-admin", "--data-dir", str(data_dir), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_rotate_admin_writes_a_new_secret_0600_and_revokes_the_old_in_every_process(
    api: Api, second: LiveServer, admin_key: str, database_url: str, tmp_path: Path
) -> None:
    data_dir = tmp_path / "server-data"
    data_dir.mkdir()
    (data_dir / "admin.key").write_text(admin_key + "\n")
    old_on_second = client_for(second.url, admin_key)
    assert old_on_second.get("/v1/tenants/acme").status_code == 200  # cached there
    spare = api.admin.post("/v1/admin-keys").json()

    done = _rotate(database_url, data_dir)
    key_file = data_dir / "admin.key"
    new = key_file.read_text().strip()
    assert new != admin_key
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert new not in done.stdout + done.stderr  # only where it is
    assert str(key_file) in done.stdout
    assert api.admin.get("/v1/tenants/acme").status_code == 401
    assert _refused_within(old_on_second)
    for url in (api.url, second.url):
        assert client_for(url, new).get("/v1/tenants/acme").status_code == 200
    # Another admin's key is left alone, unless every other one is revoked on purpose.
    assert api.client(spare["secret"]).get("/v1/tenants/acme").status_code == 200

    again = _rotate(database_url, data_dir, "--revoke-all", "--print-admin-key")
    newest = key_file.read_text().strip()
    assert newest in again.stdout
    # It names the keys it revoked: the two live ones, not the one revoked before.
    [revoked] = [line for line in again.stdout.splitlines() if line.startswith("revoked: ")]
    assert sorted(revoked.removeprefix("revoked: ").split(", ")) == sorted(
        [parse_bearer(f"Bearer {new}"), spare["key_id"]]
    )
    for old in (new, spare["secret"]):
        assert _refused_within(client_for(second.url, old))
        assert api.client(old).get("/v1/tenants/acme").status_code == 401
    assert api.client(newest).get("/v1/tenants/acme").status_code == 200
    assert sorted(p.name for p in data_dir.iterdir()) == ["admin.key"]


@pytest.mark.live
def test_the_sdk_creates_and_revokes_admin_keys_sync_and_async(api: Api, admin_key: str) -> None:
    with QueueClient(api.url, admin_key) as admin:
        created = admin.create_admin_key()
        assert created.role == "admin"
        assert api.client(created.secret).get("/v1/tenants/acme").status_code == 200
        admin.revoke_admin_key(created.key_id)
        assert api.client(created.secret).get("/v1/tenants/acme").status_code == 401

    async def twin() -> str:
        async with AsyncQueueClient(api.url, admin_key) as admin:
            made = await admin.create_admin_key()
            await admin.revoke_admin_key(made.key_id)
            return made.secret

    assert api.client(asyncio.run(twin())).get("/v1/tenants/acme").status_code == 401
