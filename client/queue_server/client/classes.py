"""Every SDK call is classified before dispatch; its timeout and retries come from its class.

    reads (GET)                                   read-only-dependency: 2 s attempts, 3 attempts
                                                  with full jitter, only named transient failures
    acquire, heartbeat, complete, requeue, triage durable-leased-work: one attempt, no retry
                                                  loop (an unanswered holder operation lets the
                                                  lease expire; the queue re-acquires under a
                                                  higher fence); admitted with key, item, fence
    enqueue, replay, discard, approvals, tenants,
    keys, receipts, abandon                       confirmed-mutation: one attempt (a timeout is
                                                  not permission to retry a write; resend the
                                                  same Idempotency-Key to find its outcome)
    verification runs: start, checkpoint, marker  artifact-verification: transient I/O only

An effecting call carries one Idempotency-Key for all its attempts, and is retried
only when its class allows it. The client's `attempts` and `timeout` options may
lower a class's values, never raise them.
"""

from __future__ import annotations

from dataclasses import dataclass

from tenacity import RetryCallState
from tenacity.wait import wait_base, wait_none

from queue_server.client import errors
from queue_server.policy import FailureClass, OperationClass, ReliabilityPolicy, classify_failure
from queue_server.policy.model import RetryAttempts
from queue_server.policy.retry import wait_for

RO = OperationClass.READ_ONLY_DEPENDENCY
CM = OperationClass.CONFIRMED_MUTATION
LW = OperationClass.DURABLE_LEASED_WORK
AV = OperationClass.ARTIFACT_VERIFICATION
CLASSES = (RO, CM, LW, AV)


@dataclass(frozen=True)
class CallClass:
    """How one class's calls are sent: attempts, what is retried, per-attempt timeout, deadline."""

    operation: OperationClass
    attempts: int
    retryable: frozenset[FailureClass]
    attempt_timeout: float
    deadline: float
    backoff: wait_base
    max_wait: float

    def retries(self, exc: BaseException) -> bool:
        """Whether `exc` is retried: the class allows more attempts and names its failure."""
        return self.attempts > 1 and classify_failure(exc) in self.retryable

    def wait(self, state: RetryCallState) -> float:
        """The class's backoff; a 429's Retry-After when it asks for longer (within max_wait)."""
        delay = float(self.backoff(state))
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, errors.ProblemError) and exc.retry_after is not None:
            delay = max(delay, exc.retry_after)
        return min(delay, self.max_wait)


def call_classes(
    policy: ReliabilityPolicy,
    *,
    attempts: int | None = None,
    timeout: float | None = None,
    max_wait: float | None = None,
) -> dict[OperationClass, CallClass]:
    """The SDK's call classes under `policy`; `attempts`, `timeout`, `max_wait` only lower."""
    classes = {}
    for cls in CLASSES:
        cell = policy.for_class(cls)
        retry = cell.retry
        n = retry.max_attempts if isinstance(retry, RetryAttempts) else 1
        retryable = frozenset(retry.retryable) if isinstance(retry, RetryAttempts) else frozenset()
        if attempts is not None:
            n = max(1, min(n, attempts))
        attempt_timeout = cell.attempt_timeout.seconds
        if timeout is not None:
            attempt_timeout = min(attempt_timeout, timeout)
        classes[cls] = CallClass(
            operation=cls,
            attempts=n,
            retryable=retryable,
            attempt_timeout=attempt_timeout,
            deadline=cell.deadline.seconds,
            backoff=wait_for(cls, policy=policy) if n > 1 else wait_none(),
            max_wait=cell.deadline.seconds if max_wait is None else max_wait,
        )
    return classes
