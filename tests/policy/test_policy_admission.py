"""admit_operation: fail closed before dispatch, naming the reason."""

from __future__ import annotations

from datetime import timedelta

import pytest

from queue_server.policy import (
    AdmissionRefused,
    OperationClass,
    RefusalReason,
    admit_operation,
    default_policy,
)

EFFECTING = [
    OperationClass.INTERACTIVE_TURN,
    OperationClass.CONFIRMED_MUTATION,
    OperationClass.DURABLE_LEASED_WORK,
    OperationClass.WATCHER_DELIVERY,
    OperationClass.ARTIFACT_VERIFICATION,
]


def refusal(cls: str, **kwargs: object) -> RefusalReason:
    with pytest.raises(AdmissionRefused) as info:
        admit_operation(cls, **kwargs)  # type: ignore[arg-type]
    assert info.value.operation_class == cls
    return info.value.reason


def identity(cls: OperationClass) -> dict[str, object]:
    fence = {"fence": 3} if cls is OperationClass.DURABLE_LEASED_WORK else {}
    return {"idempotency_key": "key-1", "outcome_ref": "ref-1", **fence}


@pytest.mark.parametrize("cls", EFFECTING)
def test_admission_refuses_effecting_work_without_idempotency_key(cls: OperationClass) -> None:
    kwargs = identity(cls)
    del kwargs["idempotency_key"]
    assert refusal(cls, **kwargs) is RefusalReason.MISSING_IDEMPOTENCY_KEY
    assert refusal(cls, **kwargs, idempotency_key="  ") is RefusalReason.MISSING_IDEMPOTENCY_KEY


@pytest.mark.parametrize("cls", EFFECTING)
def test_admission_refuses_effecting_work_without_outcome_reference(cls: OperationClass) -> None:
    kwargs = identity(cls)
    del kwargs["outcome_ref"]
    assert refusal(cls, **kwargs) is RefusalReason.MISSING_OUTCOME_REFERENCE
    assert refusal(cls, **kwargs, outcome_ref="") is RefusalReason.MISSING_OUTCOME_REFERENCE


@pytest.mark.parametrize("fence", [None, 0, -1, True])
def test_admission_refuses_leased_work_without_fence(fence: object) -> None:
    reason = refusal("durable-leased-work", idempotency_key="k", outcome_ref="r", fence=fence)
    assert reason is RefusalReason.MISSING_FENCE


def test_admission_refuses_stale_fence() -> None:
    reason = refusal(
        "durable-leased-work", idempotency_key="k", outcome_ref="r", fence=3, current_fence=4
    )
    assert reason is RefusalReason.STALE_FENCE
    admitted = admit_operation(
        "durable-leased-work", idempotency_key="k", outcome_ref="r", fence=4, current_fence=4
    )
    assert admitted.fence == 4


def test_admission_refuses_effecting_read_only_dependency() -> None:
    assert (
        refusal("read-only-dependency", effecting=True, idempotency_key="k", outcome_ref="r")
        is RefusalReason.EFFECT_FORBIDDEN
    )


def test_admission_refuses_confirmed_mutation_declared_as_read() -> None:
    assert refusal("confirmed-mutation", effecting=False) is RefusalReason.EFFECT_REQUIRED


def test_admission_treats_optional_effects_as_effecting_by_default() -> None:
    assert refusal("interactive-turn") is RefusalReason.MISSING_IDEMPOTENCY_KEY
    admitted = admit_operation("interactive-turn", effecting=False)
    assert not admitted.effecting


@pytest.mark.parametrize("cls", list(OperationClass))
def test_admission_refuses_attempt_timeout_that_does_not_fit_deadline(cls: OperationClass) -> None:
    cp = default_policy().for_class(cls)
    short = cp.attempt_timeout.seconds / 2
    reason = refusal(cls, **identity(cls), deadline=short, attempt_timeout=short * 1.5)
    assert reason is RefusalReason.ATTEMPT_TIMEOUT_EXCEEDS_DEADLINE
    admitted = admit_operation(cls, **identity(cls), deadline=short, attempt_timeout=short)  # type: ignore[arg-type]
    assert admitted.attempt_timeout_seconds <= admitted.deadline_seconds == short


@pytest.mark.parametrize("cls", list(OperationClass))
def test_admission_refuses_deadline_beyond_class_envelope(cls: OperationClass) -> None:
    limit = default_policy().for_class(cls).deadline.seconds
    reason = refusal(cls, **identity(cls), deadline=timedelta(seconds=limit + 1))
    assert reason is RefusalReason.DEADLINE_EXCEEDS_POLICY
    admitted = admit_operation(cls, **identity(cls))  # type: ignore[arg-type]
    assert admitted.deadline_seconds == limit


def test_admission_refuses_attempt_timeout_beyond_class_envelope() -> None:
    reason = refusal("read-only-dependency", attempt_timeout=2.5)
    assert reason is RefusalReason.ATTEMPT_TIMEOUT_EXCEEDS_POLICY
    # The envelope itself is within it: the class's own attempt timeout and deadline, asked.
    admitted = admit_operation("read-only-dependency", attempt_timeout=2, deadline=10)
    assert (admitted.attempt_timeout_seconds, admitted.deadline_seconds) == (2, 10)


@pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan"), timedelta(0)])
def test_admission_refuses_non_positive_or_infinite_duration(value: object) -> None:
    assert refusal("read-only-dependency", deadline=value) is RefusalReason.INVALID_DURATION


def test_admission_refuses_more_attempts_than_the_class_allows() -> None:
    assert refusal("read-only-dependency", max_attempts=4) is RefusalReason.ATTEMPTS_EXCEED_POLICY
    assert (
        refusal("confirmed-mutation", idempotency_key="k", outcome_ref="r", max_attempts=2)
        is RefusalReason.ATTEMPTS_EXCEED_POLICY
    )


@pytest.mark.parametrize(
    ("cls", "concurrency"),
    [
        (OperationClass.DURABLE_LEASED_WORK, 2),
        (OperationClass.ARTIFACT_VERIFICATION, 2),
        (OperationClass.CONFIRMED_MUTATION, 9),
        (OperationClass.READ_ONLY_DEPENDENCY, 0),
    ],
)
def test_admission_refuses_concurrency_above_class_limit(
    cls: OperationClass, concurrency: int
) -> None:
    reason = refusal(cls, **identity(cls), concurrency=concurrency)
    assert reason is RefusalReason.CONCURRENCY_EXCEEDS_POLICY


def test_admission_refuses_unknown_class() -> None:
    assert refusal("batch-export") is RefusalReason.UNKNOWN_CLASS


def test_admission_admits_complete_confirmed_mutation_within_envelope() -> None:
    admitted = admit_operation(
        "confirmed-mutation",
        idempotency_key="confirm-7",
        outcome_ref="receipt-7",
        attempt_timeout=timedelta(seconds=5),
    )
    assert admitted.effecting
    assert (admitted.idempotency_key, admitted.outcome_ref) == ("confirm-7", "receipt-7")
    assert admitted.attempt_timeout_seconds == 5
    assert admitted.deadline_seconds == 30
    assert admitted.max_attempts == 1
    assert admitted.circuit_breaker is not None
    assert admitted.concurrency == 8
    assert admitted.cancellation.after_dispatch == "continue-to-outcome-receipt"


def test_admission_admits_read_without_identity() -> None:
    admitted = admit_operation("read-only-dependency")
    assert not admitted.effecting
    assert admitted.idempotency_key is None
    assert admitted.max_attempts == 3
    assert admitted.jitter == "full"


def test_admission_of_leased_work_allows_no_retry_loop() -> None:
    admitted = admit_operation(
        "durable-leased-work", idempotency_key="item-9", outcome_ref="item-9/complete", fence=2
    )
    assert admitted.max_attempts == 1
    assert admitted.retryable == ()
    assert admitted.concurrency == 1


def test_admission_refusal_is_a_problem_with_reason() -> None:
    with pytest.raises(AdmissionRefused) as info:
        admit_operation("confirmed-mutation")
    error = info.value
    assert error.status == 422
    assert error.code == "admission-refused"
    assert error.extensions == {
        "reason": "missing-idempotency-key",
        "operation_class": "confirmed-mutation",
    }
    assert str(error).startswith("confirmed-mutation: missing-idempotency-key")
