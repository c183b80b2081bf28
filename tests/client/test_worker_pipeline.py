"""The worker that never waits on itself: batched outcomes, pace-sized prefetch, shutdown.

Counts of requests come from the server's own `/metrics`, as an operator would read them.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg

from queue_server.client import NewItem, Outcome, QueueClient, Result
from tests.helpers.api import Api
from tests.helpers.faces import AnyJob, Face, wait_for_stop
from tests.helpers.items import requests_to

DB = psycopg.Connection[dict[str, object]]


def fill(qs: QueueClient, queue: str, n: int) -> None:
    for start in range(0, n, 500):
        qs.enqueue_batch(queue, [NewItem(payload=i) for i in range(start, min(n, start + 500))])


def test_outcomes_of_concurrent_handlers_go_out_together_and_each_item_completes_once(
    api: Api, db: DB, face: Face
) -> None:
    api.approve("fast", 64)
    with QueueClient(api.url, api.keys["worker"]) as qs:
        fill(qs, "fast", 400)
        results: list[Result] = []
        worker = face.worker(
            api, "fast", lambda job: job.payload * 2, concurrency=16, wait=0,
            on_result=results.append,
        )  # fmt: skip
        assert worker.run(drain=True) == 400
    assert [r.outcome for r in results] == [Outcome.COMPLETED] * 400
    rows = db.execute(
        "SELECT count(*) AS n, count(DISTINCT item_id) AS items FROM item_events"
        " WHERE kind = 'completed'"
    ).fetchone()
    assert rows == {"n": 400, "items": 400}
    assert db.execute("SELECT count(*) AS n FROM work_items WHERE result = to_jsonb(payload::int * 2)").fetchone() == {"n": 400}  # fmt: skip
    # Far fewer requests than items: completions rode together, acquires asked for many.
    completions = requests_to(api, "/v1/tenants/{tenant}/completions")
    acquires = requests_to(api, "/v1/tenants/{tenant}/queues/{queue}/leases")
    singles = requests_to(api, "/v1/tenants/{tenant}/items/{item_id}/complete")
    assert singles == 0
    assert 1 <= completions <= 400 / 4
    assert 1 <= acquires <= 400 / 4


def test_a_fast_handler_prefetches_and_a_slow_one_holds_only_what_runs(
    api: Api, face: Face
) -> None:
    api.approve("fast", 64)
    api.approve("slow", 64)
    with QueueClient(api.url, api.keys["worker"]) as qs:
        fill(qs, "fast", 300)
        for n in range(4):
            qs.enqueue("slow", n)
        held: dict[str, list[int]] = {"fast": [], "slow": []}

        def handler(job: AnyJob) -> None:
            held[job.lease.queue].append(worker.in_flight())
            if job.lease.queue == "slow":
                time.sleep(0.25)

        worker = face.worker(api, "fast", handler, concurrency=1, wait=0)
        assert worker.run(drain=True) == 300
        assert max(held["fast"]) > 2
        worker = face.worker(api, "slow", handler, concurrency=1, wait=0)
        assert worker.run(drain=True) == 4
        # The one running, and at most the previous item's outcome still on its way.
        assert max(held["slow"]) <= 2


def test_stop_gives_back_waiting_leases_and_lets_the_running_one_finish(
    api: Api, db: DB, face: Face
) -> None:
    api.approve("q", 10)
    with QueueClient(api.url, api.keys["worker"]) as qs:
        for n in range(5):
            qs.enqueue("q", n)
        started = threading.Event()
        release = threading.Event()
        told_to_stop: list[bool] = []

        def handler(job: AnyJob) -> str:
            started.set()
            assert release.wait(10)
            told_to_stop.append(job.should_stop())
            return "done"

        results: list[Result] = []
        worker = face.worker(
            api, "q", handler, name="w1", prefetch=4, wait=0, on_result=results.append
        )
        runner = threading.Thread(target=lambda: worker.run(grace=10, handle_signals=False))
        runner.start()
        assert started.wait(10)
        deadline = time.monotonic() + 10
        while worker.in_flight() < 5:
            assert time.monotonic() < deadline, "the worker did not prefetch"
            time.sleep(0.01)
        worker.stop()
        release.set()
        runner.join(20)
        assert not runner.is_alive()
    assert [r.outcome for r in results] == [Outcome.COMPLETED]
    assert told_to_stop == [False]  # stopping the worker leaves a running handler be
    states = db.execute(
        "SELECT state, count(*) AS n FROM work_items GROUP BY state ORDER BY state"
    ).fetchall()
    assert states == [{"state": "ready", "n": 4}, {"state": "completed", "n": 1}] or states == [
        {"state": "completed", "n": 1},
        {"state": "ready", "n": 4},
    ]
    reasons = db.execute(
        "SELECT data->>'reason' AS reason FROM item_events WHERE kind = 'requeued'"
    ).fetchall()
    assert reasons == [{"reason": "worker stopping"}] * 4


def test_past_its_grace_a_running_handler_is_told_to_stop_and_run_waits_for_its_outcome(
    api: Api, face: Face
) -> None:
    with QueueClient(api.url, api.keys["worker"]) as qs:
        item = qs.enqueue("q", "long")
        started = threading.Event()
        finished = threading.Event()
        told: list[float] = []

        def handler(job: AnyJob) -> str:
            started.set()
            if wait_for_stop(job, 5):
                told.append(time.monotonic())
            time.sleep(0.2)  # winding down after being told
            finished.set()
            return "cut short"

        results: list[Result] = []
        returned: list[bool] = []
        worker = face.worker(api, "q", handler, name="w1", wait=0, on_result=results.append)

        def work() -> None:
            worker.run(grace=0.4, handle_signals=False)
            returned.append(finished.is_set())

        runner = threading.Thread(target=work)
        runner.start()
        assert started.wait(10)
        stopped_at = time.monotonic()
        worker.stop()
        runner.join(10)
        assert not runner.is_alive()
        assert len(told) == 1, "the handler was never told to stop"
        assert told[0] - stopped_at >= 0.3  # not before its grace ran out
        assert returned == [True]  # run returned only once the handler had
        assert [r.outcome for r in results] == [Outcome.COMPLETED]
        done = qs.get_item(item.item_id)
        assert (done.state, done.result) == ("completed", "cut short")


def test_a_result_that_is_not_json_fails_its_item_alone(api: Api, face: Face) -> None:
    api.approve("q", 10)
    with QueueClient(api.url, api.keys["worker"]) as qs:
        for n in range(6):
            qs.enqueue("q", n)

        def handler(job: AnyJob) -> Any:
            return float("nan") if job.payload == 3 else {"n": job.payload}

        results: list[Result] = []
        worker = face.worker(api, "q", handler, concurrency=6, wait=0, on_result=results.append)
        assert worker.run(max_items=6) == 6
        outcomes = sorted(r.outcome.value for r in results)
        assert outcomes == ["completed"] * 5 + ["triaged"]
        (failed,) = [r for r in results if r.outcome is Outcome.TRIAGED]
        item = qs.get_item(failed.item_id)
        assert (item.state, item.payload) == ("ready", 3)
        assert item.last_failure["class"] == "TypeError"
        assert "JSON" in item.last_failure["message"]


def test_a_result_the_server_refuses_fails_its_item_alone_not_its_batch(
    api: Api, face: Face
) -> None:
    api.approve("q", 10)
    with QueueClient(api.url, api.keys["worker"]) as qs:
        for n in range(3):
            qs.enqueue("q", n)
        gate = threading.Barrier(3)

        def handler(job: AnyJob) -> str:
            gate.wait(10)
            # One holds a NUL, which JSON allows and the server cannot store (422).
            return "a\x00b" if job.payload == 1 else f"done {job.payload}"

        results: list[Result] = []
        # The outbox waits for all three results (a batch of 3) and sends them in one request.
        options = {"linger": 30, "max_batch": 3, "on_result": results.append}
        worker = face.worker(api, "q", handler, concurrency=3, wait=0, **options)
        assert worker.run(max_items=3) == 3
        outcomes = sorted(r.outcome.value for r in results)
        assert outcomes == ["completed", "completed", "unsubmitted"]
        (refused,) = [r for r in results if r.outcome is Outcome.UNSUBMITTED]
        assert qs.get_item(refused.item_id).payload == 1
    # The refused batch was sent again entry by entry.
    assert requests_to(api, "/v1/tenants/{tenant}/items/{item_id}/complete") == 3


def test_a_refused_entry_in_a_batch_is_reported_lost_and_the_others_complete(
    api: Api, db: DB, face: Face
) -> None:
    api.approve("q", 10)
    with QueueClient(api.url, api.keys["worker"]) as qs:
        for n in range(3):
            qs.enqueue("q", n)
        gate = threading.Barrier(3)

        def handler(job: AnyJob) -> int:
            gate.wait(10)
            if job.payload == 1:
                # Another worker takes this item over while we still work on it.
                db.execute(
                    "UPDATE work_items SET lease_expires_at = now() - interval '1 second'"
                    " WHERE item_id = %s",
                    (job.item_id,),
                )
                (taken,) = qs.acquire("q", worker="other", max_items=1)
                assert taken.fence == job.fence + 1
            return int(job.payload)

        results: list[Result] = []
        worker = face.worker(api, "q", handler, concurrency=3, wait=0, on_result=results.append)
        assert worker.run(max_items=3) == 3
    assert sorted(r.outcome.value for r in results) == ["completed", "completed", "lost"]
    (lost,) = [r for r in results if r.outcome is Outcome.LOST]
    assert "refused" in lost.detail
    rows = db.execute(
        "SELECT item_id::text, payload, state, lease_holder FROM work_items"
    ).fetchall()
    by_payload = {row["payload"]: row for row in rows}
    assert by_payload[1]["item_id"] == lost.item_id
    assert (by_payload[1]["state"], by_payload[1]["lease_holder"]) == ("leased", "other")
    assert by_payload[0]["state"] == by_payload[2]["state"] == "completed"
