"""Retry and backoff built from the cells with tenacity; the watcher's replay-stable schedule."""

from __future__ import annotations

import asyncio
import errno
import random

import httpx
import pytest
from tenacity import RetryCallState, wait_exponential, wait_random_exponential

from queue_server.policy import (
    ClassifiedError,
    FailureClass,
    OperationClass,
    PolicyError,
    async_retrying_for,
    backoff_schedule,
    classify_failure,
    retrying_for,
    wait_for,
)


class Flaky:
    """Fails with `exc` every time and counts the attempts."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        raise self.exc


def no_sleep(_: float) -> None:
    return None


def state_at(attempt: int) -> RetryCallState:
    state = RetryCallState(
        retry_object=retrying_for("read-only-dependency"), fn=None, args=(), kwargs={}
    )
    state.attempt_number = attempt
    return state


def unavailable() -> ClassifiedError:
    return ClassifiedError(FailureClass.DEPENDENCY_UNAVAILABLE, "503 from the index")


def test_retrying_read_only_dependency_stops_after_three_attempts() -> None:
    flaky = Flaky(unavailable())
    with pytest.raises(ClassifiedError):
        retrying_for("read-only-dependency", sleep=no_sleep)(flaky)
    assert flaky.calls == 3


def test_async_retrying_read_only_dependency_stops_after_three_attempts() -> None:
    calls = 0

    async def read() -> str:
        nonlocal calls
        calls += 1
        raise httpx.ConnectError("refused")

    async def instant(_: float) -> None:
        return None

    async def run() -> None:
        async for attempt in async_retrying_for("read-only-dependency", sleep=instant):
            with attempt:
                await read()

    with pytest.raises(httpx.ConnectError):
        asyncio.run(run())
    assert calls == 3


def test_retrying_watcher_delivery_stops_after_five_attempts() -> None:
    slept: list[float] = []
    flaky = Flaky(TimeoutError("receiver slow"))
    with pytest.raises(TimeoutError):
        retrying_for("watcher-delivery", sleep=slept.append)(flaky)
    assert flaky.calls == 5
    assert slept == backoff_schedule("watcher-delivery")


@pytest.mark.parametrize(
    "cls", [OperationClass.INTERACTIVE_TURN, OperationClass.CONFIRMED_MUTATION]
)
def test_retrying_single_attempt_classes_call_once(cls: OperationClass) -> None:
    flaky = Flaky(unavailable())
    with pytest.raises(ClassifiedError):
        retrying_for(cls, sleep=no_sleep)(flaky)
    assert flaky.calls == 1


def test_retrying_does_not_retry_unnamed_failure_classes() -> None:
    flaky = Flaky(ValueError("a bug, not a transient failure"))
    with pytest.raises(ValueError, match="a bug"):
        retrying_for("read-only-dependency", sleep=no_sleep)(flaky)
    assert flaky.calls == 1


def test_retrying_succeeds_once_the_failure_clears() -> None:
    outcomes: list[BaseException | str] = [unavailable(), unavailable(), "ok"]

    def read() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    assert retrying_for("read-only-dependency", sleep=no_sleep)(read) == "ok"


def test_retrying_artifact_verification_retries_only_transient_io() -> None:
    transient = Flaky(OSError(errno.EAGAIN, "try again"))
    with pytest.raises(OSError, match="try again"):
        retrying_for("artifact-verification", sleep=no_sleep)(transient)
    assert transient.calls == 3
    remote = Flaky(unavailable())
    with pytest.raises(ClassifiedError):
        retrying_for("artifact-verification", sleep=no_sleep)(remote)
    assert remote.calls == 1
    missing = Flaky(FileNotFoundError(errno.ENOENT, "no artifact"))
    with pytest.raises(FileNotFoundError):
        retrying_for("artifact-verification", sleep=no_sleep)(missing)
    assert missing.calls == 1


def test_retrying_for_leased_work_refuses_a_retry_loop() -> None:
    with pytest.raises(PolicyError) as info:
        retrying_for("durable-leased-work")
    assert info.value.cells == ("durable-leased-work/retry",)
    assert "no automatic retry loop" in str(info.value)


def test_read_only_dependency_wait_uses_full_jitter() -> None:
    wait = wait_for("read-only-dependency")
    assert isinstance(wait, wait_random_exponential)
    assert isinstance(retrying_for("read-only-dependency").wait, wait_random_exponential)
    random.seed(7)
    for attempt, cap in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (9, 1.0)]:
        samples = [wait(state_at(attempt)) for _ in range(200)]
        assert all(0 <= s <= cap + 1e-9 for s in samples)
        assert min(samples) < cap * 0.25  # full jitter reaches down to zero
        assert len(set(samples)) > 100


def test_watcher_wait_has_no_jitter_and_matches_schedule() -> None:
    wait = wait_for("watcher-delivery")
    assert isinstance(wait, wait_exponential)
    assert not isinstance(wait, wait_random_exponential)
    assert [wait(state_at(k)) for k in range(1, 5)] == [30.0, 120.0, 480.0, 1920.0]
    assert wait(state_at(9)) == 3600.0  # capped


def test_artifact_verification_wait_is_capped_exponential_without_jitter() -> None:
    wait = wait_for("artifact-verification")
    assert not isinstance(wait, wait_random_exponential)
    assert [wait(state_at(k)) for k in range(1, 6)] == [1.0, 2.0, 4.0, 8.0, 10.0]
    assert backoff_schedule("artifact-verification") == [1.0, 2.0]


def test_watcher_schedule_is_identical_across_calls() -> None:
    first = backoff_schedule("watcher-delivery")
    assert first == [30.0, 120.0, 480.0, 1920.0]
    assert all(backoff_schedule("watcher-delivery") == first for _ in range(20))
    assert backoff_schedule() == first


def test_backoff_schedule_refuses_jittered_class() -> None:
    with pytest.raises(PolicyError) as info:
        backoff_schedule("read-only-dependency")
    assert info.value.cells == ("read-only-dependency/backoff-and-jitter",)
    with pytest.raises(PolicyError):
        backoff_schedule("confirmed-mutation")


def test_classify_failure_maps_known_transient_failures() -> None:
    request = httpx.Request("GET", "https://dep.example/x")

    def status(code: int) -> httpx.HTTPStatusError:
        response = httpx.Response(code, request=request)
        return httpx.HTTPStatusError("status", request=request, response=response)

    assert classify_failure(status(503)) is FailureClass.DEPENDENCY_UNAVAILABLE
    assert classify_failure(status(429)) is FailureClass.RATE_LIMITED
    assert classify_failure(status(404)) is None
    assert classify_failure(status(500)) is None  # a fault of the server: not transient
    assert (
        classify_failure(httpx.ReadTimeout("slow", request=request)) is FailureClass.ATTEMPT_TIMEOUT
    )
    assert classify_failure(httpx.ConnectError("refused")) is FailureClass.TRANSPORT_ERROR
    assert classify_failure(ConnectionResetError()) is FailureClass.TRANSPORT_ERROR
    assert classify_failure(TimeoutError()) is FailureClass.ATTEMPT_TIMEOUT
    assert classify_failure(OSError(errno.EBUSY, "busy")) is FailureClass.TRANSIENT_IO
    assert classify_failure(ValueError()) is None
    assert classify_failure(unavailable()) is FailureClass.DEPENDENCY_UNAVAILABLE


def test_classify_failure_maps_the_transport_brokers_failures_without_importing_it() -> None:
    """The policy ships with the SDK and imports nothing of the server; the broker's errors say
    which kind of transport failure they are, and are classified by that."""
    from queue_server.transport.errors import (
        PolicyRefusedError,
        RequestTimeoutError,
        TransportFailureError,
    )

    assert classify_failure(RequestTimeoutError()) is FailureClass.ATTEMPT_TIMEOUT
    assert classify_failure(TransportFailureError()) is FailureClass.TRANSPORT_ERROR
    assert classify_failure(PolicyRefusedError()) is None
