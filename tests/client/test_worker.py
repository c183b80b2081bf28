"""The worker helper, on both faces: heartbeats, complete, requeue, triage, and a lost lease
that stops the handler."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from queue_server.client import (
    Outcome,
    Quarantine,
    QueueClient,
    Requeue,
    Result,
    TransientError,
)
from tests.helpers.api import Api
from tests.helpers.faces import AnyJob, Face, wait_for_stop
from tests.helpers.items import requests_to

DB = psycopg.Connection[dict[str, object]]


def client(api: Api) -> QueueClient:
    return QueueClient(api.url, api.keys["worker"], tenant=api.tenant)


def kinds(qs: QueueClient, item_id: str) -> list[str]:
    return [e.kind for e in qs.ledger(item_id)]


def test_handlers_complete_with_their_results_and_one_request_extends_every_lease(
    api: Api, face: Face
) -> None:
    api.approve("q", 3)
    with client(api) as qs:
        items = [qs.enqueue("q", {"n": n}) for n in range(3)]

        def handler(job: AnyJob) -> Any:
            time.sleep(2.4)  # several heartbeat intervals of a 2 s lease
            return {"double": job.payload["n"] * 2}

        results: list[Result] = []
        worker = face.worker(
            api, "q", handler, name="w1", lease_ttl=2, heartbeat_fraction=0.3, concurrency=3,
            wait=0, on_result=results.append,
        )  # fmt: skip
        assert worker.run(max_items=3) == 3
        assert [r.outcome for r in results] == [Outcome.COMPLETED] * 3
        beats = 0
        for n, item in enumerate(items):
            done = qs.get_item(item.item_id)
            assert (done.state, done.result) == ("completed", {"double": n * 2})
            beat = kinds(qs, item.item_id).count("heartbeat")
            # One about every 0.6 s while the handler runs: not fewer, and not many more.
            assert 2 <= beat <= 6, beat
            beats += beat
    # The three leases beat together: fewer requests than beats, none of them single.
    assert requests_to(api, "/v1/tenants/{tenant}/items/{item_id}/heartbeat") == 0
    assert 2 <= requests_to(api, "/v1/tenants/{tenant}/leases:heartbeat") <= beats / 2


def test_a_requeue_gives_the_item_back_untouched_due_after_its_delay(api: Api, face: Face) -> None:
    with client(api) as qs:
        item = qs.enqueue("q", "later")
        calls: list[str] = []

        def handler(job: AnyJob) -> Any:
            calls.append(job.payload)
            raise Requeue("not yet", delay=30)

        worker = face.worker(api, "q", handler, name="w1", lease_ttl=5)
        (lease,) = qs.acquire("q", worker="w1", lease_ttl=5)
        result = worker.process(lease)
        assert (result.outcome, result.item_id) == (Outcome.REQUEUED, item.item_id)
        back = qs.get_item(item.item_id)
        assert (back.state, back.last_failure, back.lease_holder) == ("ready", None, None)
        assert (back.available_at - back.updated_at).total_seconds() == pytest.approx(30, abs=1)
        # No failure is recorded, and nothing ran it again meanwhile.
        assert kinds(qs, item.item_id) == ["enqueued", "acquired", "requeued"]
        assert calls == ["later"]
        assert qs.acquire("q", worker="w2") == []


def test_failures_are_triaged_back_to_the_queue_or_into_quarantine(api: Api, face: Face) -> None:
    with client(api) as qs:
        transient = qs.enqueue("t", "t")
        broken = qs.enqueue("b", "b")
        poisoned = qs.enqueue("p", "p")

        calls: list[str] = []

        def handler(job: AnyJob) -> Any:
            calls.append(job.payload)
            if job.payload == "t":
                raise TransientError("try later")
            if job.payload == "b":
                raise ValueError("bad input")
            raise Quarantine("never works")

        results: list[Result] = []
        for queue in ("t", "b", "p"):
            worker = face.worker(
                api, queue, handler, name="w1", lease_ttl=5, on_result=results.append
            )
            assert worker.run(max_items=1) == 1
        assert [r.outcome for r in results] == [
            Outcome.TRIAGED,
            Outcome.TRIAGED,
            Outcome.QUARANTINED,
        ]
        first = qs.get_item(transient.item_id)
        assert first.state == "ready"
        failure = dict(first.last_failure or {})
        trace = failure.pop("traceback")
        assert failure == {"class": "TransientError", "message": "try later", "transient": True}
        assert 'raise TransientError("try later")' in trace
        # The handler's traceback, as Python prints it: where it raised, what it raised.
        broke = qs.get_item(broken.item_id).last_failure or {}
        assert broke["class"] == "ValueError"
        assert broke["traceback"].startswith("Traceback (most recent call last):")
        # From the handler's side on: none of the worker's frames that called it.
        assert "client/queue_server/client/" not in broke["traceback"], broke["traceback"]
        assert ', in handler\n    raise ValueError("bad input")' in broke["traceback"]
        assert broke["traceback"].rstrip().endswith("ValueError: bad input")
        (triaged,) = [e for e in qs.ledger(broken.item_id) if e.kind == "triaged"]
        assert triaged.data["failure"]["traceback"] == broke["traceback"]
        assert qs.get_item(poisoned.item_id).state == "quarantined"
        # A failure is not retried in the worker: it goes back through the queue, each item
        # leased once and its handler run once.
        assert calls == ["t", "b", "p"]
        for item in (transient, broken, poisoned):
            assert kinds(qs, item.item_id).count("acquired") == 1


def test_a_lost_lease_stops_the_handler_and_its_result_is_not_submitted(
    api: Api, db: DB, face: Face
) -> None:
    with client(api) as qs:
        item = qs.enqueue("q", "slow")
        started = threading.Event()
        told_to_stop = threading.Event()

        def handler(job: AnyJob) -> Any:
            started.set()
            if wait_for_stop(job, 10):
                told_to_stop.set()
            return "late result"

        worker = face.worker(api, "q", handler, name="w1", lease_ttl=2, heartbeat_fraction=0.25)
        (lease,) = qs.acquire("q", worker="w1", lease_ttl=2)
        outcome: list[Any] = []
        runner = threading.Thread(target=lambda: outcome.append(worker.process(lease)))
        runner.start()
        assert started.wait(5)
        # The lease runs out (as if the worker had stalled) and another worker takes over.
        db.execute(
            "UPDATE work_items SET lease_expires_at = now() - interval '1 second'"
            " WHERE item_id = %s",
            (item.item_id,),
        )
        (taken,) = qs.acquire("q", worker="w2", lease_ttl=30)
        assert taken.fence == lease.fence + 1
        runner.join(10)
        assert told_to_stop.is_set()
        assert outcome[0].outcome is Outcome.LOST
        assert "nothing was submitted" in outcome[0].detail
        now = qs.get_item(item.item_id)
        assert (now.state, now.lease_holder, now.result) == ("leased", "w2", None)
        assert "completed" not in kinds(qs, item.item_id)
    # The late result was not even offered: no completion request reached the server.
    assert requests_to(api, "/v1/tenants/{tenant}/completions") == 0
    assert requests_to(api, "/v1/tenants/{tenant}/items/{item_id}/complete") == 0


def test_concurrency_never_exceeds_the_queue_limit(api: Api, face: Face) -> None:
    api.approve("wide", 2)
    with client(api) as qs:
        for n in range(6):
            qs.enqueue("wide", n)
        lock = threading.Lock()
        running = [0]
        peak = [0]

        def handler(job: AnyJob) -> Any:
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            time.sleep(0.3)
            with lock:
                running[0] -= 1
            return job.payload

        worker = face.worker(api, "wide", handler, name="w1", lease_ttl=5, concurrency=5, wait=0)
        assert worker.run(drain=True) == 6
        assert peak[0] == 2
        assert qs.status().backlog == 0
