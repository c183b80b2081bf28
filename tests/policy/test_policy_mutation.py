"""The confirmed-mutation path: one-shot claim, permit gate, circuit, pending receipt, never cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from queue_server.errors import ReceiptConflictError
from queue_server.policy import AdmissionRefused, RefusalReason
from tests.demonstrators.breaker import CircuitBreaker, CircuitState
from tests.demonstrators.errors import CircuitOpenError, PermitUnavailableError
from tests.demonstrators.mutation import (
    ConfirmedMutationPath,
    MutationReport,
    MutationStatus,
    Outcome,
    ReceiptStatus,
)
from tests.demonstrators.permits import PermitGate
from tests.policy_proof.mutation import InMemoryReceiptStore

T = TypeVar("T")


def run(factory: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await factory()

    return asyncio.run(main())


class Effect:
    """A dependency effect that counts dispatches and can wait or fail."""

    def __init__(self, delay: float = 0.0, error: Exception | None = None) -> None:
        self.delay = delay
        self.error = error
        self.dispatched = 0
        self.started = asyncio.Event()

    async def __call__(self) -> Outcome:
        self.dispatched += 1
        self.started.set()
        await asyncio.sleep(self.delay)
        if self.error is not None:
            raise self.error
        return {"charged": 10}


def test_mutation_without_identity_is_refused_before_claim() -> None:
    store, effect = InMemoryReceiptStore(), Effect()
    path = ConfirmedMutationPath()
    with pytest.raises(AdmissionRefused) as info:
        run(lambda: path(store, idempotency_key="k", outcome_ref="", effect=effect))
    assert info.value.reason is RefusalReason.MISSING_OUTCOME_REFERENCE
    assert store.history == []
    assert effect.dispatched == 0
    assert path.gate.in_use == 0


def test_mutation_success_settles_receipt() -> None:
    store, effect = InMemoryReceiptStore(), Effect()
    path = ConfirmedMutationPath()
    report = run(lambda: path(store, idempotency_key="k", outcome_ref="r", effect=effect))
    assert report.status is MutationStatus.SUCCEEDED
    assert report.dispatched
    assert report.receipt is not None
    assert report.receipt.outcome == {"charged": 10}
    assert [r.status for r in store.history] == [ReceiptStatus.PENDING, ReceiptStatus.SUCCEEDED]
    assert path.gate.in_use == 0


def test_mutation_failure_settles_failed_receipt_and_counts_on_circuit() -> None:
    store = InMemoryReceiptStore()
    breaker = CircuitBreaker.for_class("confirmed-mutation")
    path = ConfirmedMutationPath(breaker=breaker)
    for i in range(breaker.failure_threshold):
        effect = Effect(error=ConnectionError("adapter down"))

        async def attempt(e: Effect = effect, n: int = i) -> MutationReport:
            return await path(store, idempotency_key=f"k{n}", outcome_ref=f"r{n}", effect=e)

        report = run(attempt)
        assert report.status is MutationStatus.FAILED
        assert report.receipt is not None
        assert report.receipt.outcome == {"error": "ConnectionError", "detail": "adapter down"}
    assert breaker.state is CircuitState.OPEN


def test_mutation_open_circuit_rejects_without_claim() -> None:
    store, effect = InMemoryReceiptStore(), Effect()
    breaker = CircuitBreaker(failure_threshold=1, reset_timeout=60)
    breaker.record_failure(breaker.before_call())
    path = ConfirmedMutationPath(breaker=breaker)
    with pytest.raises(CircuitOpenError):
        run(lambda: path(store, idempotency_key="k", outcome_ref="r", effect=effect))
    assert store.history == []
    assert effect.dispatched == 0
    assert path.gate.in_use == 0


def test_mutation_same_identity_replay_returns_retained_outcome() -> None:
    store, effect = InMemoryReceiptStore(), Effect()
    path = ConfirmedMutationPath()
    first = run(lambda: path(store, idempotency_key="k", outcome_ref="r", effect=effect))
    again = run(lambda: path(store, idempotency_key="k", outcome_ref="r", effect=effect))
    assert again.replayed
    assert not again.dispatched
    assert again.status is MutationStatus.SUCCEEDED
    assert again.receipt == first.receipt
    assert effect.dispatched == 1
    with pytest.raises(ReceiptConflictError):
        run(lambda: path(store, idempotency_key="other", outcome_ref="r", effect=effect))


def test_mutation_attempt_timeout_returns_pending_receipt_that_settles_later() -> None:
    store, effect = InMemoryReceiptStore(), Effect(delay=0.05)
    path = ConfirmedMutationPath()

    async def scenario() -> None:
        report = await path(
            store, idempotency_key="k", outcome_ref="r", effect=effect, attempt_timeout=0.005
        )
        assert report.status is MutationStatus.PENDING
        assert report.receipt is not None
        assert report.receipt.status is ReceiptStatus.PENDING
        assert path.gate.in_use == 1  # the running effect still holds its permit
        assert report.settlement is not None
        settled = await report.settlement
        assert settled.outcome_ref == "r"
        assert settled.status is ReceiptStatus.SUCCEEDED
        replay = await path(store, idempotency_key="k", outcome_ref="r", effect=effect)
        assert replay.status is MutationStatus.SUCCEEDED

    asyncio.run(scenario())
    assert effect.dispatched == 1
    assert path.gate.in_use == 0


def test_mutation_disconnect_before_dispatch_does_not_dispatch() -> None:
    store, effect = InMemoryReceiptStore(), Effect()
    path = ConfirmedMutationPath()

    async def scenario() -> MutationStatus:
        gone = asyncio.Event()
        gone.set()
        report = await path(
            store, idempotency_key="k", outcome_ref="r", effect=effect, disconnect=gone
        )
        return report.status

    assert run(scenario) is MutationStatus.NOT_DISPATCHED
    assert effect.dispatched == 0
    assert store.history == []


def test_mutation_disconnect_after_dispatch_continues_to_receipt() -> None:
    store = InMemoryReceiptStore()
    path = ConfirmedMutationPath()

    async def scenario() -> None:
        gone = asyncio.Event()
        effect = Effect(delay=0.02)

        async def disconnects() -> Outcome:
            gone.set()
            return await effect()

        report = await path(
            store, idempotency_key="k", outcome_ref="r", effect=disconnects, disconnect=gone
        )
        assert report.status is MutationStatus.PENDING
        assert report.dispatched
        assert report.settlement is not None
        assert (await report.settlement).status is ReceiptStatus.SUCCEEDED

    asyncio.run(scenario())


def test_mutation_caller_cancelled_after_dispatch_still_settles_receipt() -> None:
    store = InMemoryReceiptStore()
    path = ConfirmedMutationPath()

    async def scenario() -> None:
        effect = Effect(delay=0.02)
        caller = asyncio.create_task(
            path(store, idempotency_key="k", outcome_ref="r", effect=effect)
        )
        await effect.started.wait()
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        receipt = await store.get("r")
        for _ in range(200):
            receipt = await store.get("r")
            if receipt is not None and receipt.status is not ReceiptStatus.PENDING:
                break
            await asyncio.sleep(0.005)
        assert receipt is not None
        assert receipt.status is ReceiptStatus.SUCCEEDED
        assert receipt.outcome == {"charged": 10}

    asyncio.run(scenario())
    assert path.gate.in_use == 0


def test_mutation_ninth_concurrent_mutation_is_rejected_without_claim() -> None:
    store = InMemoryReceiptStore()
    path = ConfirmedMutationPath(gate=PermitGate.for_class("confirmed-mutation"))

    async def scenario() -> None:
        release = asyncio.Event()

        async def held() -> Outcome:
            await release.wait()
            return {"ok": True}

        running = [
            asyncio.create_task(
                path(store, idempotency_key=f"k{i}", outcome_ref=f"r{i}", effect=held)
            )
            for i in range(8)
        ]
        while path.gate.in_use < 8:
            await asyncio.sleep(0)
        with pytest.raises(PermitUnavailableError):
            await path(store, idempotency_key="k9", outcome_ref="r9", effect=held)
        assert await store.get("r9") is None
        release.set()
        reports = await asyncio.gather(*running)
        assert all(r.status is MutationStatus.SUCCEEDED for r in reports)

    asyncio.run(scenario())
    assert path.gate.in_use == 0


def test_receipt_store_settles_once() -> None:
    store = InMemoryReceiptStore()

    async def scenario() -> None:
        await store.claim(idempotency_key="k", outcome_ref="r")
        await store.settle("r", ReceiptStatus.SUCCEEDED, {"a": 1})
        await store.settle("r", ReceiptStatus.SUCCEEDED, {"a": 1})  # same settlement: no-op
        with pytest.raises(ReceiptConflictError):
            await store.settle("r", ReceiptStatus.FAILED, {"a": 2})
        with pytest.raises(ValueError, match="succeeded or failed"):
            await store.settle("r", ReceiptStatus.PENDING, {})

    asyncio.run(scenario())
