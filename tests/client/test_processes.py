"""`run_in_processes`: worker processes spawned fresh, each with its own client and worker,
drain a queue together with every item handled once; a SIGTERM to the parent stops them
all gracefully."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest

from queue_server.client import Job, QueueClient, Worker
from queue_server.client.processes import run_in_processes
from tests.helpers import worker_processes
from tests.helpers.api import Api

# The worker processes call the server: it listens on a socket.
pytestmark = pytest.mark.live

Db = psycopg.Connection[dict[str, Any]]
ITEMS = 400


def _slow(job: Job) -> dict[str, int]:
    time.sleep(0.02)  # long enough that one process cannot drain the queue alone
    return {"pid": os.getpid()}


def make_worker(url: str, key: str) -> Worker:
    return Worker(QueueClient(url, key), "q", _slow, concurrency=4, wait=0.5)


def _fill(api: Api, n: int) -> None:
    for start in range(0, n, 100):
        response = api.worker.post(
            f"/v1/tenants/{api.tenant}/queues/q/items:batch",
            json={"items": [{"payload": i} for i in range(start, min(n, start + 100))]},
            headers={"Idempotency-Key": f"fill-{start}"},
        )
        assert response.status_code == 201, response.text


def test_two_worker_processes_drain_a_queue_and_handle_each_item_once(api: Api, db: Db) -> None:
    api.approve("q", 100)
    _fill(api, ITEMS)
    ran = run_in_processes(
        partial(make_worker, api.url, api.keys["worker"]), processes=2, drain=True
    )
    assert len(ran) == 2
    assert sum(ran) == ITEMS
    assert min(ran) > 0, ran  # both took a share
    rows = db.execute(
        "SELECT state, count(*) AS n, count(DISTINCT result->>'pid') AS pids FROM work_items"
        " GROUP BY state"
    ).fetchall()
    assert rows == [{"state": "completed", "n": ITEMS, "pids": 2}]
    completions = db.execute(
        "SELECT count(*) AS n FROM item_events WHERE kind = 'completed'"
    ).fetchone()
    assert completions == {"n": ITEMS}


SCRIPT = """
import json, sys
from functools import partial
from queue_server.client.processes import run_in_processes
from tests.client.test_processes import make_worker
print(json.dumps(run_in_processes(partial(make_worker, sys.argv[1], sys.argv[2]), processes=2)))
"""


def test_a_sigterm_to_the_parent_stops_every_worker_process_gracefully(api: Api, db: Db) -> None:
    api.approve("q", 100)
    _fill(api, ITEMS)
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, api.url, api.keys["worker"]],
        cwd=root,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(root / "client")])},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            done = db.execute("SELECT count(*) AS n FROM work_items WHERE state = 'completed'")
            if (done.fetchone() or {}).get("n", 0) >= 20:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    ran = json.loads(out)
    assert len(ran) == 2
    # Stopped before the queue ran dry, and nothing left leased: waiting leases given back.
    states = {
        row["state"]: row["n"]
        for row in db.execute("SELECT state, count(*) AS n FROM work_items GROUP BY state")
    }
    assert 20 <= states["completed"] < ITEMS, states
    assert "leased" not in states, states
    assert states["completed"] == sum(ran)


def test_one_process_per_cpu_by_default_never_none_and_signals_handed_back(api: Api) -> None:
    make = partial(worker_processes.noop_worker, api.url, api.keys["worker"])
    with pytest.raises(ValueError, match="processes must be at least 1"):
        run_in_processes(make, processes=0)
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    # Nothing due: each process's drain ends at once, having run nothing.
    assert run_in_processes(make, drain=True) == [0] * (os.cpu_count() or 1)
    # The parent's own handlers are its own again once its workers are done.
    assert {s: signal.getsignal(s) for s in before} == before


def test_a_worker_process_that_dies_of_a_signal_is_named_as_failed(api: Api) -> None:
    make = partial(worker_processes.dead_worker, api.url, api.keys["worker"])
    with pytest.raises(RuntimeError) as failed:
        run_in_processes(make, processes=2)
    assert str(failed.value) == (
        "worker processes failed: queue-server-worker-0, queue-server-worker-1 (see their logs)"
    )
