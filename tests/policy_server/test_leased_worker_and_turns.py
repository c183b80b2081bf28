"""The leased-work worker and the interactive turn gate against the real server."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest

from queue_server.client import QueueClient
from queue_server.client.worker import Job, Outcome, Result, Worker
from queue_server.policy import AdmissionRefused, OperationClass, RefusalReason
from queue_server.policy.v2 import OPERATION_RELIABILITY_V2
from tests.demonstrators.errors import (
    CircuitOpenError,
    OperationStoppedError,
    PermitUnavailableError,
)
from tests.demonstrators.turns import Turn, TurnGate
from tests.helpers.api import Api

pytestmark = pytest.mark.live  # the SDK opens its own connections

Db = psycopg.Connection[dict[str, object]]


def _count(db: Db, sql: str) -> object:
    row = db.execute(sql).fetchone()
    assert row is not None
    return row["n"]


def test_the_worker_completes_leased_work_as_one_attempt_under_its_fence(api: Api) -> None:
    api.enqueue(payload={"n": 1})
    seen: list[int] = []

    def handler(job: Job) -> dict[str, int]:
        seen.append(job.fence)
        return {"done": job.payload["n"]}

    with QueueClient(api.url, api.keys["worker"], tenant="acme") as client:
        worker = Worker(client, "q", handler, name="w1", wait=0)
        assert worker.run(max_items=1, drain=True) == 1
        # No retry loop: a holder request is sent once; reads retry as their class allows.
        leased = client.calls[OperationClass.DURABLE_LEASED_WORK]
        assert (leased.attempts, leased.attempt_timeout) == (1, 30)
        reads = client.calls[OperationClass.READ_ONLY_DEPENDENCY]
        assert (reads.attempts, reads.attempt_timeout, reads.deadline) == (3, 2, 10)
        writes = client.calls[OperationClass.CONFIRMED_MUTATION]
        assert (writes.attempts, writes.attempt_timeout) == (1, 10)
    assert seen == [1]


def test_a_holder_operation_without_its_fence_is_refused_before_dispatch(api: Api, db: Db) -> None:
    item = api.enqueue()
    (lease,) = api.acquire()
    with QueueClient(api.url, api.keys["worker"], tenant="acme") as client:
        with pytest.raises(AdmissionRefused) as refused:
            client.complete(str(item["item_id"]), worker="w1", fence=0)
        assert refused.value.reason is RefusalReason.MISSING_FENCE
        assert _count(db, "SELECT count(*) AS n FROM item_events WHERE kind = 'completed'") == 0
        client.complete(str(item["item_id"]), worker="w1", fence=int(str(lease["fence"])))
    assert _count(db, "SELECT count(*) AS n FROM work_items WHERE state = 'completed'") == 1


def test_the_worker_requeues_a_failure_through_the_queue_not_a_retry_loop(api: Api) -> None:
    api.enqueue()
    calls: list[int] = []

    def fails(job: Job) -> None:
        calls.append(job.acquisition_count)
        raise RuntimeError("boom")

    results: list[Result] = []
    with QueueClient(api.url, api.keys["worker"], tenant="acme") as client:
        worker = Worker(client, "q", fails, name="w1", wait=0, on_result=results.append)
        worker.run(max_items=1, drain=True)
    assert calls == [1]
    assert [r.outcome for r in results] == [Outcome.TRIAGED]
    (lease,) = api.acquire(wait=5)  # due again after its backoff (1 s)
    assert (lease["fence"], lease["acquisition_count"]) == (2, 2)


def _enqueue_write(client: QueueClient, note: str) -> object:
    return client.enqueue("turns", {"note": note}, idempotency_key=uuid.uuid4().hex)


def test_turn_gate_commits_no_write_after_disconnect(api: Api, db: Db) -> None:
    with QueueClient(api.url, api.keys["worker"], tenant="acme") as client:

        async def scenario() -> None:
            gate = TurnGate()
            async with gate.turn("turn-1") as turn:
                await turn.write(lambda: asyncio.to_thread(_enqueue_write, client, "before"))
                assert turn.disconnect() == "continue-to-outcome-receipt"
                with pytest.raises(OperationStoppedError):
                    await turn.write(lambda: asyncio.to_thread(_enqueue_write, client, "after"))

        asyncio.run(scenario())
    notes = db.execute("SELECT payload->>'note' AS note FROM work_items").fetchall()
    assert notes == [{"note": "before"}]


def test_turn_gate_write_in_flight_at_disconnect_still_reaches_its_outcome(
    api: Api, db: Db
) -> None:
    with QueueClient(api.url, api.keys["worker"], tenant="acme") as client:

        async def scenario() -> None:
            gate = TurnGate()
            entered: list[Turn] = []

            async def slow_write() -> object:
                await asyncio.sleep(0.4)  # outlives the turn's deadline
                return await asyncio.to_thread(_enqueue_write, client, "in-flight")

            async def run_turn() -> None:
                async with gate.turn("turn-2", deadline=0.2) as turn:
                    entered.append(turn)
                    await turn.write(slow_write)

            with pytest.raises(TimeoutError):
                await run_turn()
            (turn,) = entered
            turn.disconnect()
            await turn.settled()
            assert not turn.dispatched[0].cancelled()

        asyncio.run(scenario())
    assert _count(db, "SELECT count(*) AS n FROM work_items") == 1


def test_turn_gate_capacity_rejects_a_turn_beyond_its_limit_and_bounds_the_deadline() -> None:
    async def scenario() -> None:
        gate = TurnGate()
        assert gate.gate.capacity == 4
        release = asyncio.Event()

        async def hold(turn_id: str) -> None:
            async with gate.turn(turn_id, writes=False):
                await release.wait()

        held = [asyncio.create_task(hold(f"t{i}")) for i in range(4)]
        while gate.gate.in_use < 4:
            await asyncio.sleep(0.01)
        with pytest.raises(PermitUnavailableError):
            async with gate.turn("t5", writes=False):
                pass
        release.set()
        await asyncio.gather(*held)
        with pytest.raises(AdmissionRefused):
            async with gate.turn("t6", deadline=3600):
                pass
        with pytest.raises(AdmissionRefused):
            async with gate.turn(None):
                pass

    asyncio.run(scenario())


def test_turn_gate_circuit_opens_after_the_class_threshold_of_failed_turns() -> None:
    # The document's value, as written: the gate's breaker reads it through the loaded policy.
    cell = OPERATION_RELIABILITY_V2["classes"]["interactive-turn"]["circuit-breaking"]
    threshold = cell["failure-threshold"]

    async def scenario() -> None:
        gate = TurnGate()
        for n in range(threshold):
            with pytest.raises(RuntimeError):
                async with gate.turn(f"failing-{n}", writes=False):
                    raise RuntimeError("the model call failed")
        ran: list[str] = []
        with pytest.raises(CircuitOpenError):
            async with gate.turn("next", writes=False):
                ran.append("next")
        # Refused before its body ran, and it holds no permit.
        assert ran == []
        assert gate.gate.in_use == 0

    asyncio.run(scenario())


def test_turn_gate_refuses_a_writing_turn_without_its_id_before_it_runs() -> None:
    async def scenario() -> None:
        gate = TurnGate()
        ran: list[str] = []
        with pytest.raises(AdmissionRefused) as refused:
            async with gate.turn(None):
                ran.append("anonymous")
        assert refused.value.reason is RefusalReason.MISSING_IDEMPOTENCY_KEY
        assert (ran, gate.gate.in_use) == ([], 0)
        # A turn that writes nothing needs no id: it keys no write.
        async with gate.turn(None, writes=False) as turn:
            assert turn.turn_id is None

    asyncio.run(scenario())
