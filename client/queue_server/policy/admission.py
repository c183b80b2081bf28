"""Admission before dispatch: fail closed unless the operation has what its class requires.

`admit_operation` is the one gate every client and server path calls before it dispatches
(docs/decisions/operation-class-policy.md, Decisions 1, 3, 5 and 6). It never performs I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from queue_server.policy.loader import default_policy
from queue_server.policy.model import (
    Backoff,
    Cancellation,
    CircuitBreakerPolicy,
    FailureClass,
    OperationClass,
    QueueReacquisition,
    RefusalReason,
)
from queue_server.policy.values import ReliabilityPolicy

R = RefusalReason


# Named after the refusal of admission (docs/decisions/operation-class-policy.md, Decision
# 6), as the API's problem is; it is an error nonetheless. The server answers it as that
# problem (its own AdmissionRefusedError, with the same detail and extensions).
class AdmissionRefused(Exception):  # noqa: N818
    """The operation was refused before dispatch: it lacks what its reliability class requires."""

    status = 422
    code = "admission-refused"
    title = "Admission refused"

    def __init__(self, reason: RefusalReason, operation_class: str, detail: str) -> None:
        self.reason = reason
        self.operation_class = operation_class
        self.detail = f"{operation_class}: {reason.value}: {detail}"
        self.extensions = {"reason": reason.value, "operation_class": operation_class}
        super().__init__(self.detail)


@dataclass(frozen=True)
class Admission:
    """What an admitted operation may do: the class's envelope narrowed by the caller's request."""

    operation_class: OperationClass
    effecting: bool
    idempotency_key: str | None
    outcome_ref: str | None
    fence: int | None
    deadline_seconds: float
    attempt_timeout_seconds: float
    max_attempts: int
    retryable: tuple[FailureClass, ...]
    jitter: str | None
    circuit_breaker: CircuitBreakerPolicy | None
    concurrency: int
    cancellation: Cancellation


def _seconds(
    value: float | timedelta | None, *, name: str, cls: str, default: float, reason: R
) -> float:
    if value is None:
        return default
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not seconds > 0 or seconds == float("inf"):
        raise AdmissionRefused(R.INVALID_DURATION, cls, f"{name} must be positive and finite")
    if seconds > default:
        raise AdmissionRefused(
            reason, cls, f"{name} {seconds:g}s exceeds the class envelope of {default:g}s"
        )
    return seconds


def _classify(operation_class: OperationClass | str) -> OperationClass:
    try:
        return OperationClass(operation_class)
    except ValueError:
        raise AdmissionRefused(
            R.UNKNOWN_CLASS,
            str(operation_class),
            "every operation is classified into a policy class before dispatch",
        ) from None


def admit_operation(
    operation_class: OperationClass | str,
    *,
    idempotency_key: str | None = None,
    outcome_ref: str | None = None,
    fence: int | None = None,
    current_fence: int | None = None,
    effecting: bool | None = None,
    attempt_timeout: float | timedelta | None = None,
    deadline: float | timedelta | None = None,
    max_attempts: int | None = None,
    concurrency: int | None = None,
    policy: ReliabilityPolicy | None = None,
) -> Admission:
    """Admit an operation before dispatch or raise `AdmissionRefused` naming the reason.

    `effecting=None` takes the class's stance and fails closed: a class whose
    effects are optional is treated as effecting. Durations are seconds or
    `timedelta`; they may only narrow the class's envelope. `current_fence`,
    when the caller knows it, makes a stale fence a refusal here too.
    """
    cls = _classify(operation_class)
    cp = (policy or default_policy()).for_class(cls)
    ident = cp.idempotency_and_fencing

    if effecting is None:
        effecting = ident.effects != "never"
    if effecting and ident.effects == "never":
        raise AdmissionRefused(
            R.EFFECT_FORBIDDEN, cls, "this class is read-only; classify the write separately"
        )
    if not effecting and ident.effects == "always":
        raise AdmissionRefused(
            R.EFFECT_REQUIRED, cls, "this class always has effects; it cannot be admitted as a read"
        )
    if effecting:
        if ident.requires_idempotency_key and not (idempotency_key or "").strip():
            raise AdmissionRefused(
                R.MISSING_IDEMPOTENCY_KEY,
                cls,
                "effecting work needs a non-empty idempotency key before dispatch",
            )
        if ident.requires_outcome_reference and not (outcome_ref or "").strip():
            raise AdmissionRefused(
                R.MISSING_OUTCOME_REFERENCE,
                cls,
                "effecting work needs a stable outcome reference before dispatch",
            )
    if ident.fencing == "monotonic-fence":
        if fence is None or isinstance(fence, bool) or fence < 1:
            raise AdmissionRefused(
                R.MISSING_FENCE, cls, "leased work presents its current monotonic fence"
            )
        if current_fence is not None and fence != current_fence:
            raise AdmissionRefused(
                R.STALE_FENCE,
                cls,
                f"fence {fence} is not the current fence {current_fence}; an expired or "
                "superseded lease grants no authority",
            )

    deadline_s = _seconds(
        deadline,
        name="deadline",
        cls=cls,
        default=cp.deadline.seconds,
        reason=R.DEADLINE_EXCEEDS_POLICY,
    )
    timeout_s = _seconds(
        attempt_timeout,
        name="attempt timeout",
        cls=cls,
        default=cp.attempt_timeout.seconds,
        reason=R.ATTEMPT_TIMEOUT_EXCEEDS_POLICY,
    )
    if timeout_s > deadline_s:
        raise AdmissionRefused(
            R.ATTEMPT_TIMEOUT_EXCEEDS_DEADLINE,
            cls,
            f"attempt timeout {timeout_s:g}s does not fit the deadline {deadline_s:g}s",
        )

    retry = cp.retry
    allowed_attempts = 1 if isinstance(retry, QueueReacquisition) else retry.max_attempts
    attempts = allowed_attempts if max_attempts is None else max_attempts
    if not 1 <= attempts <= allowed_attempts:
        raise AdmissionRefused(
            R.ATTEMPTS_EXCEED_POLICY,
            cls,
            f"{attempts} attempts requested; the class allows 1 to {allowed_attempts}",
        )
    limit = cp.concurrency.limit if concurrency is None else concurrency
    if not 1 <= limit <= cp.concurrency.limit:
        raise AdmissionRefused(
            R.CONCURRENCY_EXCEEDS_POLICY,
            cls,
            f"concurrency {limit} requested; the class allows 1 to {cp.concurrency.limit}",
        )

    backoff = cp.backoff_and_jitter
    circuit = cp.circuit_breaking
    return Admission(
        operation_class=cls,
        effecting=effecting,
        idempotency_key=idempotency_key if effecting else None,
        outcome_ref=outcome_ref if effecting else None,
        fence=fence,
        deadline_seconds=deadline_s,
        attempt_timeout_seconds=timeout_s,
        max_attempts=attempts,
        retryable=() if isinstance(retry, QueueReacquisition) else retry.retryable,
        jitter=backoff.jitter if isinstance(backoff, Backoff) else None,
        circuit_breaker=circuit if isinstance(circuit, CircuitBreakerPolicy) else None,
        concurrency=limit,
        cancellation=cp.cancellation,
    )


def run_key(artifact_version: str, verifier_version: str) -> str:
    """The run key of artifact verification: the immutable artifact and verifier versions."""
    if not artifact_version.strip() or not verifier_version.strip():
        raise ValueError("a run key needs both an artifact version and a verifier version")
    return f"{artifact_version}+{verifier_version}"
