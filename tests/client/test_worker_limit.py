"""At start the worker says when the queue leases fewer items at a time than its own
`concurrency`, and it follows the queue's limit as it changes, on both faces."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from queue_server.client import QueueClient
from tests.helpers.api import Api
from tests.helpers.faces import AnyJob, Face


def handle(job: AnyJob) -> Any:
    return job.payload


def limit_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "at a time" in r.getMessage()
    ]


FELL_FROM_3_TO_1 = (
    "queue q now leases at most 1 at a time (was 3): its spend approval lapsed or was"
    " revoked, or an operator lowered its concurrency (queue-server spend show q)"
)


def fallen(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The worker's warnings that its queue's limit fell."""
    return [r.getMessage() for r in caplog.records if "now leases at most" in r.getMessage()]


def test_a_worker_above_the_queues_limit_warns_once_at_start(
    api: Api, face: Face, caplog: pytest.LogCaptureFixture
) -> None:
    with QueueClient(api.url, api.keys["worker"], tenant=api.tenant) as qs:
        for n in range(3):
            qs.enqueue("q", n)
    worker = face.worker(api, "q", handle, name="w1", concurrency=8, wait=0)
    with caplog.at_level(logging.WARNING):
        assert worker.run(drain=True) == 3
    assert limit_warnings(caplog) == [
        "queue q leases at most 1 at a time (durable-leased-work/concurrency; a spend"
        " approval raises it); this worker's concurrency is 8"
    ]


def test_a_worker_within_the_queues_limit_says_nothing(
    api: Api, face: Face, caplog: pytest.LogCaptureFixture
) -> None:
    api.approve("q", 8)
    with QueueClient(api.url, api.keys["worker"], tenant=api.tenant) as qs:
        qs.enqueue("q", 1)
    worker = face.worker(api, "q", handle, name="w1", concurrency=8, wait=0)
    with caplog.at_level(logging.WARNING):
        assert worker.run(drain=True) == 1
    assert limit_warnings(caplog) == []


def test_an_approval_made_while_the_worker_runs_raises_its_slots_at_the_next_limit_read(
    api: Api, face: Face
) -> None:
    with QueueClient(api.url, api.keys["worker"], tenant=api.tenant) as qs:
        for n in range(5):
            qs.enqueue("q", n)
    lock = threading.Lock()
    running = [0]
    peak = [0]
    first = threading.Event()

    def handler(job: AnyJob) -> Any:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        first.set()
        time.sleep(0.25)
        with lock:
            running[0] -= 1
        return job.payload

    worker = face.worker(api, "q", handler, name="w1", concurrency=3, wait=0, limit_refresh=0.1)
    runner = threading.Thread(target=lambda: worker.run(drain=True, handle_signals=False))
    runner.start()
    assert first.wait(10)
    assert peak[0] == 1  # the queue's own limit, until an operator approves more
    api.approve("q", 3)
    runner.join(20)
    assert not runner.is_alive()
    assert peak[0] == 3


def test_a_worker_warns_once_of_the_approval_behind_its_queues_limit_about_to_expire(
    api: Api, face: Face, caplog: pytest.LogCaptureFixture
) -> None:
    # Two days: within no window of a day; an hour: within the server's (a day by default).
    api.approve("q", 4, days=2)
    with QueueClient(api.url, api.keys["worker"], tenant=api.tenant) as qs:
        for n in range(6):
            qs.enqueue("q", n)
    worker = face.worker(api, "q", handle, name="w1", concurrency=4, wait=0, limit_refresh=0)
    with caplog.at_level(logging.WARNING):
        assert worker.run(drain=True, max_items=2) == 2
    assert [r for r in caplog.records if "expires" in r.getMessage()] == []
    api.approve("q", 6, days=1 / 24)
    worker = face.worker(api, "q", handle, name="w2", concurrency=4, wait=0, limit_refresh=0)
    with caplog.at_level(logging.WARNING):
        assert worker.run(drain=True) == 4
    warned = [r.getMessage() for r in caplog.records if "expires" in r.getMessage()]
    assert len(warned) == 1, warned
    assert warned[0].startswith("The spend approval raising q's limit to 6 expires at")
    assert "spend approve q" in warned[0]


def test_a_worker_says_when_its_queues_limit_falls_while_it_runs(
    api: Api, face: Face, caplog: pytest.LogCaptureFixture
) -> None:
    approval = api.approve("q", 3)
    with QueueClient(api.url, api.keys["worker"], tenant=api.tenant) as qs:
        for n in range(8):
            qs.enqueue("q", n)
    first = threading.Event()

    def handler(job: AnyJob) -> Any:
        first.set()
        time.sleep(0.2)
        return job.payload

    worker = face.worker(api, "q", handler, name="w1", concurrency=3, wait=0, limit_refresh=0.1)
    with caplog.at_level(logging.WARNING):
        runner = threading.Thread(target=lambda: worker.run(drain=True, handle_signals=False))
        runner.start()
        assert first.wait(10)
        revoked = api.operator.delete(
            f"/v1/tenants/acme/queues/q/spend-approvals/{approval['approval_id']}",
            headers={"Idempotency-Key": "revoke-1"},
        )
        assert revoked.status_code == 200, revoked.text
        runner.join(30)
        assert not runner.is_alive()
    assert fallen(caplog) == [FELL_FROM_3_TO_1]


def test_a_limit_that_falls_but_stays_at_the_workers_concurrency_is_not_reported(
    api: Api, face: Face, caplog: pytest.LogCaptureFixture
) -> None:
    # The queue's limit falls 6 -> 3 -> 1 while a worker of concurrency 2 runs: only the
    # second fall slows it, and only that one is told.
    api.approve("q", 6)
    with QueueClient(api.url, api.keys["worker"], tenant=api.tenant) as qs:
        for n in range(4):
            qs.enqueue("q", n)
    started = threading.Semaphore(0)
    go = threading.Event()

    def handler(job: AnyJob) -> Any:
        started.release()
        assert go.wait(30)
        return job.payload

    def lower_to(concurrency: int) -> None:
        answer = api.operator.put(
            "/v1/tenants/acme/queues/q/concurrency",
            json={"concurrency": concurrency, "reason": "cost"},
            headers={"Idempotency-Key": f"lower-{concurrency}"},
        )
        assert answer.status_code == 200, answer.text
        time.sleep(1.0)  # ten of the worker's limit reads (limit_refresh 0.1 s) and more

    worker = face.worker(api, "q", handler, name="w1", concurrency=2, wait=0, limit_refresh=0.1)
    with caplog.at_level(logging.WARNING):
        runner = threading.Thread(target=lambda: worker.run(drain=True, handle_signals=False))
        runner.start()
        try:
            assert started.acquire(timeout=10)
            assert started.acquire(timeout=10)
            lower_to(3)
            lower_to(1)
        finally:
            go.set()
            runner.join(30)
        assert not runner.is_alive()
    assert fallen(caplog) == [FELL_FROM_3_TO_1]
