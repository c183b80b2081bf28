"""At start the worker says when the queue leases fewer items at a time than its own
`concurrency`, on both faces."""

from __future__ import annotations

import logging
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
