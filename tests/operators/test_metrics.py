"""/metrics: a key is needed (an operator reads its own tenant), per queue figures with zero
as zero, and several worker processes added up, also on --metrics-listen."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
import psycopg
import pytest

from queue_server.settings import Settings
from tests.helpers import web
from tests.helpers.api import Api, setup_tenant
from tests.helpers.items import dead_letter_of, quarantine, replay, sample, triage_lease
from tests.helpers.server import make_admin_key

Db = psycopg.Connection[dict[str, object]]
BIN = Path(sys.executable).parent / "queue-server"


def _key() -> dict[str, str]:
    return {"Idempotency-Key": uuid.uuid4().hex}


def _series(text: str) -> dict[str, str]:
    """Each sample line's series and value; the process's own figures (CPU, memory...) and
    ages (which grow with the clock) aside."""
    return dict(
        line.rsplit(" ", 1)
        for line in text.splitlines()
        if line and not line.startswith(("#", "process_", "python_")) and "_age_seconds" not in line
    )


def test_metrics_need_an_operator_or_admin_key_and_show_only_the_own_tenant(api: Api) -> None:
    other = setup_tenant(api.url, api.admin, "globex")
    api.enqueue("q", 1)
    other.enqueue("secret-queue", 2)

    anonymous = api.client(None).get("/metrics")
    assert anonymous.status_code == 401
    assert "acme" not in anonymous.text
    assert "globex" not in anonymous.text
    assert api.worker.get("/metrics").status_code == 403

    mine = api.operator.get("/metrics")
    assert mine.status_code == 200
    assert mine.headers["content-type"].startswith("text/plain")
    assert sample(mine.text, "queue_server_queue_items", tenant="acme", queue="q", state="ready")
    assert "globex" not in mine.text
    assert "secret-queue" not in mine.text
    # The server's health is shared: its series, not only its name.
    assert sample(mine.text, "queue_server_listener_connected") is not None

    # Another tenant's traffic leaves an operator's scrape as it was (the figures are sampled
    # from the database; route counters and latency count everyone's requests: not shown).
    before = _series(api.operator.get("/metrics").text)
    for _ in range(3):
        other.enqueue("secret-queue", 1)
        assert other.operator.get("/v1/tenants/globex/queues").status_code == 200
    assert _series(api.operator.get("/metrics").text) == before
    assert "queue_server_requests_total" in api.admin.get("/metrics").text
    everyone = api.admin.get("/metrics").text
    assert (
        sample(
            everyone,
            "queue_server_queue_items",
            tenant="globex",
            queue="secret-queue",
            state="ready",
        )
        == 4  # one, and the three enqueued above
    )


def test_metrics_show_each_queue_with_zero_as_zero(api: Api) -> None:
    api.approve("q", 10)
    for i in range(5):
        api.enqueue("q", i, max_acquisitions=1)
    leases = api.acquire("q", max_items=3)
    api.holder("complete", leases[0]["item_id"], worker="w1", fence=leases[0]["fence"])
    triage_lease(
        api, leases[1], "quarantine", {"class": "Boom", "message": "m", "transient": False}
    )
    api.operator.post("/v1/tenants/acme/queues/idle/pause", json={}, headers=_key())
    api.holder("complete", leases[2]["item_id"], worker="w1", fence=leases[2]["fence"])
    # A failure requeued to be tried again is a failure, not a quarantine.
    api.enqueue("r", "again")
    (again,) = api.acquire("r")
    triage_lease(api, again, "requeue", {"class": "Flaky", "message": "m", "transient": True})

    text = api.admin.get("/metrics").text
    q = {"tenant": "acme", "queue": "q"}
    assert {
        state: sample(text, "queue_server_queue_items", **q, state=state)
        for state in ("ready", "leased", "completed", "quarantined", "cancelled")
    } == {"ready": 2, "leased": 0, "completed": 2, "quarantined": 1, "cancelled": 0}
    assert sample(text, "queue_server_queue_completions_total", **q) == 2
    assert sample(text, "queue_server_queue_failures_total", **q) == 1
    assert sample(text, "queue_server_queue_quarantines_total", **q) == 1
    assert sample(text, "queue_server_queue_open_dead_letters", **q) == 1
    assert sample(text, "queue_server_queue_active_leases", **q) == 0
    assert (sample(text, "queue_server_queue_oldest_ready_age_seconds", **q) or 0) > 0
    assert sample(text, "queue_server_queue_oldest_lease_age_seconds", **q) == 0
    assert sample(text, "queue_server_queue_paused", **q) == 0
    # A paused queue without any item is reported, every state at zero.
    idle = {"tenant": "acme", "queue": "idle"}
    assert sample(text, "queue_server_queue_paused", **idle) == 1
    assert sample(text, "queue_server_queue_items", **idle, state="ready") == 0
    assert sample(text, "queue_server_items", tenant="acme", state="cancelled") == 0
    # The tenant's figure adds up its queues: two ready on q, one on r.
    assert sample(text, "queue_server_items", tenant="acme", state="ready") == 3
    r = {"tenant": "acme", "queue": "r"}
    assert sample(text, "queue_server_queue_failures_total", **r) == 1
    assert sample(text, "queue_server_queue_quarantines_total", **r) == 0
    # Latency by route, as histograms.
    assert (
        'queue_server_request_seconds_bucket{le="0.1",route="/v1/tenants/{tenant}/items/{item_id}/complete"}'
        in text
    )


def test_metrics_count_only_the_dead_letters_not_yet_resolved(api: Api) -> None:
    replayed = quarantine(api, "q", payload="first")
    quarantine(api, "q", payload="second")
    answer = replay(api, dead_letter_of(api, replayed))
    assert answer.status_code == 200, answer.text
    q = {"tenant": "acme", "queue": "q"}
    for key in (api.admin, api.operator):
        assert sample(key.get("/metrics").text, "queue_server_queue_open_dead_letters", **q) == 1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_every_worker_process_is_added_up_on_both_ports(
    tmp_path: Path, settings: Settings, database_url: str, workers: int
) -> None:
    """One worker serves in `serve`'s own process, which imported prometheus_client before
    the listener's directory was set; two run in processes of their own."""
    admin_key = make_admin_key(settings, database_url)
    port, metrics_port = _free_port(), _free_port()
    env = {**os.environ, "QUEUE_SERVER_DATABASE_URL": database_url}
    proc = subprocess.Popen(
        [
            str(BIN),
            "serve",
            "--port",
            str(port),
            "--workers",
            str(workers),
            "--metrics-listen",
            f"127.0.0.1:{metrics_port}",
            "--data-dir",
            str(tmp_path),
            "--log-level",
            "warning",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            try:
                if web.get(f"{base}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not become ready"
            time.sleep(0.2)
        admin = {"Authorization": f"Bearer {admin_key}"}
        assert web.put(f"{base}/v1/tenants/acme", json={"backlog_cap": 100}, headers=admin)
        worker = web.post(f"{base}/v1/tenants/acme/keys", json={"role": "worker"}, headers=admin)
        auth = {"Authorization": f"Bearer {worker.json()['secret']}"}
        sent = 24
        for i in range(sent):
            # A connection each: the two processes share the listening socket.
            created = web.post(
                f"{base}/v1/tenants/acme/queues/q/items",
                json={"payload": i},
                headers={**auth, **_key()},
            )
            assert created.status_code == 201
        route = {"method": "POST", "route": "/v1/tenants/{tenant}/queues/{queue}/items"}
        listener = f"http://127.0.0.1:{metrics_port}/metrics"
        # Each process's LISTEN session is up, as the listener shows before any scrape of the
        # API's own /metrics (the gauge follows the session, not the scrapes).
        deadline = time.monotonic() + 10
        while True:
            connected = [
                line.rsplit(" ", 1)[1]
                for line in web.get(listener).text.splitlines()
                if line.startswith("queue_server_listener_connected{")
            ]
            if len(connected) == workers and set(connected) == {"1.0"}:
                break
            assert time.monotonic() < deadline, f"listener sessions: {connected}"
            time.sleep(0.2)
        # A request is counted just after its answer is sent: let the last one land.
        deadline = time.monotonic() + 10
        while (
            sample(web.get(listener).text, "queue_server_requests_total", **route, status="201")
            != sent
            and time.monotonic() < deadline
        ):
            time.sleep(0.1)
        for _ in range(4):
            on_listener = web.get(listener).text
            assert sample(on_listener, "queue_server_requests_total", **route, status="201") == sent
            assert (
                sample(
                    on_listener, "queue_server_queue_items", tenant="acme", queue="q", state="ready"
                )
                == sent
            )
            on_api = web.get(f"{base}/metrics", headers=admin).text
            assert sample(on_api, "queue_server_requests_total", **route, status="201") == sent
        # The database's health is the admin's view, and the listener's.
        for scrape in (on_listener, on_api):
            holders = sample(scrape, "queue_server_database_horizon_holders", holder="snapshot")
            assert holders is not None
            assert sample(scrape, "queue_server_table_live_tuples", table="work_items") is not None
            # The objectives the alert rules read (docs/slos.md), from the server's settings.
            assert (
                sample(scrape, "queue_server_slo_objective", objective="api_availability") == 0.999
            )
        assert web.get(f"{base}/metrics").status_code == 401
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert "Traceback" not in out
