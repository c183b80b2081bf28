"""`queue-server policy verify --server URL`: a live deployment's envelope, probed from an
installed copy (no test files), on a scratch tenant it deletes again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from queue_server.cli.probes import probe_server
from queue_server.services import queues
from queue_server.services.envelope import LeaseEnvelope
from queue_server.settings import Settings
from queue_server.store import transitions
from tests.helpers.api import Api, client_for
from tests.helpers.server import LiveServer
from tests.weakenings import WEAKENINGS, replace_sql

pytestmark = pytest.mark.live  # `queue-server` runs as a subprocess against the URL

BIN = Path(sys.executable).parent / "queue-server"
Db = psycopg.Connection[dict[str, object]]


@pytest.fixture
def settings(settings: Settings) -> Settings:
    # The outbox probe's watcher points at the server's own host (here loopback), which
    # the SSRF policy refuses unless it is allowed.
    return settings.model_copy(update={"transport_allow": ["127.0.0.1"]})


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
    outcomes = {p["name"]: p for p in report["probes"]}
    for name in AUTHORITY + LIMITS:
        assert outcomes[name]["ok"], outcomes[name]
    assert outcomes[OUTBOX]["ok"], outcomes[OUTBOX]
    assert len(report["tenants"]) == 3  # the probes', the backlog cap's and the outbox cap's
    for tenant in report["tenants"]:
        assert api.admin.get(f"/v1/tenants/{tenant}").status_code == 404
        for table in ("work_items", "item_events", "idempotency_receipts", "verification_runs"):
            row = db.execute(f"SELECT count(*) AS n FROM {table} WHERE tenant_id = %s", (tenant,))
            assert row.fetchone() == {"n": 0}, table


ROUTES = ("complete", "batch complete", "triage")
AUTHORITY = tuple(
    f"{route} {what}"
    for route in ROUTES
    for what in (
        "by the holder of an expired lease is refused",
        "with a stale fence is refused",
        "with another worker's name is refused",
        "by the holder with its current fence is accepted",
    )
)
LIMITS = (
    "an enqueue past the tenant's backlog cap is refused",
    "a tenant backlog cap above max-queued",
    "a spend approval above max-approved",
    "a spend approval at max-approved is granted",
)
OUTBOX = "a watcher flooded past the outbox cap keeps at most the cap pending, backlogged"


# Each holder guard of each route, as (its statement, the guard, what replaces it).
_STATEMENT = {"complete": "complete", "batch complete": "complete_many", "triage": "triage_requeue"}
_GUARDS = {
    "fence": ("AND fence = %(fence)s AND", "AND"),
    "holder": (" AND lease_holder = %(worker)s", ""),
    "expiry": ("AND lease_expires_at > statement_timestamp()", "AND true"),
}
_BATCH_GUARDS = {
    "fence": ("AND w.fence = i.fence AND", "AND"),
    "holder": (" AND w.lease_holder = %(worker)s", ""),
    "expiry": ("AND w.lease_expires_at > statement_timestamp()", "AND true"),
}
_PROBE_OF = {
    "fence": "with a stale fence is refused",
    "holder": "with another worker's name is refused",
    "expiry": "by the holder of an expired lease is refused",
}
# A Latin square: every guard of every route is dropped once, one guard per route a run.
_DROPPED = (
    (("complete", "fence"), ("batch complete", "holder"), ("triage", "expiry")),
    (("complete", "holder"), ("batch complete", "expiry"), ("triage", "fence")),
    (("complete", "expiry"), ("batch complete", "fence"), ("triage", "holder")),
)


def _drop_guards(dropped: tuple[tuple[str, str], ...]) -> Callable[[pytest.MonkeyPatch], None]:
    def weaken(mp: pytest.MonkeyPatch) -> None:
        for route, guard in dropped:
            old, new = (_BATCH_GUARDS if route == "batch complete" else _GUARDS)[guard]
            replace_sql(mp, transitions, _STATEMENT[route], old, new)

    return weaken


def _lift_backlog_and_approval_limits(mp: pytest.MonkeyPatch) -> None:
    WEAKENINGS["drop-backlog-cap"].apply(mp)
    mp.setattr(LeaseEnvelope, "backlog", lambda self, value, *loc: None)
    # The spend approval's ceiling is the only envelope check of the queues service.
    mp.setattr(queues, "refuse_above", lambda found: None)


@pytest.mark.parametrize(
    ("weaken", "caught"),
    [
        *(
            pytest.param(
                _drop_guards(dropped),
                {f"{route} {_PROBE_OF[guard]}" for route, guard in dropped},
                id="+".join(f"{route.replace(' ', '-')}-{guard}" for route, guard in dropped),
            )
            for dropped in _DROPPED
        ),
        pytest.param(_lift_backlog_and_approval_limits, set(LIMITS[:3]), id="limits"),
    ],
)
def test_policy_verify_server_fails_the_authority_and_limit_probes_a_weakened_server_lets_through(
    live: LiveServer,
    admin_key: str,
    monkeypatch: pytest.MonkeyPatch,
    weaken: Callable[[pytest.MonkeyPatch], None],
    caught: set[str],
) -> None:
    # Each weakening breaks one route or limit the others do not touch (an item, a queue
    # or a tenant of its own), so each probe named is the one that caught its weakening.
    weaken(monkeypatch)
    report = probe_server(live.url, admin_key)
    failed = {p.name for p in report.probes if not p.ok and not p.skipped}
    assert caught <= failed
    assert not report.passed
    assert report.cleaned_up


def test_policy_verify_server_fails_naming_the_cell_a_server_lets_through(
    live: LiveServer, admin_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server serves v2 but admits any budget: its runtime was weakened (the probes,
    # in this same process, read the policy as served).
    monkeypatch.setattr(LeaseEnvelope, "budget", lambda self, value, *loc: None)
    report = probe_server(live.url, admin_key)
    failed = {p.cell for p in report.probes if not p.ok and not p.skipped}
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
