"""`queue-server policy verify --server URL`: a live deployment's envelope, probed from an
installed copy (no test files), on a scratch tenant it deletes again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from queue_server.client.probes import probe_server
from queue_server.services.envelope import LeaseEnvelope
from tests.helpers.api import Api, client_for
from tests.helpers.server import LiveServer

pytestmark = pytest.mark.live  # `queue-server` runs as a subprocess against the URL

BIN = Path(sys.executable).parent / "queue-server"
Db = psycopg.Connection[dict[str, object]]


def _admin_key(api: Api) -> str:
    return str(api.admin.headers["Authorization"]).removeprefix("Bearer ")


def test_policy_verify_server_passes_on_a_live_server_and_deletes_its_scratch_tenant(
    api: Api, db: Db, tmp_path: Path
) -> None:
    done = subprocess.run(
        [str(BIN), "policy", "verify", "--server", api.url, "--json"],
        cwd=tmp_path,  # no tests/ here: the installed command needs none
        env={**os.environ, "QUEUE_SERVER_KEY": _admin_key(api)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["passed"]
    assert report["cleaned_up"]
    assert report["version"] == "operation-reliability.v2"
    cells = {p["cell"] for p in report["probes"]}
    assert {
        "durable-leased-work/retry",
        "durable-leased-work/attempt-timeout",
        "durable-leased-work/deadline",
        "durable-leased-work/backoff-and-jitter",
        "artifact-verification/deadline",
        "artifact-verification/concurrency",
        "confirmed-mutation/deadline",
    } <= cells
    tenant = report["tenant"]
    assert api.admin.get(f"/v1/tenants/{tenant}").status_code == 404
    for table in ("work_items", "item_events", "idempotency_receipts", "verification_runs"):
        row = db.execute(f"SELECT count(*) AS n FROM {table} WHERE tenant_id = %s", (tenant,))
        assert row.fetchone() == {"n": 0}, table


def test_policy_verify_server_fails_naming_the_cell_a_server_lets_through(
    live: LiveServer, admin_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server serves v2 but admits any budget: its runtime was weakened (the probes,
    # in this same process, read the policy as served).
    monkeypatch.setattr(LeaseEnvelope, "budget", lambda self, value, *loc: None)
    report = probe_server(live.url, admin_key)
    failed = {p.cell for p in report.probes if not p.ok}
    assert failed == {"durable-leased-work/retry"}
    assert not report.passed
    assert report.cleaned_up


def test_deleting_a_tenant_is_for_admins_and_removes_everything_of_it(api: Api, db: Db) -> None:
    api.enqueue()
    assert api.operator.delete(f"/v1/tenants/{api.tenant}").status_code == 403
    assert api.admin.delete(f"/v1/tenants/{api.tenant}").status_code == 204
    assert api.admin.delete(f"/v1/tenants/{api.tenant}").status_code == 404
    assert db.execute("SELECT count(*) AS n FROM item_events").fetchone() == {"n": 0}
    with client_for(api.url, api.keys["worker"]) as gone:
        assert gone.get(f"/v1/tenants/{api.tenant}/items/x").status_code == 401
