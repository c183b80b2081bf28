"""A policy of one's own, end to end: `policy new --version acme.v3 > p.json`, raise the leased
work's deadline and budget, run a server under it; and every version the server has run
under, kept with its sha256 and starts (GET /v1/policy/history, `policy history`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from queue_server.cli.main import app
from queue_server.client import QueueClient
from queue_server.client.errors import ForbiddenRoleError
from queue_server.policy import default_policy, load_policy_file
from queue_server.settings import Settings
from tests.helpers.api import Api, client_for, setup_tenant
from tests.helpers.server import LiveServer

pytestmark = pytest.mark.live  # two servers on one database

BIN = Path(sys.executable).parent / "queue-server"
runner = CliRunner()


def policy_new(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`queue-server policy new ARGS > path`, as a shell would run it."""
    with path.open("w") as out:
        return subprocess.run(
            [str(BIN), "policy", "new", *args],
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            env={k: v for k, v in os.environ.items() if not k.startswith("QUEUE_SERVER_")},
        )


def acme_v3(tmp_path: Path) -> Path:
    """p.json: the built-in as acme.v3, a lease living 7200 s and 25 acquisitions."""
    path = tmp_path / "p.json"
    done = policy_new(path, "--version", "acme.v3")
    assert done.returncode == 0, done.stderr
    doc = json.loads(path.read_text())
    leased = doc["classes"]["durable-leased-work"]
    leased["deadline"]["seconds"] = 7200
    leased["retry"]["max-acquisitions"] = 25  # the isolation budget follows it
    path.write_text(json.dumps(doc, indent=2))
    return path


def history(url: str, key: str) -> list[dict[str, Any]]:
    result = runner.invoke(app, ["policy", "history", "--json", "--url", url, "--key", key])
    assert result.exit_code == 0, result.output
    versions: list[dict[str, Any]] = json.loads(result.output)["versions"]
    return versions


def admin_key(api: Api) -> str:
    return str(api.admin.headers["Authorization"]).removeprefix("Bearer ")


def _at(value: object) -> datetime:
    return datetime.fromisoformat(str(value))


def test_policy_new_prints_the_built_in_under_the_new_version(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    assert policy_new(path, "--version", "acme.v3").returncode == 0
    doc = json.loads(path.read_text())
    assert doc["version"] == "acme.v3"
    assert doc["classes"] == default_policy().as_document()["classes"]
    assert load_policy_file(path).version == "acme.v3"
    refused = policy_new(tmp_path / "same.json", "--version", "operation-reliability.v2")
    assert refused.returncode == 2
    assert "operation-reliability.v2 is the built-in policy" in refused.stderr


def test_a_server_under_a_version_of_ones_own_runs_long_leases_and_keeps_both_versions(
    api: Api, live: LiveServer, tmp_path: Path, database_url: str
) -> None:
    # The first server runs under the built-in; the second, on the same database, under acme.v3.
    path = acme_v3(tmp_path)
    settings = Settings(data_dir=tmp_path / "acme", poll_interval=0.2, policy=str(path))
    second = LiveServer(settings, database_url)
    second.start()
    try:
        acme = setup_tenant(second.url, client_for(second.url, admin_key(api)), "acme3")
        _long_leases_and_both_versions(acme, path)
    finally:
        second.stop()
    # The built-in server, asked the same, says it runs under the built-in.
    built_in = history(api.url, admin_key(api))
    assert [(v["version"], v["current"]) for v in built_in] == [
        ("acme.v3", False),
        ("operation-reliability.v2", True),
    ]


def _long_leases_and_both_versions(acme: Api, path: Path) -> None:
    mine = load_policy_file(path)
    acme.enqueue("long", max_acquisitions=20)
    asked = datetime.now(UTC)
    (lease,) = acme.acquire("long", ttl=30)
    deadline = _at(lease["lease_deadline_at"])
    assert abs(deadline - (asked + timedelta(seconds=7200))) < timedelta(seconds=5)
    assert (deadline - _at(lease["lease_expires_at"])).total_seconds() == pytest.approx(
        7200 - 30, abs=0.05
    )
    # Above the new budget is still refused, naming the cell.
    over = acme.worker.post(
        f"/v1/tenants/{acme.tenant}/queues/long/items",
        json={"payload": None, "max_acquisitions": 26},
        headers={"Idempotency-Key": "over-the-budget"},
    )
    assert over.status_code == 422, over.text
    assert over.json()["errors"][0]["cell"] == "durable-leased-work/retry"
    served = acme.client(None).get("/v1/policy").json()
    assert served["version"] == "acme.v3"
    assert served["loaded"]["version"] == "acme.v3"

    versions = history(acme.url, admin_key(acme))
    assert [(v["version"], v["current"]) for v in versions] == [
        ("acme.v3", True),
        ("operation-reliability.v2", False),
    ]
    assert versions[0]["sha256"] == mine.sha256
    assert versions[0]["source"] == str(path)
    assert versions[1]["sha256"] == default_policy().sha256
    assert versions[1]["source"] == "built-in"
    assert [v["loads"] for v in versions] == [1, 1]
    table = runner.invoke(
        app,
        ["policy", "history", "--wide", "--url", acme.url, "--key", admin_key(acme)],
    )
    assert table.exit_code == 0, table.output
    assert "acme.v3" in table.output
    assert "operation-reliability.v2" in table.output
    assert mine.sha256[:12] in table.output


def test_a_restart_under_the_same_version_counts_a_load_and_keeps_its_first(
    api: Api, live: LiveServer, settings: Settings, database_url: str
) -> None:
    (first,) = history(api.url, admin_key(api))
    live.stop()
    restarted = LiveServer(settings, database_url)
    restarted.start()
    try:
        (again,) = history(restarted.url, admin_key(api))
    finally:
        restarted.stop()
    assert again["version"] == first["version"] == "operation-reliability.v2"
    assert again["loads"] == first["loads"] + 1
    assert again["first_loaded_at"] == first["first_loaded_at"]
    assert _at(again["last_loaded_at"]) > _at(first["last_loaded_at"])


def test_the_policy_history_is_for_the_admin_key_only(api: Api) -> None:
    assert api.admin.get("/v1/policy/history").status_code == 200
    for client in (api.operator, api.worker):
        refused = client.get("/v1/policy/history")
        assert refused.status_code == 403, refused.text
        assert refused.json()["type"].endswith("/forbidden-role")
    assert api.client(None).get("/v1/policy/history").status_code == 401
    with (
        QueueClient(api.url, api.keys["operator"]) as operator,
        pytest.raises(ForbiddenRoleError, match="Only an admin key"),
    ):
        operator.policy_history()
