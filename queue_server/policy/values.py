"""The values each enforcement point reads from the loaded policy, one small view per class.

    policy.leased_work.attempt_cap      the server's acquisition budget ceiling
    policy.leased_work.attempt_timeout  the longest lease TTL
    policy.leased_work.deadline         the longest life of one lease, from its acquisition
    policy.leased_work.backoff_cap      the longest requeue / triage delay
    policy.leased_work.max_approved     the most a spend approval may raise a queue to
    policy.delivery.outbox_cap          pending deliveries per watcher
    policy.delivery.retryable           the failure classes a delivery retries
    ...

Each view is a frozen dataclass built from the class's cells; `cell(field)`
names the cell a value comes from (`class/dimension`) for refusals and logs.
A caller never reads a cell's JSON directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from queue_server.policy.model import ClassPolicy, FailureClass


class _View:
    CLASS: ClassVar[str]
    # field -> the dimension it is read from
    CELLS: ClassVar[dict[str, str]]

    @classmethod
    def cell(cls, field: str) -> str:
        """The policy cell (`class/dimension`) that `field` is read from."""
        return f"{cls.CLASS}/{cls.CELLS[field]}"


def _attempts(cp: ClassPolicy) -> tuple[int, tuple[FailureClass, ...]]:
    from queue_server.policy.model import RetryAttempts

    retry = cp.retry
    if isinstance(retry, RetryAttempts):
        return retry.max_attempts, retry.retryable
    return 1, ()


def _backoff(cp: ClassPolicy) -> tuple[float, float, float]:
    """(initial, multiplier, cap) of the class's backoff; zeros where it has none."""
    from queue_server.policy.model import Backoff, RequeueDelay

    cell = cp.backoff_and_jitter
    if isinstance(cell, Backoff):
        return cell.initial_seconds, cell.multiplier, cell.max_seconds
    if isinstance(cell, RequeueDelay):
        return 0.0, 1.0, cell.max_seconds
    return 0.0, 1.0, 0.0


def _circuit(cp: ClassPolicy) -> tuple[int, float]:
    from queue_server.policy.model import CircuitBreakerPolicy

    cell = cp.circuit_breaking
    if isinstance(cell, CircuitBreakerPolicy):
        return cell.failure_threshold, cell.reset_timeout_seconds
    return 0, 0.0


@dataclass(frozen=True, slots=True)
class LeasedWork(_View):
    """durable-leased-work: what the server and the workers enforce on a lease."""

    CLASS: ClassVar[str] = "durable-leased-work"
    CELLS: ClassVar[dict[str, str]] = {
        "attempt_cap": "retry",
        "attempt_timeout": "attempt-timeout",
        "deadline": "deadline",
        "backoff_cap": "backoff-and-jitter",
        "backlog_cap": "backpressure",
        "concurrency": "concurrency",
        "max_approved": "concurrency",
    }

    attempt_cap: int  # max acquisitions of one item (item, tenant default, replay)
    attempt_timeout: float  # the longest lease TTL, seconds
    deadline: float  # the longest life of one lease from its acquisition, seconds
    backoff_cap: float  # the longest delay a requeue or triage(requeue) may ask, seconds
    backlog_cap: int  # the largest tenant backlog cap
    concurrency: int  # leases of one local worker at once
    # The most a spend approval may raise a queue's concurrency to; the base limit when the
    # policy names none (no approval may raise it).
    max_approved: int

    @classmethod
    def of(cls, cp: ClassPolicy) -> LeasedWork:
        from queue_server.policy.model import QueueReacquisition

        retry = cp.retry
        cap = retry.max_acquisitions if isinstance(retry, QueueReacquisition) else 1
        return cls(
            attempt_cap=cap,
            attempt_timeout=cp.attempt_timeout.seconds,
            deadline=cp.deadline.seconds,
            backoff_cap=_backoff(cp)[2],
            backlog_cap=cp.backpressure.max_queued,
            concurrency=cp.concurrency.limit,
            max_approved=cp.concurrency.max_approved or cp.concurrency.limit,
        )


@dataclass(frozen=True, slots=True)
class Delivery(_View):
    """watcher-delivery: what the deliverer and the outbox enforce."""

    CLASS: ClassVar[str] = "watcher-delivery"
    CELLS: ClassVar[dict[str, str]] = {
        "max_attempts": "retry",
        "retryable": "retry",
        "outbox_cap": "backpressure",
        "concurrency": "concurrency",
        "attempt_timeout": "attempt-timeout",
        "deadline": "deadline",
        "backoff_initial": "backoff-and-jitter",
        "backoff_multiplier": "backoff-and-jitter",
        "backoff_cap": "backoff-and-jitter",
    }

    max_attempts: int
    retryable: frozenset[FailureClass]
    outbox_cap: int  # pending deliveries per watcher
    concurrency: int  # deliveries in flight at once
    attempt_timeout: float
    deadline: float  # the longest a delivery may stay undelivered, seconds
    backoff_initial: float
    backoff_multiplier: float
    backoff_cap: float

    @classmethod
    def of(cls, cp: ClassPolicy) -> Delivery:
        attempts, retryable = _attempts(cp)
        initial, multiplier, cap = _backoff(cp)
        return cls(
            max_attempts=attempts,
            retryable=frozenset(retryable),
            outbox_cap=cp.backpressure.max_queued,
            concurrency=cp.concurrency.limit,
            attempt_timeout=cp.attempt_timeout.seconds,
            deadline=cp.deadline.seconds,
            backoff_initial=initial,
            backoff_multiplier=multiplier,
            backoff_cap=cap,
        )


@dataclass(frozen=True, slots=True)
class Verification(_View):
    """artifact-verification: what the runs API and the runner enforce."""

    CLASS: ClassVar[str] = "artifact-verification"
    CELLS: ClassVar[dict[str, str]] = {
        "deadline": "deadline",
        "attempt_timeout": "attempt-timeout",
        "max_attempts": "retry",
        "retryable": "retry",
        "concurrency": "concurrency",
    }

    deadline: float  # the longest a run may stay running, seconds
    attempt_timeout: float
    max_attempts: int
    retryable: frozenset[FailureClass]
    concurrency: int  # running runs per tenant

    @classmethod
    def of(cls, cp: ClassPolicy) -> Verification:
        attempts, retryable = _attempts(cp)
        return cls(
            deadline=cp.deadline.seconds,
            attempt_timeout=cp.attempt_timeout.seconds,
            max_attempts=attempts,
            retryable=frozenset(retryable),
            concurrency=cp.concurrency.limit,
        )


@dataclass(frozen=True, slots=True)
class Mutation(_View):
    """confirmed-mutation: the bridge's gate, circuit and timeouts; the receipts' deadline."""

    CLASS: ClassVar[str] = "confirmed-mutation"
    CELLS: ClassVar[dict[str, str]] = {
        "deadline": "deadline",
        "attempt_timeout": "attempt-timeout",
        "max_attempts": "retry",
        "concurrency": "concurrency",
        "failure_threshold": "circuit-breaking",
        "reset_timeout": "circuit-breaking",
    }

    deadline: float  # a receipt still pending after this is stale
    attempt_timeout: float
    max_attempts: int
    concurrency: int  # the permit gate
    failure_threshold: int
    reset_timeout: float

    @classmethod
    def of(cls, cp: ClassPolicy) -> Mutation:
        threshold, reset = _circuit(cp)
        return cls(
            deadline=cp.deadline.seconds,
            attempt_timeout=cp.attempt_timeout.seconds,
            max_attempts=_attempts(cp)[0],
            concurrency=cp.concurrency.limit,
            failure_threshold=threshold,
            reset_timeout=reset,
        )


@dataclass(frozen=True, slots=True)
class Dependency(_View):
    """read-only-dependency: reads, including the SDK's reads of the queue server."""

    CLASS: ClassVar[str] = "read-only-dependency"
    CELLS: ClassVar[dict[str, str]] = {
        "deadline": "deadline",
        "attempt_timeout": "attempt-timeout",
        "max_attempts": "retry",
        "retryable": "retry",
        "backoff_initial": "backoff-and-jitter",
        "backoff_cap": "backoff-and-jitter",
        "concurrency": "concurrency",
    }

    deadline: float
    attempt_timeout: float
    max_attempts: int
    retryable: frozenset[FailureClass]
    backoff_initial: float
    backoff_cap: float
    concurrency: int

    @classmethod
    def of(cls, cp: ClassPolicy) -> Dependency:
        attempts, retryable = _attempts(cp)
        initial, _, cap = _backoff(cp)
        return cls(
            deadline=cp.deadline.seconds,
            attempt_timeout=cp.attempt_timeout.seconds,
            max_attempts=attempts,
            retryable=frozenset(retryable),
            backoff_initial=initial,
            backoff_cap=cap,
            concurrency=cp.concurrency.limit,
        )


@dataclass(frozen=True, slots=True)
class Turn(_View):
    """interactive-turn: the turn gate."""

    CLASS: ClassVar[str] = "interactive-turn"
    CELLS: ClassVar[dict[str, str]] = {
        "deadline": "deadline",
        "attempt_timeout": "attempt-timeout",
        "concurrency": "concurrency",
    }

    deadline: float
    attempt_timeout: float
    concurrency: int

    @classmethod
    def of(cls, cp: ClassPolicy) -> Turn:
        return cls(
            deadline=cp.deadline.seconds,
            attempt_timeout=cp.attempt_timeout.seconds,
            concurrency=cp.concurrency.limit,
        )
