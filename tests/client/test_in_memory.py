"""The SDK's in-memory server (`queue_server.client.testing`): the real `Worker`, `AsyncWorker`
and `QueueClient` on it, on a clock the test moves, with no sleeps; and one scenario run on it
and on a live server, whose observations must be the same."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

import httpx
import pytest

from queue_server.client import (
    AsyncJob,
    AsyncWorker,
    Job,
    NewItem,
    Outcome,
    Quarantine,
    QueueClient,
    Requeue,
    Result,
    TransientError,
    Worker,
    errors,
)
from queue_server.client.models import Item
from queue_server.client.testing import URL, InMemoryServer
from queue_server.policy import runtime_policy
from tests.helpers.api import Api


def work(qs: QueueClient, handler: Callable[[Job], Any], **options: Any) -> int:
    """One run of a new worker on queue "q" (a worker runs once): `drain` or `max_items`."""
    run = {k: options.pop(k) for k in ("drain", "max_items") if k in options}
    return Worker(qs, "q", handler, name="w1", **options).run(handle_signals=False, **run)


def failure_of(item: Item) -> dict[str, Any]:
    """The item's last failure without its traceback."""
    failure = dict(item.last_failure or {})
    failure.pop("traceback", None)
    return failure


def test_a_worker_takes_due_items_highest_priority_first_and_a_delayed_one_on_time() -> None:
    server = InMemoryServer()
    with server.client() as qs:
        low = qs.enqueue("q", "low")
        *_, later = qs.enqueue_batch(
            "q",
            [
                NewItem(payload="high", priority=5),
                NewItem(payload="mid", priority=1),
                NewItem(payload="later", priority=9, delay=60),
            ],
        )
        seen: list[tuple[str, int, int]] = []

        def handler(job: Job) -> str:
            seen.append((job.payload, job.fence, job.acquisition_count))
            return str(job.payload).upper()

        results: list[Result] = []
        assert work(qs, handler, drain=True, on_result=results.append) == 3
        assert seen == [("high", 1, 1), ("mid", 1, 1), ("low", 1, 1)]
        assert [r.outcome for r in results] == [Outcome.COMPLETED] * 3
        done = qs.get_item(low.item_id)
        assert (done.state, done.result, done.lease_holder, done.fence) == (
            "completed", "LOW", None, 1,
        )  # fmt: skip
        assert qs.get_item(later.item_id).state == "ready"
        server.clock.advance(59.9)
        assert work(qs, handler, drain=True) == 0
        server.clock.advance(0.1)
        assert work(qs, handler, drain=True) == 1
        assert seen[-1] == ("later", 1, 1)
        assert [i.state for i in server.items("q")] == ["completed"] * 4


def test_a_failed_item_comes_back_after_its_backoff_until_its_last_failure_dead_letters_it() -> (
    None
):
    server = InMemoryServer()
    with server.client() as qs:
        item = qs.enqueue("q", {"n": 1}, max_acquisitions=3)
        attempts: list[int] = []

        def handler(job: Job) -> None:
            attempts.append(job.acquisition_count)
            raise ValueError(f"bad input {job.acquisition_count}")

        results: list[Result] = []
        for backoff in (1, 2):  # the queue's backoff: 1 s, then 2 s
            assert work(qs, handler, max_items=1, on_result=results.append) == 1
            back = qs.get_item(item.item_id)
            assert (back.state, back.lease_holder) == ("ready", None)
            assert (back.available_at - back.updated_at).total_seconds() == backoff
            assert failure_of(back) == {
                "class": "ValueError", "message": f"bad input {len(attempts)}", "transient": False,
            }  # fmt: skip
            assert 'raise ValueError(f"bad input' in back.last_failure["traceback"]
            assert qs.acquire("q", worker="peek") == []  # not due before its backoff
            server.clock.advance(backoff)
        assert work(qs, handler, max_items=1, on_result=results.append) == 1
        assert attempts == [1, 2, 3]
        assert [r.outcome for r in results] == [Outcome.TRIAGED] * 3
        dead = qs.get_item(item.item_id)
        assert (dead.state, dead.acquisition_count, dead.fence) == ("quarantined", 3, 3)
        assert failure_of(dead)["message"] == "bad input 3"
        (letter,) = qs.list_dead_letters(queue="q").dead_letters
        assert (letter.item_id, letter.reason) == (item.item_id, "acquisition budget exhausted")
        assert letter.last_failure["message"] == "bad input 3"
        server.clock.advance(3600)
        assert qs.acquire("q", worker="peek") == []


def test_a_requeue_comes_back_after_its_own_delay_and_a_quarantine_is_dead_lettered_at_once() -> (
    None
):
    server = InMemoryServer()
    with server.client() as qs:
        later, never = qs.enqueue("q", "later"), qs.enqueue("q", "never")

        def handler(job: Job) -> str:
            if job.payload == "never":
                raise Quarantine("can never work")
            if job.acquisition_count == 1:
                raise Requeue("not yet", delay=30)
            return "done"

        results: list[Result] = []
        assert work(qs, handler, max_items=2, on_result=results.append) == 2
        assert [r.outcome for r in results] == [Outcome.REQUEUED, Outcome.QUARANTINED]
        back = qs.get_item(later.item_id)
        assert (back.state, back.last_failure) == ("ready", None)  # no failure recorded
        assert (back.available_at - back.updated_at).total_seconds() == 30
        assert qs.get_item(never.item_id).state == "quarantined"
        (letter,) = qs.list_dead_letters().dead_letters
        assert (letter.item_id, letter.reason) == (never.item_id, "quarantined by triage")
        assert letter.last_failure["class"] == "Quarantine"
        server.clock.advance(30)
        assert work(qs, handler, drain=True) == 1
        done = qs.get_item(later.item_id)
        assert (done.state, done.result, done.acquisition_count, done.fence) == (
            "completed", "done", 2, 2,
        )  # fmt: skip


def test_a_lease_that_ran_out_is_taken_over_and_the_late_result_is_refused() -> None:
    server = InMemoryServer()
    with server.client() as qs, server.client() as other:
        item = qs.enqueue("q", "slow")
        taken: list[Any] = []

        def handler(job: Job) -> str:
            server.clock.advance(31)  # the handler outlives its 30 s lease...
            taken.extend(other.acquire("q", worker="w2"))  # ...and another worker takes it over
            return "late result"

        results: list[Result] = []
        assert work(qs, handler, max_items=1, on_result=results.append) == 1
        ((lease,), (result,)) = taken, results
        assert (lease.item_id, lease.fence, lease.acquisition_count) == (item.item_id, 2, 2)
        assert (result.outcome, result.fence) == (Outcome.LOST, 1)
        assert "the server refused the outcome: Stale fence" in result.detail
        now = qs.get_item(item.item_id)
        assert (now.state, now.lease_holder, now.fence, now.result) == ("leased", "w2", 2, None)
        other.complete(item.item_id, worker="w2", fence=2, result="on time")
        with pytest.raises(errors.ItemNotLeasedError):
            qs.complete(item.item_id, worker="w1", fence=1)
        assert qs.get_item(item.item_id).result == "on time"


def test_a_lease_that_ran_out_unclaimed_still_grants_nothing() -> None:
    server = InMemoryServer()
    with server.client() as qs:
        item = qs.enqueue("q", "slow")

        def handler(job: Job) -> str:
            server.clock.advance(30)  # the lease's last instant has passed
            return "late result"

        results: list[Result] = []
        assert work(qs, handler, max_items=1, on_result=results.append) == 1
        assert results[0].outcome is Outcome.LOST
        assert "Lease expired" in results[0].detail
        # Nobody took it yet; the next acquire does, under the next fence.
        assert qs.get_item(item.item_id).state == "leased"
        (lease,) = qs.acquire("q", worker="w2")
        assert (lease.fence, lease.acquisition_count) == (2, 2)


def test_a_refused_heartbeat_tells_the_handler_to_stop_and_nothing_is_submitted() -> None:
    server = InMemoryServer()
    with server.client() as qs, server.client() as other:
        item = qs.enqueue("q", "slow")
        told: list[bool] = []

        def handler(job: Job) -> str:
            server.clock.advance(2)  # a 1 s lease runs out...
            other.acquire("q", worker="w2", lease_ttl=30)  # ...and another worker takes over
            told.append(job.stop.wait(5))  # its next heartbeat (every 50 ms) is refused
            return "never submitted"

        results: list[Result] = []
        options = {"lease_ttl": 1, "heartbeat_fraction": 0.05, "on_result": results.append}
        assert work(qs, handler, max_items=1, **options) == 1
        assert told == [True]
        (result,) = results
        assert result.outcome is Outcome.LOST
        assert result.detail == "the lease was lost (stale-fence); nothing was submitted"
        now = qs.get_item(item.item_id)
        assert (now.lease_holder, now.fence, now.result) == ("w2", 2, None)


def test_a_heartbeat_that_fails_keeps_the_lease_until_it_runs_out() -> None:
    server = InMemoryServer()
    beats: list[int] = []
    answer = server.handle

    def restarting(request: httpx.Request) -> httpx.Response:
        """The first heartbeat is answered 503 (the server restarting), the later ones as usual."""
        if request.url.path.endswith("/leases:heartbeat"):
            beats.append(len(beats) + 1)
            if len(beats) == 1:
                return httpx.Response(503, json={"title": "Unavailable", "status": 503})
        return answer(request)

    server.handle = restarting  # type: ignore[method-assign]
    with server.client(attempts=1) as qs:
        item = qs.enqueue("q", "x")
        stopped: list[bool] = []

        def handler(job: Job) -> str:
            deadline = time.monotonic() + 5
            # Beats every 50 ms: the first fails, the second extends the lease (10 s on the
            # worker's clock, far from running out), the third is sent once it has.
            while len(beats) < 3 and not job.stop.is_set() and time.monotonic() < deadline:
                time.sleep(0.01)
            stopped.append(job.stop.is_set())
            return "done"

        results: list[Result] = []
        options = {"lease_ttl": 10, "heartbeat_fraction": 0.005, "on_result": results.append}
        assert work(qs, handler, max_items=1, **options) == 1
        assert stopped == [False]
        assert [r.outcome for r in results] == [Outcome.COMPLETED]
        assert qs.get_item(item.item_id).result == "done"


@pytest.mark.parametrize("refused", ["request", "entry"])
def test_heartbeats_that_keep_failing_end_the_lease_when_it_runs_out_not_before(
    refused: str,
) -> None:
    # 1 s leases, a beat every 50 ms: the beats go through for 1.5 s (past the first
    # lease's end), then every one fails: the request answered 503, or each lease in it.
    server = InMemoryServer()
    answer = server.handle
    began = time.monotonic()
    failed: list[float] = []

    def failing(request: httpx.Request) -> httpx.Response:
        if not request.url.path.endswith("/leases:heartbeat"):
            return answer(request)
        if time.monotonic() - began < 1.5:
            return answer(request)
        failed.append(time.monotonic())
        problem = {"title": "Unavailable", "status": 503, "code": "service-unavailable"}
        if refused == "request":
            return httpx.Response(503, json=problem)
        items = [e["item_id"] for e in json.loads(request.content)["leases"]]
        results = [{"item_id": i, "status": 503, "problem": problem} for i in items]
        return httpx.Response(200, json={"extended": 0, "results": results})

    server.handle = failing  # type: ignore[method-assign]
    with server.client(attempts=1) as qs:
        qs.enqueue("q", "x")
        seen: list[bool] = []

        def handler(job: Job) -> str:
            deadline = time.monotonic() + 5
            while not failed and time.monotonic() < deadline:
                time.sleep(0.01)
            time.sleep(0.3)  # the last beat that went through extended the lease by 1 s
            seen.append(job.stop.is_set())
            seen.append(job.stop.wait(5))  # ...which then runs out
            return "late"

        results: list[Result] = []
        options: dict[str, Any] = {"lease_ttl": 1, "heartbeat_fraction": 0.05}
        assert work(qs, handler, max_items=1, on_result=results.append, **options) == 1
        assert seen == [False, True]
        assert [r.outcome for r in results] == [Outcome.LOST]


def test_a_heartbeat_refused_while_the_outcome_is_on_its_way_changes_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A beat is on its way when the handler ends; it is answered after the complete was
    # carried out, so refused (the item is completed): that says nothing new.
    server = InMemoryServer()
    answer = server.handle
    beating, completed = threading.Event(), threading.Event()
    refused: list[int] = []

    def crossed(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/leases:heartbeat") and not beating.is_set():
            beating.set()
            completed.wait(5)
            answered = answer(request)
            refused.extend(r["status"] for r in answered.json()["results"])
            return answered
        answered = answer(request)
        if request.url.path.endswith(("/completions", "/complete")):
            completed.set()
        return answered

    server.handle = crossed  # type: ignore[method-assign]
    with server.client() as qs:
        item = qs.enqueue("q", "x")

        def handler(job: Job) -> str:
            beating.wait(5)
            return "done"

        results: list[Result] = []
        options: dict[str, Any] = {"lease_ttl": 1, "heartbeat_fraction": 0.05}
        assert work(qs, handler, max_items=1, on_result=results.append, **options) == 1
        assert refused == [409]
        assert [(r.outcome, r.detail) for r in results] == [(Outcome.COMPLETED, "")]
        assert [r.getMessage() for r in caplog.records if "lost" in r.getMessage()] == []
        assert qs.get_item(item.item_id).result == "done"


def test_a_waiting_lease_is_extended_with_the_running_ones() -> None:
    server = InMemoryServer()
    server.approve("q", 2)
    beats: list[int] = []
    answer = server.handle

    def counted(request: httpx.Request) -> httpx.Response:
        answered = answer(request)
        if request.url.path.endswith("/leases:heartbeat"):
            beats.append(len(beats) + 1)
        return answered

    server.handle = counted  # type: ignore[method-assign]
    with server.client() as qs:
        first, second = qs.enqueue("q", 0), qs.enqueue("q", 1)

        def handler(job: Job) -> int:
            if job.payload == 0:  # the other item's lease waits for the one slot meanwhile
                for _ in range(2):
                    server.clock.advance(6)  # 12 s in all: past both 10 s leases...
                    seen, deadline = len(beats), time.monotonic() + 5
                    while len(beats) < seen + 2 and time.monotonic() < deadline:
                        time.sleep(0.01)  # ...unless a heartbeat (every 50 ms) extends them
            return int(job.payload)

        results: list[Result] = []
        options = {"lease_ttl": 10, "heartbeat_fraction": 0.005, "prefetch": 1}
        assert work(qs, handler, max_items=2, on_result=results.append, **options) == 2
        assert [(r.item_id, r.outcome) for r in results] == [
            (first.item_id, Outcome.COMPLETED), (second.item_id, Outcome.COMPLETED),
        ]  # fmt: skip
        assert [qs.get_item(i.item_id).result for i in (first, second)] == [0, 1]


def test_a_lease_whose_item_is_gone_tells_the_handler_to_stop() -> None:
    server = InMemoryServer()
    answer = server.handle

    def deleted(request: httpx.Request) -> httpx.Response:
        """Every heartbeat is answered as if the item had been deleted meanwhile."""
        if not request.url.path.endswith("/leases:heartbeat"):
            return answer(request)
        problem = {"title": "Item not found", "status": 404, "code": "item-not-found"}
        results = [
            {"item_id": lease["item_id"], "status": 404, "problem": problem}
            for lease in json.loads(request.content)["leases"]
        ]
        return httpx.Response(200, json={"results": results})

    server.handle = deleted  # type: ignore[method-assign]
    with server.client() as qs:
        qs.enqueue("q", "x")
        told: list[bool] = []

        def handler(job: Job) -> str:
            told.append(job.stop.wait(5))  # the first heartbeat, 50 ms in, says it is gone
            return "never submitted"

        results: list[Result] = []
        options = {"lease_ttl": 10, "heartbeat_fraction": 0.005, "on_result": results.append}
        assert work(qs, handler, max_items=1, **options) == 1
        assert told == [True]
        (result,) = results
        assert (result.outcome, result.detail) == (
            Outcome.LOST, "the lease was lost (item-not-found); nothing was submitted",
        )  # fmt: skip


def test_a_drain_never_long_polls() -> None:
    server = InMemoryServer()
    waits: list[float] = []
    answer = server.handle

    def recording(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/leases"):
            waits.append(json.loads(request.content)["wait"])
        return answer(request)

    server.handle = recording  # type: ignore[method-assign]
    with server.client() as qs:
        qs.enqueue("q", 1)
        # Nothing more is due: the run ends at once, not after a 5 s long poll.
        assert work(qs, lambda job: job.payload, drain=True, wait=5) == 1
    assert len(waits) >= 2
    assert set(waits) == {0}


def test_an_acquire_the_server_could_not_answer_is_tried_again_a_second_later() -> None:
    server = InMemoryServer()
    acquires: list[float] = []
    answer = server.handle
    worker: Worker

    def restarting(request: httpx.Request) -> httpx.Response:
        if not request.url.path.endswith("/leases"):
            return answer(request)
        acquires.append(time.monotonic())
        if len(acquires) == 2:
            worker.stop()
        return httpx.Response(503, json={"title": "Unavailable", "status": 503})

    server.handle = restarting  # type: ignore[method-assign]
    with server.client(attempts=1) as qs:
        worker = Worker(qs, "q", lambda job: None, name="w1")
        assert worker.run(handle_signals=False) == 0
    first, second = acquires  # not a busy loop against the server
    assert second - first >= 0.95


def test_a_second_signal_tells_the_running_handler_to_stop_at_once() -> None:
    # The worker handles signals on the main thread, where pytest runs this; each is sent to
    # it, and runs once its wait (a lock's, which a signal does not cut short) times out.
    main = threading.main_thread().ident
    assert main == threading.get_ident()
    server = InMemoryServer()
    with server.client() as qs:
        item = qs.enqueue("q", "long")
        told: list[bool] = []
        worker: Worker

        def handler(job: Job) -> str:
            signal.pthread_kill(main, signal.SIGINT)  # Ctrl-C: no more work; this may finish
            deadline = time.monotonic() + 5
            while not worker.stopping.is_set() and time.monotonic() < deadline:
                time.sleep(0.01)
            told.extend([worker.stopping.is_set(), job.stop.is_set()])
            signal.pthread_kill(main, signal.SIGINT)  # Ctrl-C again: stop now
            told.append(job.stop.wait(5))
            return "cut short"

        # Its waits: 50 ms for the queue's limit, then 50 ms for the slots within a grace
        # of a minute (the second signal, not the grace, stops the handler).
        worker = Worker(qs, "q", handler, name="w1", limit_refresh=0.05)
        assert worker.run(grace=60) == 1
        assert told == [True, False, True]
        assert qs.get_item(item.item_id).result == "cut short"


def test_a_read_told_to_retry_after_waits_that_long_but_never_past_max_wait() -> None:
    server = InMemoryServer()
    asked: list[float] = []
    retry_after = ["0.3"]
    answer = server.handle

    def limited(request: httpx.Request) -> httpx.Response:
        """Each read's first attempt is answered 429 with a Retry-After."""
        if request.method == "GET":
            asked.append(time.monotonic())
            if len(asked) % 2:
                problem = {"title": "Too many requests", "status": 429}
                headers = {"Retry-After": retry_after[0]}
                return httpx.Response(429, json=problem, headers=headers)
        return answer(request)

    server.handle = limited  # type: ignore[method-assign]
    with server.client() as qs:
        assert qs.concurrency("q").limit == 1
    # Its backoff would have tried again within 0.1 s; the server asked for 0.3 s.
    assert asked[1] - asked[0] >= 0.3
    retry_after[0] = "30"
    with server.client(max_wait=0.2) as qs:
        assert qs.concurrency("q").limit == 1
    assert 0.2 <= asked[3] - asked[2] < 5


def test_only_the_holder_with_its_fence_may_settle_and_each_refusal_says_why() -> None:
    server = InMemoryServer()
    with server.client() as qs, server.client() as other:
        item = qs.enqueue("q", "x")
        (lease,) = qs.acquire("q", worker="w1", lease_ttl=10)
        refusals: list[tuple[QueueClient, str, int, type[errors.ProblemError], str]] = [
            (qs, "w2", lease.fence, errors.NotLeaseHolderError, "not-lease-holder"),
            # the holder's name and fence from another client: a lease is its client's
            (other, "w1", lease.fence, errors.NotLeaseHolderError, "not-lease-holder"),
            (qs, "w1", lease.fence + 1, errors.FenceAheadError, "fence-ahead"),
        ]
        for client, worker, fence, error, code in refusals:
            with pytest.raises(error) as refused:
                client.complete(item.item_id, worker=worker, fence=fence)
            assert (refused.value.status, refused.value.code) == (409, code)
        beat = qs.heartbeat(item.item_id, worker="w1", fence=lease.fence, lease_ttl=20)
        assert (beat.lease_expires_at - lease.lease_expires_at).total_seconds() == 10
        server.clock.advance(20)
        with pytest.raises(errors.LeaseExpiredError) as expired:
            qs.heartbeat(item.item_id, worker="w1", fence=lease.fence)
        assert expired.value.body["expired_at"] == beat.lease_expires_at.isoformat()
        with pytest.raises(errors.ItemNotFoundError):
            qs.get_item(str(uuid.uuid4()))
        with pytest.raises(errors.InvalidRequestError) as above:
            qs.acquire("q", worker="w1", lease_ttl=31)
        assert above.value.body["errors"][0]["type"] == "policy_envelope"


def test_an_idempotency_key_gets_its_first_answer_again() -> None:
    server = InMemoryServer()
    with server.client() as qs:
        first = qs.enqueue("q", {"to": "ada"}, idempotency_key="order-1")
        assert qs.enqueue("q", {"to": "ada"}, idempotency_key="order-1") == first
        assert [i.item_id for i in server.items()] == [first.item_id]
        with pytest.raises(errors.IdempotencyKeyReuseError):
            qs.enqueue("q", {"to": "bob"}, idempotency_key="order-1")
        (lease,) = qs.acquire("q", worker="w1")
        done = qs.complete(first.item_id, worker="w1", fence=lease.fence, idempotency_key="c-1")
        # A complete sent again (its answer was lost) is answered as the first time...
        again = qs.complete(first.item_id, worker="w1", fence=lease.fence, idempotency_key="c-1")
        assert again == done
        assert done.state == "completed"
        # ...while another complete of the finished item is refused.
        with pytest.raises(errors.ItemNotLeasedError):
            qs.complete(first.item_id, worker="w1", fence=lease.fence, idempotency_key="c-2")


def test_the_queue_leases_no_more_than_its_concurrency_limit_and_a_worker_fills_it() -> None:
    server = InMemoryServer()
    with server.client() as qs:
        qs.enqueue_batch("q", [NewItem(payload=n) for n in range(9)])
        (first,) = qs.acquire("q", worker="w0", max_items=9)  # one at a time, unless approved
        qs.complete(first.item_id, worker="w0", fence=first.fence, result=0)
        server.approve("q", 4)
        assert len(qs.acquire("q", worker="w0", max_items=2)) == 2
        assert (qs.concurrency("q").limit, qs.concurrency("q").active_leases) == (4, 2)
        server.clock.advance(30)  # those two run out: the worker takes them over
        together = threading.Barrier(4, timeout=5)

        def handler(job: Job) -> int:
            together.wait()  # four run at once, or this times out
            return int(job.payload) * 2

        assert work(qs, handler, drain=True, concurrency=6) == 8
        done = server.items("q", state="completed")
        assert sorted(i.result for i in done) == [n * 2 for n in range(9)]
        assert qs.concurrency("q").active_leases == 0


def test_outcomes_that_end_together_go_in_batches_the_server_takes_whatever_max_batch_says() -> (
    None
):
    server = InMemoryServer()
    server.approve("q", 600)
    sent: list[tuple[str, int]] = []  # each request's path, and its entries when a batch
    answer = server.handle

    def watched(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content or b"{}")
        sent.append((request.url.path, len(body.get("completions", ()))))
        return answer(request)

    server.handle = watched  # type: ignore[method-assign]
    with server.client() as qs:
        for start in (0, 300):
            qs.enqueue_batch("q", [NewItem(payload=n) for n in range(start, start + 300)])
        together = threading.Barrier(600, timeout=30)

        def handler(job: Job) -> None:
            together.wait()  # all 600 end at once

        # Asked for batches of 10,000: the server takes at most 500 outcomes a request.
        assert work(qs, handler, drain=True, concurrency=600, max_batch=10_000, linger=5) == 600
    assert len(server.items("q", state="completed")) == 600
    batches = [n for path, n in sent if path.endswith("/completions")]
    assert sum(batches) == 600
    assert max(batches) == 500, batches
    assert not [path for path, _ in sent if path.endswith("/complete")]  # none one by one


def test_the_asyncio_worker_runs_on_it_too() -> None:
    server = InMemoryServer()

    async def scenario() -> tuple[int, list[Item]]:
        async with server.async_client() as qs:
            items = [await qs.enqueue("q", n) for n in range(3)]

            async def handler(job: AsyncJob) -> int:
                if job.payload == 0 and job.acquisition_count == 1:
                    raise TransientError("busy", delay=0)  # due again at once
                return int(job.payload) * 10

            handled = await AsyncWorker(qs, "q", handler, name="w1").run(
                drain=True, handle_signals=False
            )
            return handled, [await qs.get_item(i.item_id) for i in items]

    handled, items = asyncio.run(scenario())
    assert handled == 4
    assert [(i.state, i.result, i.acquisition_count) for i in items] == [
        ("completed", 0, 2), ("completed", 10, 1), ("completed", 20, 1),
    ]  # fmt: skip


# -- held to the server ---------------------------------------------------------------


def observe(qs: QueueClient, operator: QueueClient) -> dict[str, Any]:
    """What a handler and its client observe of one small run (no clock moved)."""
    low = qs.enqueue("q", "low", max_acquisitions=2, idempotency_key="low-1")
    again = qs.enqueue("q", "low", max_acquisitions=2, idempotency_key="low-1")
    high = qs.enqueue("q", "high", priority=5, max_acquisitions=2)
    flaky = qs.enqueue("q", "flaky", priority=1, max_acquisitions=2)
    poison = qs.enqueue("q", "poison", priority=-1, max_acquisitions=1)
    seen: list[tuple[Any, ...]] = []

    def handler(job: Job) -> Any:
        lease = job.lease
        assert lease.lease_deadline_at is not None
        life = (lease.lease_deadline_at - lease.lease_expires_at).total_seconds()
        seen.append((job.payload, job.acquisition_count, job.fence, life, lease.queue))
        if job.payload == "flaky" and job.acquisition_count == 1:
            raise TransientError("busy", delay=0)
        if job.payload == "poison":
            raise ValueError("never")
        return {"done": job.payload}

    results: list[Result] = []
    handled = work(qs, handler, drain=True, on_result=results.append)

    def shown(item: Item) -> tuple[Any, ...]:
        now = qs.get_item(item.item_id)
        return (now.state, now.result, now.acquisition_count, now.fence, now.lease_holder,
                now.lease_deadline_at, failure_of(now))  # fmt: skip

    letters = operator.list_dead_letters(queue="q").dead_letters
    refusals: list[Any] = []

    def refused(call: Callable[[], object]) -> None:
        try:
            call()
        except errors.ProblemError as exc:
            # The whole problem document, but where it names this run's items.
            problem = {k: v for k, v in exc.body.items() if k not in ("instance", "item_id")}
            refusals.append((type(exc).__name__, exc.status, problem))
        else:
            refusals.append("answered")

    refused(lambda: qs.complete(high.item_id, worker="w1", fence=1))
    x = qs.enqueue("x", "x")
    (one,) = qs.acquire("x", worker="w2")
    qs.requeue(x.item_id, worker="w2", fence=one.fence, reason="again")
    (two,) = qs.acquire("x", worker="w2")
    refused(lambda: qs.complete(x.item_id, worker="w2", fence=one.fence))
    refused(lambda: qs.complete(x.item_id, worker="w3", fence=two.fence))
    refused(lambda: qs.heartbeat(x.item_id, worker="w2", fence=two.fence + 1))
    refused(lambda: qs.requeue(x.item_id, worker="w2", fence=two.fence, delay=10_000))
    refused(lambda: qs.enqueue("x", "other", idempotency_key="low-1"))
    refused(lambda: qs.get_item(str(uuid.uuid4())))
    refused(lambda: qs.complete(x.item_id, worker="w2", fence=two.fence, result=[1]))
    busy = qs.enqueue("b", "b")
    (lease,) = qs.acquire("b", worker="w2")
    back = qs.triage(
        busy.item_id, worker="w2", fence=lease.fence, failure_class="Busy", message="later",
        transient=True, delay="backoff",
    )  # fmt: skip
    failure = failure_of(back)
    unique = qs.enqueue("u", "one", unique_key="k")
    held = qs.enqueue("u", "two", unique_key="k")
    (taken,) = qs.acquire("u", worker="w2")
    qs.complete(taken.item_id, worker="w2", fence=taken.fence)
    freed = qs.enqueue("u", "three", unique_key="k")
    # Unique for a day: the completed item still holds the key.
    (done,) = qs.acquire("u", worker="w2")
    qs.complete(done.item_id, worker="w2", fence=done.fence)
    daily = qs.enqueue("u", "four", unique_key="k", unique_for=86400)
    # An ordering key: one at a time, in enqueue order.
    line = [qs.enqueue("o", n, ordering_key="c") for n in range(3)]
    (first,) = qs.acquire("o", worker="w2")
    qs.complete(first.item_id, worker="w2", fence=first.fence)
    (second,) = qs.acquire("o", worker="w2")
    # Dependencies: a fan-in made ready by its last dependency; its failure cancels its
    # dependent and runs the one that runs anyway; refusals of a failed or unknown one.
    a, b = qs.enqueue("d", "a"), qs.enqueue("d", "b")
    joined = qs.enqueue("d", "joined", depends_on=[a.item_id, b.item_id])
    child = qs.enqueue("d", "child", depends_on=[joined.item_id])
    anyway = qs.enqueue("d", "anyway", depends_on=[joined.item_id], on_dependency_failure="run")
    waited = [joined.state, child.state, anyway.state]
    for _ in range(2):
        (dep,) = qs.acquire("d", worker="w2")
        qs.complete(dep.item_id, worker="w2", fence=dep.fence)
    (fan_in,) = qs.acquire("d", worker="w2")
    qs.triage(
        fan_in.item_id, worker="w2", fence=fan_in.fence, failure_class="Boom",
        decision="quarantine",
    )  # fmt: skip
    # A fan-in: the batch's callback waits for it, then reads its outcomes, two at a time.
    fan = qs.fan_in("f", [NewItem(payload=n) for n in range(3)], NewItem(payload="sum"))
    (one,) = qs.acquire("f", worker="w2")
    qs.complete(one.item_id, worker="w2", fence=one.fence, result=one.payload)
    waiting = qs.list_dependencies(fan.callback.item_id, limit=1)
    for _ in range(2):
        (one,) = qs.acquire("f", worker="w2")
        qs.complete(one.item_id, worker="w2", fence=one.fence, result=one.payload)
    (summed,) = qs.acquire("f", worker="w2")
    pages = [qs.list_dependencies(summed.item_id, limit=2)]
    pages.append(qs.list_dependencies(summed.item_id, limit=2, cursor=pages[0].next_cursor))
    fanned = (
        fan.callback.state,
        summed.item_id == fan.callback.item_id,
        sorted(i.result for page in pages for i in page.items),
        [len(page.items) for page in pages],
        pages[1].next_cursor,
        (waiting.total, waiting.waiting_for),  # one of three done
        (pages[0].total, pages[0].waiting_for),  # all done: released
    )
    # A graph in one batch: the second item names the first by its ref.
    graph = qs.enqueue_batch(
        "g", [NewItem(payload="x", ref="x"), NewItem(payload="y", depends_on=["x"])]
    )
    dependency_refusals = []
    for depends_on in ([joined.item_id], ["00000000-0000-7000-8000-000000000001"]):
        try:
            qs.enqueue("d", "late", depends_on=depends_on)
        except errors.ProblemError as exc:
            dependency_refusals.append((exc.status, exc.body["code"]))
    return {
        "dependencies": (
            waited,
            fan_in.payload,
            [qs.get_item(i.item_id).state for i in (joined, child, anyway)],
            dependency_refusals,
        ),
        "fan-in": fanned,
        "graph": [i.state for i in graph],
        "same item": again.item_id == low.item_id,
        "unique": (
            held.item_id == unique.item_id,
            held.payload,
            held.unique_key,
            freed.item_id != unique.item_id,
            freed.payload,
            daily.item_id == freed.item_id,
            daily.state,
        ),
        "ordered": (
            [i.state for i in line],
            [first.payload, second.payload],
            [qs.get_item(i.item_id).state for i in line],
        ),
        "handled": handled,
        "seen": seen,
        "results": [(r.outcome, r.fence, r.detail) for r in results],
        "items": [shown(item) for item in (low, high, flaky, poison, x)],
        "dead letters": [(d.item_id == poison.item_id, d.reason, d.last_failure) for d in letters],
        "refusals": refusals,
        "backoff": (back.state, (back.available_at - back.updated_at).total_seconds(), failure),
    }


def answer(call: Callable[[], Item]) -> Any:
    """The item's state, or the refusal's (status, code)."""
    try:
        return call().state
    except errors.ProblemError as exc:
        return (exc.status, exc.code)


def observe_edges(qs: QueueClient, operator: QueueClient) -> dict[str, Any]:
    """The edges of the same routes: keys and values at their bounds, a refusal kept for
    its key, what holds a unique or an ordering key, what a failed dependency does."""
    leased = runtime_policy().leased_work
    keys = [
        answer(partial(qs.enqueue, "keys", key[:3], idempotency_key=key))
        for key in ("k" * 255, "k" * 256, "a b")
    ]
    # A complete refused (not leased yet) is answered so again under its key, leased or not.
    early = qs.enqueue("kept", "x")
    again = [answer(lambda: qs.complete(early.item_id, worker="w2", fence=1, idempotency_key="e"))]
    (lease,) = qs.acquire("kept", worker="w2")
    again.append(
        answer(lambda: qs.complete(early.item_id, worker="w2", fence=1, idempotency_key="e"))
    )
    again.append(answer(lambda: qs.complete(early.item_id, worker="w2", fence=lease.fence)))
    budgets = [
        answer(partial(qs.enqueue, "cap", "x", max_acquisitions=n))
        for n in (leased.attempt_cap, leased.attempt_cap + 1)
    ]
    slow = qs.enqueue("slow", "x")
    (lease,) = qs.acquire("slow", worker="w2")
    at_cap = qs.requeue(slow.item_id, worker="w2", fence=lease.fence, delay=leased.backoff_cap)
    tried = qs.enqueue("tried", "x")
    (lease,) = qs.acquire("tried", worker="w2")
    quarantine_later = answer(
        lambda: qs.triage(
            tried.item_id, worker="w2", fence=lease.fence, failure_class="E",
            decision="quarantine", delay=5,
        )
    )  # fmt: skip
    # A waiting item holds its unique key; a leased one holds its ordering key's line.
    blocker = qs.enqueue("uw", "blocker")
    first = qs.enqueue("uw", "first", unique_key="kw", depends_on=[blocker.item_id])
    second = qs.enqueue("uw", "second", unique_key="kw")
    lead = qs.enqueue("o2", "lead", ordering_key="c2")
    (held,) = qs.acquire("o2", worker="w2")
    behind = qs.enqueue("o2", "behind", ordering_key="c2")
    # A quarantine cancels its dependents and theirs; a cancelled dependency refuses a new
    # dependent under `cancel` and satisfies one under `run`.
    root = qs.enqueue("d2", "root")
    mid = qs.enqueue("d2", "mid", depends_on=[root.item_id])
    leaf = qs.enqueue("d2", "leaf", depends_on=[mid.item_id])
    (lease,) = qs.acquire("d2", worker="w2")
    qs.triage(
        root.item_id, worker="w2", fence=lease.fence, failure_class="Boom", decision="quarantine"
    )
    after = [
        answer(
            partial(qs.enqueue, "d2", "late", depends_on=[mid.item_id], on_dependency_failure=rule)
        )
        for rule in ("cancel", "run")
    ]
    page = qs.list_dependencies(mid.item_id, limit=1)
    return {
        "keys": keys,
        "kept": again,
        "budgets": budgets,
        "backoff cap": (at_cap.available_at - at_cap.updated_at).total_seconds(),
        "quarantine later": quarantine_later,
        "unique waiting": (first.state, second.item_id == first.item_id, second.payload),
        "ordered leased": (held.item_id == lead.item_id, behind.state),
        "cascade": [qs.get_item(i.item_id).state for i in (root, mid, leaf)],
        "after": after,
        "page": ([i.item_id for i in page.items] == [root.item_id], page.next_cursor),
        "waiting for": (page.total, page.waiting_for),
        "letters": [d.queue for d in operator.list_dead_letters(queue="d2").dead_letters],
    }


def test_the_in_memory_server_answers_as_a_live_server_does(api: Api) -> None:
    with (
        QueueClient(api.url, api.keys["worker"], tenant=api.tenant) as qs,
        QueueClient(api.url, api.keys["operator"], tenant=api.tenant) as operator,
    ):
        live = observe(qs, operator)
        live_edges = observe_edges(qs, operator)
    server = InMemoryServer(max_acquisitions=3)  # the test tenant's default
    with server.client(api.tenant) as qs:
        in_memory = observe(qs, qs)
        assert observe_edges(qs, qs) == live_edges
    assert in_memory == live
    # And what they both saw is what the API promises, not a shared mistake.
    assert live["same item"] is True
    assert live["unique"] == (True, "one", "k", True, "three", True, "completed")
    assert live["dependencies"] == (
        ["waiting", "waiting", "waiting"],
        "joined",
        ["quarantined", "cancelled", "ready"],
        [(422, "invalid-request"), (422, "invalid-request")],
    )
    assert live["graph"] == ["ready", "waiting"]
    assert live["fan-in"] == ("waiting", True, [0, 1, 2], [2, 1], None, (3, 2), (3, 0))
    assert live["ordered"] == (
        ["ready", "waiting", "waiting"], [0, 1], ["completed", "leased", "waiting"],
    )  # fmt: skip
    assert [s[:3] for s in live["seen"]] == [
        ("high", 1, 1), ("flaky", 1, 1), ("flaky", 2, 2), ("low", 1, 1), ("poison", 1, 1),
    ]  # fmt: skip
    assert {s[3] for s in live["seen"]} == {870.0}  # a 30 s lease of a 900 s deadline
    assert [r[0] for r in live["results"]] == [
        Outcome.COMPLETED, Outcome.TRIAGED, Outcome.COMPLETED, Outcome.COMPLETED, Outcome.TRIAGED,
    ]  # fmt: skip
    assert [i[:4] for i in live["items"]] == [
        ("completed", {"done": "low"}, 1, 1),
        ("completed", {"done": "high"}, 1, 1),
        ("completed", {"done": "flaky"}, 2, 2),
        ("quarantined", None, 1, 1),
        ("completed", [1], 2, 2),
    ]
    ((poisoned, reason, failure),) = live["dead letters"]
    assert (poisoned, reason) == (True, "acquisition budget exhausted")
    assert (failure["class"], failure["message"]) == ("ValueError", "never")
    assert [r[2]["code"] if r != "answered" else r for r in live["refusals"]] == [
        "item-not-leased", "stale-fence", "not-lease-holder", "fence-ahead", "invalid-request",
        "idempotency-key-reuse", "item-not-found", "answered",
    ]  # fmt: skip
    assert live["backoff"] == (
        "ready", 1.0, {"class": "Busy", "message": "later", "transient": True},
    )  # fmt: skip
    leased = runtime_policy().leased_work
    assert live_edges == {
        "keys": ["ready", (400, "idempotency-key-required"), (400, "idempotency-key-required")],
        "kept": [(409, "item-not-leased"), (409, "item-not-leased"), "completed"],
        "budgets": ["ready", (422, "invalid-request")],
        "backoff cap": leased.backoff_cap,
        "quarantine later": (422, "invalid-request"),
        "unique waiting": ("waiting", True, "first"),
        "ordered leased": (True, "waiting"),
        "cascade": ["quarantined", "cancelled", "cancelled"],
        "after": [(422, "invalid-request"), "ready"],
        "page": (True, None),
        "waiting for": (1, 0),
        "letters": ["d2"],
    }


@pytest.mark.parametrize(
    "option",
    [{"heartbeat_fraction": 0}, {"heartbeat_fraction": 1}, {"prefetch": -1}, {"prefetch": 101}],
)
def test_a_worker_refuses_an_option_out_of_its_range_before_it_starts(
    option: dict[str, Any],
) -> None:
    # A heartbeat at the whole TTL would arrive as the lease runs out; none at all is 0.
    # (The core both workers share checks them.)
    server = InMemoryServer()
    with server.client() as qs, pytest.raises(ValueError, match=next(iter(option))):
        Worker(qs, "q", lambda job: None, **option)


def test_leases_that_arrive_as_the_worker_stops_are_given_back_at_once() -> None:
    # The stop comes while an acquire is on its way back: what it brings is not run, and is
    # not left leased until its TTL runs out either; each item is ready again at once.
    server = InMemoryServer()
    with server.client() as qs:
        qs.enqueue_batch("q", [NewItem(payload=n) for n in range(3)])
        handled: list[Job] = []
        worker = Worker(qs, "q", handled.append, name="w1", concurrency=3)
        acquire = server._acquire

        def acquire_then_stop(asked: Any) -> tuple[int, Any]:
            answered = acquire(asked)
            worker.stop()
            return answered

        server._acquire = acquire_then_stop  # type: ignore[method-assign]
        worker.run(handle_signals=False)
        assert handled == []
        assert [i.state for i in server.items("q")] == ["ready"] * 3
        # The clock has not moved: another worker takes them now, not after their TTL.
        assert work(qs, handled.append, drain=True) == 3


def test_outcomes_share_requests_within_the_batch_byte_budget() -> None:
    # Six handlers end together with 200 kB results each: their completions go out in
    # shared requests, none over half a mebibyte (the server would refuse a body over its
    # limit whole, and each completion would then be sent alone).
    server = InMemoryServer()
    server.approve("q", 6)
    sent: list[tuple[int, int]] = []
    complete_many = server._complete_many

    def recorded(asked: Any) -> tuple[int, Any]:
        entries = asked.body["completions"]
        sent.append((len(entries), len(json.dumps(entries))))
        return complete_many(asked)

    server._complete_many = recorded  # type: ignore[method-assign]
    ends = threading.Barrier(6)

    def handler(job: Job) -> str:
        ends.wait(10)
        return "x" * 200_000

    with server.client() as qs:
        qs.enqueue_batch("q", [NewItem(payload=n) for n in range(6)])
        assert work(qs, handler, drain=True, concurrency=6, linger=0.5) == 6
    assert sum(n for n, _ in sent) == 6
    assert max(size for _, size in sent) <= 512 * 1024, sent
    assert max(n for n, _ in sent) == 2, sent  # shared: two of them fit in a request


def raw_edges(http: httpx.Client, tenant: str) -> list[Any]:
    """What a client other than the SDK sees of the same routes: statuses and counts."""

    def post(path: str, body: dict[str, Any], key: str | None = None) -> httpx.Response:
        headers = {"Idempotency-Key": key} if key else {}
        return http.post(f"/v1/tenants/{tenant}{path}", json=body, headers=headers)

    made = post("/queues/raw/items", {"payload": 1, "unique_key": "r"}, "r1")
    held = post("/queues/raw/items", {"payload": 2, "unique_key": "r"}, "r2")
    other = post("/queues/raw/items", {"payload": 3}, "r3").json()
    (lease,) = post("/queues/raw/leases", {"worker": "w9", "lease_ttl": 30}).json()["leases"]
    entry = {"item_id": lease["item_id"], "fence": lease["fence"]}
    beats = post(
        "/leases:heartbeat",
        {"worker": "w9", "leases": [entry, {"item_id": other["item_id"], "fence": 1}]},
    )
    twice = post("/completions", {"worker": "w9", "completions": [entry, entry]}, "r4")
    failure = {"worker": "w9", "fence": lease["fence"], "failure": {"class": "E"}}
    failed = post(f"/items/{lease['item_id']}/triage", failure | {"decision": "requeue"}, "r5")
    return [
        (made.status_code, held.status_code, held.json()["item_id"] == made.json()["item_id"]),
        (beats.json()["extended"], [r["status"] for r in beats.json()["results"]]),
        (twice.status_code, twice.json()["code"]),
        (failed.status_code, failed.json()["last_failure"]),
    ]


def test_a_client_other_than_the_sdk_gets_the_live_servers_answers_too(api: Api) -> None:
    # An item held by its unique key is answered 200, not 201; a batch counts only the
    # entries it carried out; an item named twice in a batch is refused; a failure that
    # does not say it is transient is not.
    live = raw_edges(api.worker, api.tenant)
    server = InMemoryServer()
    with httpx.Client(
        transport=httpx.MockTransport(server.handle),
        base_url=URL,
        headers={"Authorization": "Bearer raw"},
    ) as http:
        assert raw_edges(http, api.tenant) == live
    assert live == [
        (201, 200, True),
        (1, [200, 409]),
        (422, "invalid-request"),
        (200, {"class": "E", "message": "", "transient": False}),
    ]


def test_the_clock_only_moves_forward() -> None:
    server = InMemoryServer()
    with pytest.raises(ValueError, match="only moves forward"):
        server.clock.advance(-0.5)
    server.clock.advance(0)


def test_a_lease_heartbeaten_to_its_deadline_ends_there_and_is_taken_over_as_a_failure() -> None:
    server = InMemoryServer()
    deadline = runtime_policy().leased_work.deadline
    with server.client() as qs:
        item = qs.enqueue("q", "long")
        (lease,) = qs.acquire("q", worker="w1")
        assert lease.lease_deadline_at is not None
        for _ in range(int(deadline // 25) - 1):  # to 25 s before the deadline
            server.clock.advance(25)
            beat = qs.heartbeat(item.item_id, worker="w1", fence=lease.fence)
        # The last heartbeat asked for 30 s more and got what was left to the deadline.
        assert beat.lease_expires_at == lease.lease_deadline_at
        server.clock.advance(30)
        with pytest.raises(errors.LeaseDeadlineExceededError) as ended:
            qs.complete(item.item_id, worker="w1", fence=lease.fence)
        assert ended.value.code == "lease-deadline-exceeded"
        (again,) = qs.acquire("q", worker="w2")
        failure = qs.get_item(item.item_id).last_failure or {}
        assert (again.fence, failure["class"]) == (2, "LeaseDeadlineExceeded")


def test_a_unique_key_for_a_period_holds_within_it_and_not_at_its_end() -> None:
    server = InMemoryServer()
    with server.client() as qs:
        first = qs.enqueue("q", 1, unique_key="k", unique_for=10)
        (lease,) = qs.acquire("q", worker="w1")
        qs.complete(first.item_id, worker="w1", fence=lease.fence)
        server.clock.advance(9.5)
        assert qs.enqueue("q", 2, unique_key="k", unique_for=10).item_id == first.item_id
        server.clock.advance(0.5)  # made exactly 10 s ago: no longer within
        assert qs.enqueue("q", 3, unique_key="k", unique_for=10).item_id != first.item_id


def test_a_tenant_sees_nothing_of_another_tenants_items() -> None:
    server = InMemoryServer()
    with server.client("a") as a, server.client("b") as b:
        item = a.enqueue("q", "a's", max_acquisitions=1)
        a.acquire("q", worker="w1")
        server.clock.advance(30)
        assert a.acquire("q", worker="w1") == []  # its last attempt ran out: dead-lettered
        assert [d.item_id for d in a.list_dead_letters().dead_letters] == [item.item_id]
        assert b.list_dead_letters().dead_letters == []
        with pytest.raises(errors.ItemNotFoundError):
            b.get_item(item.item_id)
        with pytest.raises(errors.InvalidRequestError, match="no item"):
            b.enqueue("q", "b's", depends_on=[item.item_id])


def test_expired_leases_are_taken_first_the_longest_expired_first_then_due_items_by_age() -> None:
    server = InMemoryServer()
    server.approve("q", 10)
    with server.client() as qs:
        older, newer = qs.enqueue("q", "older"), qs.enqueue("q", "newer")
        qs.acquire("q", worker="w1", lease_ttl=20)  # older: expires at 20
        qs.acquire("q", worker="w1", lease_ttl=10)  # newer: expires at 10
        late = qs.enqueue("q", "late", delay=5)
        soon = qs.enqueue("q", "soon")
        server.clock.advance(25)  # both expired; both ready, soon due 5 s longer than late
        taken = [lease.payload for lease in qs.acquire("q", worker="w2", max_items=1)]
        for room in (2, 1):  # the other expired one, then the due item due longest first
            taken += [lease.payload for lease in qs.acquire("q", worker="w2", max_items=room)]
        assert taken == ["newer", "older", "soon", "late"]
        assert older.item_id < newer.item_id < late.item_id < soon.item_id


def test_what_the_double_is_given_is_held_to_the_policy() -> None:
    leased = runtime_policy().leased_work
    server = InMemoryServer(lease_ttl=10_000, retry_base=100, retry_cap=10_000)
    server.approve("q", 10**6)
    with server.client() as qs:
        assert qs.concurrency("q").limit == leased.max_approved
        item = qs.enqueue("q", "x", max_acquisitions=leased.attempt_cap)
        backoffs = []
        for _ in range(leased.attempt_cap - 1):
            (lease,) = qs.acquire("q", worker="w1")
            ttl = (lease.lease_expires_at - server.clock.now()).total_seconds()
            assert ttl == leased.attempt_timeout
            back = qs.requeue(item.item_id, worker="w1", fence=lease.fence, delay="backoff")
            backoffs.append((back.available_at - back.updated_at).total_seconds())
            server.clock.advance(leased.backoff_cap)
        # 100 s doubling with each acquisition, up to the policy's backoff cap (300 s).
        assert backoffs == [100, 200, leased.backoff_cap, leased.backoff_cap]
