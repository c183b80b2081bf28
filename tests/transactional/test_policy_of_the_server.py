"""queue_server.enqueue is held to the policy the server was started with (it writes its
ceilings at start) and keeps its receipts as long as the server's retention."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

from queue_server.client import enqueue_in, errors
from queue_server.settings import Settings
from tests.helpers.api import live_api, tight_policy
from tests.helpers.roles import Roles

DB = psycopg.Connection[dict[str, object]]


def test_the_function_applies_the_started_servers_attempt_cap_max_queued_and_retention(
    tmp_path: Path, database_url: str, db: DB, roles: Roles
) -> None:
    path = tight_policy(tmp_path / "tight.json", max_acquisitions=3, max_queued=2)
    settings = Settings(
        data_dir=tmp_path, policy=str(path), idempotency_retention=timedelta(hours=30)
    )
    with live_api(settings, database_url, backlog_cap=2) as api:
        # Stored under a looser policy: a cap and a default budget above this one's.
        db.execute("UPDATE tenants SET backlog_cap = 1000, default_max_acquisitions = 5")
        deadline = time.monotonic() + 10
        while db.execute("SELECT policy_version FROM enqueue_envelope").fetchone() != {
            "policy_version": "test.v1"
        }:  # the start is recorded in the background
            assert time.monotonic() < deadline
            time.sleep(0.05)
        app = roles.make("acme")
        with app.connect() as conn:
            with pytest.raises(errors.PolicyEnvelopeError) as above:
                enqueue_in(conn, "acme", "q", {}, key="k", max_acquisitions=4)
            conn.rollback()
            assert "attempt cap of 3 (durable-leased-work/retry)" in above.value.detail
            enqueue_in(conn, "acme", "q", {}, key="k1")
            enqueue_in(conn, "acme", "q", {}, key="k2")
            with pytest.raises(errors.BacklogCapReachedError) as full:
                enqueue_in(conn, "acme", "q", {}, key="k3")
            conn.rollback()
            assert "the cap of 2" in full.value.detail
            first = enqueue_in(conn, "acme", "q", {}, key="k1")
            conn.commit()
        item = api.operator.get(f"/v1/tenants/acme/items/{first}")
        assert item.status_code == 200
        assert item.json()["max_acquisitions"] == 3  # the tenant's default held to the cap
        kept = db.execute(
            "SELECT expires_at - now() > interval '29 hours' AS kept FROM idempotency_receipts"
            " WHERE idempotency_key = 'k1'"
        ).fetchone()
        assert kept == {"kept": True}
