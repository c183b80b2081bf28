"""Failed items back off by default, on both worker faces: 1 s, 2 s, 4 s after their first,
second and third failure (the server computes and ledgers each delay); a delay the
handler chose above the policy's cap sends the item back at the cap, with a warning."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from queue_server.client import Outcome, QueueClient, Result, TransientError, errors
from queue_server.client.working import envelope_limit
from tests.helpers.api import Api
from tests.helpers.faces import AnyJob, Face


def client(api: Api) -> QueueClient:
    return QueueClient(api.url, api.keys["worker"], tenant=api.tenant)


def kinds(qs: QueueClient, item_id: str) -> list[str]:
    return [e.kind for e in qs.ledger(item_id)]


def test_a_failing_handler_s_item_comes_back_after_one_then_two_then_four_seconds(
    api: Api, face: Face
) -> None:
    with client(api) as qs:
        item = qs.enqueue("q", "x", max_acquisitions=4)  # a fourth attempt left: ready

        def handler(job: AnyJob) -> Any:
            raise ValueError("the provider said no")

        results: list[Result] = []
        worker = face.worker(api, "q", handler, name="w1", lease_ttl=5, on_result=results.append)
        assert worker.run(max_items=3) == 3
        assert [r.outcome for r in results] == [Outcome.TRIAGED] * 3
        events = qs.ledger(item.item_id)
        triaged = [e for e in events if e.kind == "triaged"]
        assert [e.data["delay"] for e in triaged] == [1.0, 2.0, 4.0]
        assert all(e.data["backoff"] for e in triaged)
        acquired = [e.at for e in events if e.kind == "acquired"]
        # Each acquisition came no sooner than its backoff after the failure before it.
        for failed, next_at, delay in zip(triaged, acquired[1:], (1.0, 2.0), strict=False):
            assert (next_at - failed.at).total_seconds() >= delay - 0.05
        assert qs.get_item(item.item_id).state == "ready"


def test_a_delay_above_the_cap_sends_the_item_back_at_the_cap_and_says_so(
    api: Api, face: Face, caplog: pytest.LogCaptureFixture
) -> None:
    with client(api) as qs:
        item = qs.enqueue("q", "x")

        def handler(job: AnyJob) -> Any:
            raise TransientError("come back in an hour", delay=3600)

        results: list[Result] = []
        worker = face.worker(api, "q", handler, name="w1", lease_ttl=5, on_result=results.append)
        with caplog.at_level(logging.WARNING):
            assert worker.run(max_items=1) == 1
        assert [r.outcome for r in results] == [Outcome.TRIAGED]
        back = qs.get_item(item.item_id)
        assert back.state == "ready"  # not left leased until its TTL runs out
        assert (back.available_at - back.updated_at).total_seconds() == pytest.approx(300, abs=1)
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any(
            "backoff cap of 300 s" in m and "durable-leased-work/backoff-and-jitter" in m
            for m in warned
        ), warned


def test_a_chosen_delay_within_the_cap_is_kept(api: Api, face: Face) -> None:
    with client(api) as qs:
        item = qs.enqueue("q", "x")

        def handler(job: AnyJob) -> Any:
            raise TransientError("in a minute", delay=60)

        worker = face.worker(api, "q", handler, name="w1", lease_ttl=5)
        assert worker.run(max_items=1) == 1
        (triaged,) = [e for e in qs.ledger(item.item_id) if e.kind == "triaged"]
        assert (triaged.data["delay"], triaged.data["backoff"]) == (60.0, False)
        back = qs.get_item(item.item_id)
        assert (back.available_at - back.updated_at).total_seconds() == pytest.approx(60, abs=1)


def test_a_drain_waits_for_the_items_it_sent_back_until_their_budget_is_spent(
    api: Api, face: Face
) -> None:
    with client(api) as qs:
        item = qs.enqueue("q", "x", max_acquisitions=1)

        def handler(job: AnyJob) -> Any:
            raise ValueError("still broken")

        worker = face.worker(api, "q", handler, name="w1", lease_ttl=5)
        # Its one attempt spent, the triage dead-letters it: nothing comes back to wait for.
        assert worker.run(drain=True) == 1
        assert qs.get_item(item.item_id).state == "quarantined"
        # Its one attempt failed: dead-lettered by that triage, not by a later acquire.
        assert kinds(qs, item.item_id)[-2:] == ["acquired", "triaged"]


def test_only_a_refusal_of_the_delay_itself_is_read_as_the_delay_s_cap() -> None:
    # A 422 whose policy-envelope entry is about another field is no cap for the delay: the
    # worker would otherwise send the item back at that field's limit.
    def refused(*entries: dict[str, object]) -> errors.ProblemError:
        body = {"title": "Invalid request", "status": 422, "code": "invalid-request"}
        return errors.problem_error(422, {**body, "errors": list(entries)})

    ttl = {"type": "policy_envelope", "loc": ["body", "lease_ttl"], "limit": 30, "cell": "t"}
    delay = {"type": "policy_envelope", "loc": ["body", "delay"], "limit": 300, "cell": "b"}
    assert envelope_limit(refused(ttl), "delay") is None
    assert envelope_limit(refused(ttl, delay), "delay") == (300.0, "b")
    assert envelope_limit(refused({**delay, "type": "less_than_equal"}), "delay") is None


def test_a_drain_waits_out_the_backoff_of_an_item_it_failed_and_runs_it_again(
    api: Api, face: Face
) -> None:
    with client(api) as qs:
        item = qs.enqueue("q", "x", max_acquisitions=2)
        attempts: list[int] = []

        def handler(job: AnyJob) -> Any:
            attempts.append(job.acquisition_count)
            if len(attempts) == 1:
                raise ValueError("the provider said no")  # back in 1 s (its backoff)
            return "done"

        worker = face.worker(api, "q", handler, name="w1", lease_ttl=5)
        # The queue is empty when the first attempt fails: the drain still waits for the item
        # this worker sent back, instead of ending with it due a second later.
        assert worker.run(drain=True) == 2
        assert attempts == [1, 2]
        assert qs.get_item(item.item_id).state == "completed"


def test_a_drain_looks_again_when_an_item_it_runs_goes_back_at_once(api: Api, face: Face) -> None:
    api.approve("q", 2)  # two at a time
    with client(api) as qs:
        item = qs.enqueue("q", "x")
        attempts: list[int] = []

        def handler(job: AnyJob) -> Any:
            attempts.append(job.acquisition_count)
            if len(attempts) == 1:
                # Long enough for the drain's next acquire to find the queue empty while
                # this item is still running; then it is due again at once.
                time.sleep(0.5)
                raise TransientError("try again now", delay=0)
            return "done"

        # A free slot beside it: the drain looks for more while the item runs.
        worker = face.worker(api, "q", handler, name="w1", lease_ttl=5, concurrency=2)
        assert worker.run(drain=True) == 2
        assert attempts == [1, 2]
        assert qs.get_item(item.item_id).state == "completed"
