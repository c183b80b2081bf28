"""The one shared circuit breaker: transitions, the cell's configuration, thread and asyncio safety."""

from __future__ import annotations

import asyncio
import threading

import pytest

from queue_server.policy import OperationClass, PolicyError, default_policy
from queue_server.policy.model import CircuitBreakerPolicy
from tests.demonstrators.breaker import CircuitBreaker, CircuitState
from tests.demonstrators.errors import CircuitOpenError


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def state_of(b: CircuitBreaker) -> CircuitState:
    return b.state


def boom() -> None:
    raise ConnectionError("adapter down")


def ok() -> str:
    return "ok"


def breaker(clock: Clock, threshold: int = 3, trials: int = 1) -> CircuitBreaker:
    return CircuitBreaker(
        failure_threshold=threshold, reset_timeout=30, half_open_max_calls=trials, clock=clock
    )


def trip(b: CircuitBreaker, times: int) -> None:
    for _ in range(times):
        with pytest.raises(ConnectionError):
            b.call(boom)


@pytest.mark.parametrize(
    "cls",
    [
        OperationClass.INTERACTIVE_TURN,
        OperationClass.READ_ONLY_DEPENDENCY,
        OperationClass.CONFIRMED_MUTATION,
    ],
)
def test_circuit_breaker_from_cell_opens_after_threshold(cls: OperationClass) -> None:
    cell = default_policy().for_class(cls).circuit_breaking
    assert isinstance(cell, CircuitBreakerPolicy)
    clock = Clock()
    b = CircuitBreaker.for_class(cls, clock=clock)
    assert (b.failure_threshold, b.reset_timeout) == (
        cell.failure_threshold,
        cell.reset_timeout_seconds,
    )
    trip(b, cell.failure_threshold - 1)
    assert state_of(b) is CircuitState.CLOSED
    trip(b, 1)
    assert state_of(b) is CircuitState.OPEN
    clock.now += cell.reset_timeout_seconds
    assert state_of(b) is CircuitState.HALF_OPEN


def test_circuit_breaker_open_rejects_without_calling() -> None:
    b = breaker(Clock())
    trip(b, 3)
    called: list[int] = []
    with pytest.raises(CircuitOpenError):
        b.call(called.append, 1)
    assert called == []


def test_circuit_breaker_half_opens_after_reset_timeout() -> None:
    clock = Clock()
    b = breaker(clock)
    trip(b, 3)
    clock.now += 29.9
    assert state_of(b) is CircuitState.OPEN
    clock.now += 0.1
    assert state_of(b) is CircuitState.HALF_OPEN


def test_circuit_breaker_half_open_success_closes() -> None:
    clock = Clock()
    b = breaker(clock)
    trip(b, 3)
    clock.now += 30
    assert b.call(ok) == "ok"
    assert state_of(b) is CircuitState.CLOSED


def test_circuit_breaker_half_open_failure_reopens() -> None:
    clock = Clock()
    b = breaker(clock)
    trip(b, 3)
    clock.now += 30
    trip(b, 1)
    assert state_of(b) is CircuitState.OPEN
    clock.now += 29
    assert state_of(b) is CircuitState.OPEN  # the reset timeout restarts at the reopening


def test_circuit_breaker_success_resets_failure_count() -> None:
    b = breaker(Clock())
    trip(b, 2)
    b.call(ok)
    trip(b, 2)
    assert state_of(b) is CircuitState.CLOSED


def test_circuit_breaker_ignores_results_from_before_it_opened() -> None:
    clock = Clock()
    b = breaker(clock)
    early = b.before_call()
    trip(b, 3)
    clock.now += 30
    b.record_success(early)  # admitted while closed; must not close the half-open circuit
    assert state_of(b) is CircuitState.HALF_OPEN


def test_circuit_breaker_half_open_admits_one_trial_across_threads() -> None:
    clock = Clock()
    b = breaker(clock)
    trip(b, 3)
    clock.now += 30
    start = threading.Barrier(16)
    admitted: list[int] = []
    rejected: list[int] = []

    def attempt(i: int) -> None:
        start.wait()
        try:
            b.before_call()
        except CircuitOpenError:
            rejected.append(i)
        else:
            admitted.append(i)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(admitted) == 1
    assert len(rejected) == 15


def test_circuit_breaker_async_call_counts_failures() -> None:
    b = breaker(Clock(), threshold=2)

    async def failing() -> None:
        await asyncio.sleep(0)
        raise ConnectionError("adapter down")

    async def run() -> None:
        for _ in range(2):
            with pytest.raises(ConnectionError):
                await b.call_async(failing)
        with pytest.raises(CircuitOpenError):
            await b.call_async(failing)

    asyncio.run(run())
    assert state_of(b) is CircuitState.OPEN


def test_circuit_breaker_cancelled_trial_frees_its_slot() -> None:
    clock = Clock()
    b = breaker(clock)
    trip(b, 3)
    clock.now += 30

    async def hang() -> None:
        await asyncio.sleep(10)

    async def run() -> None:
        task = asyncio.create_task(b.call_async(hang))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert state_of(b) is CircuitState.HALF_OPEN
    assert b.call(ok) == "ok"  # the slot was released, a new trial is admitted
    assert state_of(b) is CircuitState.CLOSED


@pytest.mark.parametrize(
    "cls",
    [
        OperationClass.DURABLE_LEASED_WORK,
        OperationClass.WATCHER_DELIVERY,
        OperationClass.ARTIFACT_VERIFICATION,
    ],
)
def test_circuit_breaker_refuses_class_without_breaker_cell(cls: OperationClass) -> None:
    with pytest.raises(PolicyError) as info:
        CircuitBreaker.for_class(cls)
    assert info.value.cells == (f"{cls.value}/circuit-breaking",)


def test_circuit_breaker_rejects_non_positive_configuration() -> None:
    with pytest.raises(ValueError, match="positive"):
        CircuitBreaker(failure_threshold=0, reset_timeout=1)
