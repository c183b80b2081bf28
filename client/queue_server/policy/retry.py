"""Retry and backoff built from a class's cells with tenacity
(docs/decisions/operation-class-policy.md, Decision 3).

No hand-written retry loop exists in this package: `retrying_for` configures
tenacity from the `retry`, `backoff-and-jitter` and `deadline` cells, and
`backoff_schedule` derives the watcher outbox's persisted delays from the same
wait strategy, so the schedule a delivery persists is the one it would wait.
"""

from __future__ import annotations

import errno
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import httpx
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    stop_before_delay,
    wait_exponential,
    wait_none,
    wait_random_exponential,
)
from tenacity.wait import wait_base

from queue_server.policy.errors import PolicyError
from queue_server.policy.loader import default_policy
from queue_server.policy.model import (
    Backoff,
    Dimension,
    FailureClass,
    OperationClass,
    QueueReacquisition,
    RetryAttempts,
    as_operation_class,
    cell_name,
)
from queue_server.policy.values import ReliabilityPolicy

_TRANSIENT_ERRNOS = frozenset({errno.EAGAIN, errno.EINTR, errno.EBUSY, errno.ETIMEDOUT})


class ClassifiedError(Exception):
    """A failure its raiser has classified explicitly; retryable only if the cell names its class."""

    def __init__(self, failure_class: FailureClass, detail: str = "") -> None:
        self.failure_class = failure_class
        super().__init__(f"{failure_class.value}: {detail}" if detail else failure_class.value)


def transport_failure_kind(exc: BaseException) -> Literal["timeout", "transport"] | None:
    """`timeout` for request timeouts, `transport` for other connection-level failures: httpx's,
    the builtins', and an error that says which it is (`transport_failure`, as the broker's do)."""
    declared = getattr(exc, "transport_failure", None)
    if declared == "timeout" or isinstance(exc, httpx.TimeoutException | TimeoutError):
        return "timeout"
    if declared == "transport" or isinstance(exc, httpx.TransportError | ConnectionError):
        return "transport"
    return None


def classify_failure(exc: BaseException) -> FailureClass | None:
    """The named failure class of an exception, or None when it is not a known transient failure."""
    declared = getattr(exc, "failure_class", None)
    if isinstance(declared, FailureClass):
        return declared
    kind = transport_failure_kind(exc)
    if kind == "timeout":
        return FailureClass.ATTEMPT_TIMEOUT
    # An HTTP answer, from the broker's result or any client's status error.
    code = getattr(getattr(exc, "response", None), "status_code", None)
    code = code if isinstance(code, int) else getattr(exc, "status", None)
    if isinstance(code, int):
        if code == 429:
            return FailureClass.RATE_LIMITED
        if code in (502, 503, 504):
            return FailureClass.DEPENDENCY_UNAVAILABLE
        return None
    if kind == "transport":
        return FailureClass.TRANSPORT_ERROR
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS:
        return FailureClass.TRANSIENT_IO
    return None


def _attempts_cell(
    operation_class: OperationClass | str, policy: ReliabilityPolicy | None
) -> tuple[RetryAttempts, Backoff | None, float]:
    cls = as_operation_class(operation_class)
    cp = (policy or default_policy()).for_class(cls)
    if isinstance(cp.retry, QueueReacquisition):
        raise PolicyError.single(
            cell_name(cls, Dimension.RETRY),
            "no automatic retry loop: re-acquisition is a queue decision that advances the "
            "fence and acquisition count",
        )
    backoff = cp.backoff_and_jitter
    return cp.retry, backoff if isinstance(backoff, Backoff) else None, cp.deadline.seconds


def wait_for(
    operation_class: OperationClass | str, *, policy: ReliabilityPolicy | None = None
) -> wait_base:
    """The tenacity wait strategy of a class: capped exponential, with full jitter or none."""
    _, backoff, _ = _attempts_cell(operation_class, policy)
    if backoff is None:
        return wait_none()
    if backoff.jitter == "full":
        return wait_random_exponential(
            multiplier=backoff.initial_seconds,
            max=backoff.max_seconds,
            exp_base=backoff.multiplier,
        )
    return wait_exponential(
        multiplier=backoff.initial_seconds, max=backoff.max_seconds, exp_base=backoff.multiplier
    )


def _retry_kwargs(
    operation_class: OperationClass | str, policy: ReliabilityPolicy | None
) -> dict[str, Any]:
    retry, _, deadline = _attempts_cell(operation_class, policy)
    retryable = frozenset(retry.retryable)
    return {
        # The deadline bounds the whole operation: no attempt starts past it.
        "stop": stop_after_attempt(retry.max_attempts) | stop_before_delay(deadline),
        "wait": wait_for(operation_class, policy=policy),
        "retry": retry_if_exception(lambda exc: classify_failure(exc) in retryable),
        "reraise": True,
    }


def retrying_for(
    operation_class: OperationClass | str,
    *,
    policy: ReliabilityPolicy | None = None,
    sleep: Callable[[float], None] | None = None,
) -> Retrying:
    """A tenacity `Retrying` configured from the class's cells; the last failure is re-raised."""
    kwargs = _retry_kwargs(operation_class, policy)
    if sleep is not None:
        kwargs["sleep"] = sleep
    return Retrying(**kwargs)


def async_retrying_for(
    operation_class: OperationClass | str,
    *,
    policy: ReliabilityPolicy | None = None,
    sleep: Callable[[float], Awaitable[None]] | None = None,
) -> AsyncRetrying:
    """A tenacity `AsyncRetrying` configured from the class's cells; the last failure is re-raised."""
    kwargs = _retry_kwargs(operation_class, policy)
    if sleep is not None:
        kwargs["sleep"] = sleep
    return AsyncRetrying(**kwargs)


def backoff_schedule(
    operation_class: OperationClass | str = OperationClass.WATCHER_DELIVERY,
    *,
    policy: ReliabilityPolicy | None = None,
) -> list[float]:
    """The deterministic delays (seconds) after attempts 1..n-1; only an unjittered class has one."""
    retry, backoff, _ = _attempts_cell(operation_class, policy)
    cls = as_operation_class(operation_class)
    if backoff is None or backoff.jitter != "none":
        raise PolicyError.single(
            cell_name(cls, Dimension.BACKOFF_AND_JITTER),
            "only an unjittered backoff has a replay-stable schedule",
        )
    retrying = retrying_for(cls, policy=policy)
    wait = retrying.wait
    delays = []
    for attempt in range(1, retry.max_attempts):
        state = RetryCallState(retry_object=retrying, fn=None, args=(), kwargs={})
        state.attempt_number = attempt
        delays.append(float(wait(state)))
    return delays
