"""Worker loops for the tests that race real worker processes (multiprocessing's spawn).

A spawned child imports the module of the function it runs; from here that is this module
and httpx, not the test module that started it (its psycopg, pytest and server imports:
about 0.6 s of CPU a child).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from typing import Any

from tests.helpers import web


def ready(_: int) -> bool:
    """Map over twice the pool's size first: every process started before the clock does."""
    time.sleep(0.1)  # long enough that every process of the pool gets one
    return True


def work(url: str, key: str, worker: str, until: float, *, drain: bool = False) -> list[int]:
    """Acquire (no long poll) and complete on tenant acme's queue `q` until `until`; the
    completions' statuses. Held back (nothing leased), ask again after 20 ms; with `drain`,
    stop instead at the third empty answer in a row."""
    statuses = []
    with web.client(base_url=url, headers={"Authorization": f"Bearer {key}"}) as client:
        idle = 0
        while time.time() < until and idle < 3:
            answer = client.post(
                "/v1/tenants/acme/queues/q/leases",
                json={"worker": worker, "lease_ttl": 30, "max_items": 5},
            )
            leases = answer.json()["leases"] if answer.status_code == 200 else []
            if drain:
                idle = 0 if leases else idle + 1
            elif not leases:
                time.sleep(0.02)
            for lease in leases:
                done = client.post(
                    f"/v1/tenants/acme/items/{lease['item_id']}/complete",
                    json={"worker": worker, "fence": lease["fence"]},
                    headers={"Idempotency-Key": uuid.uuid4().hex},
                )
                statuses.append(done.status_code)
    return statuses


def noop_worker(url: str, key: str) -> Any:
    """An SDK `Worker` of queue `q` with a handler that does nothing (for `run_in_processes`)."""
    from queue_server.client import QueueClient, Worker

    return Worker(QueueClient(url, key), "q", lambda job: None, wait=0)


def dead_worker(url: str, key: str) -> Any:
    """No worker: the process is killed by a signal while it makes one."""
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("not reached")
