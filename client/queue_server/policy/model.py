"""The typed cells of `operation-reliability.v2`: six operation classes by ten dimensions.

Every cell is a frozen pydantic model whose JSON keys are the kebab-case names used in the
policy document. A mechanism that is meaningless at a boundary is `NotApplicable` with a
reason; omission is never valid (docs/decisions/operation-class-policy.md, Decision 2).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

from queue_server.policy.errors import PolicyError

POLICY_NAME = "operation-reliability.v2"
MAX_ATTEMPTS = 5


class OperationClass(StrEnum):
    """Every operation is classified as one of these before dispatch (Decision 1)."""

    INTERACTIVE_TURN = "interactive-turn"
    READ_ONLY_DEPENDENCY = "read-only-dependency"
    CONFIRMED_MUTATION = "confirmed-mutation"
    DURABLE_LEASED_WORK = "durable-leased-work"
    WATCHER_DELIVERY = "watcher-delivery"
    ARTIFACT_VERIFICATION = "artifact-verification"


class Dimension(StrEnum):
    """The ten dimensions every class states a value for (Decision 2)."""

    DEADLINE = "deadline"
    ATTEMPT_TIMEOUT = "attempt-timeout"
    RETRY = "retry"
    BACKOFF_AND_JITTER = "backoff-and-jitter"
    CIRCUIT_BREAKING = "circuit-breaking"
    BACKPRESSURE = "backpressure"
    CONCURRENCY = "concurrency"
    IDEMPOTENCY_AND_FENCING = "idempotency-and-fencing"
    CANCELLATION = "cancellation"
    RESUMABILITY = "resumability"


class FailureClass(StrEnum):
    """Named failure classes a retry cell may declare retryable (Decision 3)."""

    ATTEMPT_TIMEOUT = "attempt-timeout"
    TRANSPORT_ERROR = "transport-error"
    DEPENDENCY_UNAVAILABLE = "dependency-unavailable"
    RATE_LIMITED = "rate-limited"
    TRANSIENT_IO = "transient-io"


class RefusalReason(StrEnum):
    """Why `admit_operation` refused an operation before dispatch."""

    UNKNOWN_CLASS = "unknown-class"
    MISSING_IDEMPOTENCY_KEY = "missing-idempotency-key"
    MISSING_OUTCOME_REFERENCE = "missing-outcome-reference"
    MISSING_FENCE = "missing-fence"
    STALE_FENCE = "stale-fence"
    EFFECT_FORBIDDEN = "effect-forbidden"
    EFFECT_REQUIRED = "effect-required"
    INVALID_DURATION = "invalid-duration"
    DEADLINE_EXCEEDS_POLICY = "deadline-exceeds-policy"
    ATTEMPT_TIMEOUT_EXCEEDS_POLICY = "attempt-timeout-exceeds-policy"
    ATTEMPT_TIMEOUT_EXCEEDS_DEADLINE = "attempt-timeout-exceeds-deadline"
    ATTEMPTS_EXCEED_POLICY = "attempts-exceed-policy"
    CONCURRENCY_EXCEEDS_POLICY = "concurrency-exceeds-policy"


def as_operation_class(value: OperationClass | str) -> OperationClass:
    """The operation class named by `value`; an unknown name is a `PolicyError`."""
    try:
        return OperationClass(value)
    except ValueError:
        raise PolicyError.single(str(value), "unknown operation class") from None


def cell_name(operation_class: str, dimension: str) -> str:
    """The name of a cell in messages and reports: `class/dimension`."""
    return f"{operation_class}/{dimension}"


def _kebab(name: str) -> str:
    return name.replace("_", "-")


Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
PositiveCount = Annotated[StrictInt, Field(ge=1)]


class Cell(BaseModel):
    """One cell of the matrix; JSON keys are kebab-case and unknown keys are errors."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=_kebab,
        populate_by_name=True,
        defer_build=True,
    )


def describe_cell(cell: Cell) -> str:
    """A one-line rendering of a cell for tables (`queue-server policy show`)."""
    if isinstance(cell, NotApplicable):
        return f"not-applicable: {cell.not_applicable}"
    values = cell.model_dump(mode="json", by_alias=True, exclude={"note"})
    parts = []
    for key, value in values.items():
        if isinstance(value, list):
            value = ",".join(str(v) for v in value) or "-"
        parts.append(f"{key}={value}")
    return " ".join(parts)


class NotApplicable(Cell):
    """The mechanism is meaningless at this boundary; the reason says why."""

    not_applicable: str

    @field_validator("not_applicable")
    @classmethod
    def _reason_is_given(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("not-applicable needs a reason")
        return value


class Deadline(Cell):
    """Bounds the whole operation, every attempt and backoff included."""

    seconds: Seconds
    note: str = ""


class AttemptTimeout(Cell):
    """Bounds one attempt; it must fit inside the deadline."""

    seconds: Seconds
    on_timeout: Literal[
        "fail-attempt", "return-pending-receipt", "lease-expires", "stop-at-checkpoint"
    ]
    note: str = ""


class RetryAttempts(Cell):
    """Bounded attempts: the first attempt counts; only named failure classes are retried."""

    kind: Literal["attempts"] = "attempts"
    max_attempts: StrictInt
    retryable: tuple[FailureClass, ...] = ()
    note: str = ""


class QueueReacquisition(Cell):
    """No retry loop: each zero-delay re-acquisition is a queue decision that advances fence and count."""

    kind: Literal["queue-reacquisition"] = "queue-reacquisition"
    max_acquisitions: PositiveCount
    delay_seconds: float = 0.0
    advances_fence: bool = True
    advances_acquisition_count: bool = True
    on_exhausted: Literal["quarantine"] = "quarantine"
    note: str = ""


class Backoff(Cell):
    """Capped exponential backoff: delay after attempt k is min(initial * multiplier**(k-1), max)."""

    strategy: Literal["capped-exponential"] = "capped-exponential"
    initial_seconds: Seconds
    multiplier: Annotated[float, Field(ge=1, allow_inf_nan=False)]
    max_seconds: Seconds
    jitter: Literal["full", "none"]
    persisted_schedule: bool = False
    note: str = ""


class RequeueDelay(Cell):
    """Leased work's only delay: a holder may ask requeue or triage to hold the item this long
    (at most `max-seconds`); re-acquisition stays a zero-delay queue decision after it."""

    kind: Literal["requeue-delay"] = "requeue-delay"
    max_seconds: Seconds
    jitter: Literal["none"] = "none"
    note: str = ""


class CircuitBreakerPolicy(Cell):
    """The canonical circuit breaker's configuration for a class."""

    kind: Literal["circuit-breaker"] = "circuit-breaker"
    failure_threshold: PositiveCount
    reset_timeout_seconds: Seconds
    half_open_max_calls: PositiveCount = 1
    note: str = ""


class IsolationBoundary(Cell):
    """Failure isolation by a durable mechanism instead of a remote circuit."""

    kind: Literal["isolation-boundary"] = "isolation-boundary"
    mechanisms: tuple[str, ...] = Field(min_length=1)
    # The isolation budget is the retry cell's (max-acquisitions, max-attempts); a document
    # may state it (it must then be the same) or leave it out, so one edit raises both.
    budget: PositiveCount | None = Field(default=None, exclude_if=lambda value: value is None)
    on_exhausted: Literal["quarantine", "dead-letter"]
    note: str = ""


class Backpressure(Cell):
    """Finite backpressure: what happens when the class is at capacity."""

    mechanism: Literal["reject-at-capacity", "durable-backlog-cap", "outbox-cap"]
    max_queued: Annotated[StrictInt, Field(ge=0)]
    reserve_for_active: bool = False
    note: str = ""


class Concurrency(Cell):
    """A finite concurrency limit; cloud concurrency needs a human spend approval."""

    limit: int
    scope: Literal["local", "cloud"] = "local"
    spend_approval: str | None = None
    # The most a human spend approval may raise the class's concurrency to; None: no
    # approval may raise it.
    # Left out of the document when unset, so documents without it keep their digest.
    max_approved: Annotated[StrictInt, Field(ge=2)] | None = Field(
        default=None, exclude_if=lambda value: value is None
    )
    note: str = ""

    @field_validator("limit", mode="before")
    @classmethod
    def _limit_is_finite(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"concurrency must be finite: a positive integer, got {value!r}")
        return value


class IdempotencyAndFencing(Cell):
    """Whether the class has effects, and the identity they need before dispatch."""

    effects: Literal["never", "optional", "always"]
    requires_idempotency_key: bool
    requires_outcome_reference: bool
    fencing: Literal["monotonic-fence", "exclusive-grant", "not-applicable"]
    exclusive_grant: str | None = None
    durable_receipt: bool = False
    note: str = ""


class Cancellation(Cell):
    """A disconnect before dispatch stops; a dispatched effect is never represented as cancelled."""

    before_dispatch: Literal["stop"]
    after_dispatch: Literal[
        "discard-read", "continue-to-outcome-receipt", "return-to-checkpoint", "return-to-outbox"
    ]
    disconnect_authority: bool = False
    note: str = ""

    @field_validator("after_dispatch", mode="before")
    @classmethod
    def _never_cancelled(cls, value: Any) -> Any:
        if isinstance(value, str) and value.startswith("cancel"):
            raise ValueError(
                "a dispatched effect is never represented as cancelled: it continues to an "
                "outcome receipt or returns to its checkpoint/outbox"
            )
        return value


class Resumability(Cell):
    """How interrupted work resumes, and the identity it resumes under."""

    mechanism: Literal[
        "durable-receipt-replay",
        "lease-expiry-and-ledger-replay",
        "durable-outbox-replay",
        "per-item-checkpoints",
    ]
    identity: str
    note: str = ""


class ClassPolicy(BaseModel):
    """The ten cells of one operation class."""

    model_config = ConfigDict(
        frozen=True,
        extra="forbid",
        alias_generator=_kebab,
        populate_by_name=True,
        defer_build=True,
    )

    deadline: Deadline
    attempt_timeout: AttemptTimeout
    retry: RetryAttempts | QueueReacquisition
    backoff_and_jitter: Backoff | RequeueDelay | NotApplicable
    circuit_breaking: CircuitBreakerPolicy | IsolationBoundary | NotApplicable
    backpressure: Backpressure
    concurrency: Concurrency
    idempotency_and_fencing: IdempotencyAndFencing
    cancellation: Cancellation
    resumability: Resumability | NotApplicable

    def cell(self, dimension: Dimension) -> Cell:
        value: Cell = getattr(self, dimension.value.replace("-", "_"))
        return value
