"""The loaded policy (`ReliabilityPolicy`) and the values each enforcement point reads from it,
one small view per class:

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

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from queue_server.policy.model import (
    Backoff,
    Cell,
    ClassPolicy,
    Dimension,
    FailureClass,
    OperationClass,
    QueueReacquisition,
    RequeueDelay,
    RetryAttempts,
    as_operation_class,
    describe_cell,
)


class _View:
    CLASS: ClassVar[str]
    # field -> the dimension it is read from
    CELLS: ClassVar[dict[str, str]]

    @classmethod
    def cell(cls, field: str) -> str:
        """The policy cell (`class/dimension`) that `field` is read from."""
        return f"{cls.CLASS}/{cls.CELLS[field]}"


def _attempts(cp: ClassPolicy) -> tuple[int, tuple[FailureClass, ...]]:
    retry = cp.retry
    if isinstance(retry, RetryAttempts):
        return retry.max_attempts, retry.retryable
    return 1, ()


def _backoff(cp: ClassPolicy) -> tuple[float, float, float]:
    """(initial, multiplier, cap) of the class's backoff; zeros where it has none."""
    cell = cp.backoff_and_jitter
    if isinstance(cell, Backoff):
        return cell.initial_seconds, cell.multiplier, cell.max_seconds
    if isinstance(cell, RequeueDelay):
        return 0.0, 1.0, cell.max_seconds
    return 0.0, 1.0, 0.0


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
    """confirmed-mutation: the receipts' deadline and the mutation gate's size."""

    CLASS: ClassVar[str] = "confirmed-mutation"
    CELLS: ClassVar[dict[str, str]] = {"deadline": "deadline", "concurrency": "concurrency"}

    deadline: float  # a receipt still pending after this is stale
    concurrency: int  # the permit gate

    @classmethod
    def of(cls, cp: ClassPolicy) -> Mutation:
        return cls(deadline=cp.deadline.seconds, concurrency=cp.concurrency.limit)


@dataclass(frozen=True)
class ReliabilityPolicy:
    """The loaded, validated policy: every class has all ten cells.

    `name` is the document's `version` (the built-in's is `operation-reliability.v2`; a
    changed document names one of its own), `source` says where it was loaded from
    ("built-in" or a file path); `version` and `digest` identify the loaded document in
    GET /v1/policy, /readyz, the policy history and start-up logs.
    The typed views (`leased_work`, `delivery`, ...) are the values each
    enforcement point reads.
    """

    name: str
    classes: Mapping[OperationClass, ClassPolicy]
    source: str = "built-in"

    def for_class(self, operation_class: OperationClass | str) -> ClassPolicy:
        return self.classes[as_operation_class(operation_class)]

    def cell(self, operation_class: OperationClass | str, dimension: Dimension | str) -> Cell:
        return self.for_class(operation_class).cell(Dimension(dimension))

    def rows(self) -> list[tuple[str, str, str]]:
        """(class, dimension, one-line value) for every cell, in matrix order."""
        return [
            (c.value, d.value, describe_cell(self.classes[c].cell(d)))
            for c in OperationClass
            for d in Dimension
        ]

    def as_document(self) -> dict[str, Any]:
        """The policy as a JSON-ready dict (`policy show --json`); `load_policy` accepts it back."""
        document: dict[str, Any] = {"version": self.name}
        document["dimensions"] = [d.value for d in Dimension]
        document["classes"] = {
            c.value: self.classes[c].model_dump(mode="json", by_alias=True) for c in OperationClass
        }
        return document

    @property
    def version(self) -> str:
        """The document's own name for itself: a change is a version."""
        return self.name

    @property
    def digest(self) -> str:
        """sha256 of the canonical JSON of the document: two processes with the same digest
        enforce the same cells."""
        canonical = json.dumps(self.as_document(), sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()

    @property
    def sha256(self) -> str:
        """The digest's hex part, as the policy history keeps it."""
        return self.digest.removeprefix("sha256:")

    def loaded(self) -> dict[str, str]:
        """What was loaded, for GET /v1/policy, /readyz and start-up logs."""
        return {
            "version": self.version,
            "digest": self.digest,
            "source": self.source if self.source in ("built-in", "published") else "file",
        }

    def describe(self) -> str:
        """One line for start-up logs: version, source and a short digest."""
        return f"{self.version} ({self.source}, {self.digest[:19]})"

    # -- the values each enforcement point reads ----------------------------------

    @property
    def leased_work(self) -> LeasedWork:
        return LeasedWork.of(self.for_class(OperationClass.DURABLE_LEASED_WORK))

    @property
    def delivery(self) -> Delivery:
        return Delivery.of(self.for_class(OperationClass.WATCHER_DELIVERY))

    @property
    def verification(self) -> Verification:
        return Verification.of(self.for_class(OperationClass.ARTIFACT_VERIFICATION))

    @property
    def mutation(self) -> Mutation:
        return Mutation.of(self.for_class(OperationClass.CONFIRMED_MUTATION))
