"""The policy as data: totality, the values and rules of
docs/decisions/operation-class-policy.md, and load errors that name the cell."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from queue_server.policy import (
    Dimension,
    NotApplicable,
    OperationClass,
    PolicyError,
    default_policy,
    load_policy,
)
from queue_server.policy.model import (
    Backoff,
    CircuitBreakerPolicy,
    QueueReacquisition,
    RetryAttempts,
)
from queue_server.policy.v2 import OPERATION_RELIABILITY_V2


def raw() -> dict[str, Any]:
    """The built-in document under a version of its own: an edit meets the rules alone."""
    doc = copy.deepcopy(OPERATION_RELIABILITY_V2)
    doc["version"] = "matrix.v1"
    return doc


def cells(doc: dict[str, Any], cls: str) -> dict[str, Any]:
    value: dict[str, Any] = doc["classes"][cls]
    return value


def load_error(doc: dict[str, Any]) -> PolicyError:
    """The decision's rules, as a version of one's own meets them."""
    with pytest.raises(PolicyError) as info:
        load_policy(doc)
    return info.value


def test_canonical_policy_loads_with_all_sixty_cells() -> None:
    policy = load_policy()
    assert policy.name == "operation-reliability.v2"
    assert set(policy.classes) == set(OperationClass)
    for cls in OperationClass:
        for dim in Dimension:
            assert policy.cell(cls, dim) is not None


def test_policy_document_round_trips_through_load_policy() -> None:
    doc = default_policy().as_document()
    assert json.loads(json.dumps(doc)) == doc
    assert doc["dimensions"] == [d.value for d in Dimension]
    assert list(doc["classes"]) == [c.value for c in OperationClass]
    assert load_policy(doc) == load_policy()


def test_canonical_values_follow_the_adr() -> None:
    policy = load_policy()
    read = policy.for_class("read-only-dependency")
    watcher = policy.for_class("watcher-delivery")
    mutation = policy.for_class("confirmed-mutation")
    leased = policy.for_class("durable-leased-work")
    verification = policy.for_class("artifact-verification")
    assert isinstance(read.backoff_and_jitter, Backoff)
    assert read.backoff_and_jitter.jitter == "full"
    assert isinstance(watcher.backoff_and_jitter, Backoff)
    assert watcher.backoff_and_jitter.jitter == "none"
    assert watcher.backoff_and_jitter.persisted_schedule
    assert isinstance(watcher.retry, RetryAttempts)
    assert watcher.retry.max_attempts == 5
    assert isinstance(mutation.retry, RetryAttempts)
    assert mutation.retry.max_attempts == 1
    assert "durable outcome receipt" in mutation.retry.note
    assert mutation.idempotency_and_fencing.durable_receipt
    assert mutation.concurrency.limit == 8
    assert mutation.attempt_timeout.on_timeout == "return-pending-receipt"
    assert isinstance(leased.retry, QueueReacquisition)
    assert leased.retry.delay_seconds == 0
    assert leased.concurrency.limit == 1
    assert verification.concurrency.limit == 1
    for cls in (OperationClass.INTERACTIVE_TURN, OperationClass.READ_ONLY_DEPENDENCY):
        assert isinstance(policy.for_class(cls).circuit_breaking, CircuitBreakerPolicy)
    for cls in OperationClass:
        cp = policy.for_class(cls)
        assert cp.cancellation.before_dispatch == "stop"
        assert cp.attempt_timeout.seconds <= cp.deadline.seconds
        if isinstance(cp.retry, RetryAttempts):
            assert 1 <= cp.retry.max_attempts <= 5


def test_not_applicable_cells_carry_a_reason() -> None:
    policy = load_policy()
    found = 0
    for cls in OperationClass:
        for dim in Dimension:
            cell = policy.cell(cls, dim)
            if isinstance(cell, NotApplicable):
                found += 1
                assert cell.not_applicable.strip()
    assert found >= 5
    doc = raw()
    cells(doc, "interactive-turn")["resumability"] = {"not-applicable": "  "}
    assert load_error(doc).cells == ("interactive-turn/resumability",)


def test_load_rejects_omitted_cell_naming_it() -> None:
    doc = raw()
    del cells(doc, "confirmed-mutation")["cancellation"]
    error = load_error(doc)
    assert error.cells == ("confirmed-mutation/cancellation",)
    assert "confirmed-mutation/cancellation: cell omitted" in str(error)


def test_load_rejects_omitted_class_naming_it() -> None:
    doc = raw()
    del doc["classes"]["watcher-delivery"]
    assert load_error(doc).cells == ("watcher-delivery/*",)


def test_load_rejects_unknown_class_naming_it() -> None:
    doc = raw()
    doc["classes"]["batch-export"] = copy.deepcopy(cells(doc, "interactive-turn"))
    error = load_error(doc)
    assert error.cells == ("batch-export/*",)
    assert "versioned policy edit" in str(error)


def test_load_rejects_unknown_dimension_naming_it() -> None:
    doc = raw()
    cells(doc, "read-only-dependency")["colour"] = {"not-applicable": "no"}
    assert load_error(doc).cells == ("read-only-dependency/colour",)


def test_load_rejects_attempt_timeout_that_does_not_fit_deadline() -> None:
    doc = raw()
    cells(doc, "confirmed-mutation")["attempt-timeout"]["seconds"] = 31
    error = load_error(doc)
    assert "confirmed-mutation/attempt-timeout" in error.cells
    assert "does not fit the deadline" in str(error)


def test_load_rejects_more_than_five_attempts() -> None:
    doc = raw()
    cells(doc, "watcher-delivery")["retry"]["max-attempts"] = 6
    error = load_error(doc)
    assert error.cells == ("watcher-delivery/retry",)
    assert "first attempt" in str(error)


def test_load_rejects_retries_without_named_failure_classes() -> None:
    doc = raw()
    cells(doc, "read-only-dependency")["retry"]["retryable"] = []
    assert load_error(doc).cells == ("read-only-dependency/retry",)


def test_load_rejects_unknown_failure_class() -> None:
    doc = raw()
    cells(doc, "read-only-dependency")["retry"]["retryable"] = ["anything"]
    assert load_error(doc).cells == ("read-only-dependency/retry",)


def test_load_rejects_retry_envelope_beyond_deadline() -> None:
    doc = raw()
    cells(doc, "read-only-dependency")["deadline"]["seconds"] = 6
    error = load_error(doc)
    assert error.cells == ("read-only-dependency/retry",)
    assert "do not fit the deadline" in str(error)


def test_load_rejects_jittered_watcher_schedule() -> None:
    doc = raw()
    cells(doc, "watcher-delivery")["backoff-and-jitter"]["jitter"] = "full"
    error = load_error(doc)
    assert set(error.cells) == {"watcher-delivery/backoff-and-jitter"}
    assert "replay-stable" in str(error)


def test_load_rejects_unjittered_read_dependency() -> None:
    doc = raw()
    cells(doc, "read-only-dependency")["backoff-and-jitter"]["jitter"] = "none"
    assert load_error(doc).cells == ("read-only-dependency/backoff-and-jitter",)


def test_load_rejects_backoff_above_its_cap() -> None:
    doc = raw()
    cells(doc, "artifact-verification")["backoff-and-jitter"]["initial-seconds"] = 20
    assert "artifact-verification/backoff-and-jitter" in load_error(doc).cells


@pytest.mark.parametrize("limit", [float("inf"), None, "unbounded", 0, -1, True])
def test_load_rejects_infinite_concurrency(limit: object) -> None:
    doc = raw()
    cells(doc, "watcher-delivery")["concurrency"]["limit"] = limit
    error = load_error(doc)
    assert error.cells == ("watcher-delivery/concurrency",)
    assert "finite" in str(error)


def test_load_rejects_local_leased_work_above_concurrency_one() -> None:
    doc = raw()
    cells(doc, "durable-leased-work")["concurrency"]["limit"] = 2
    assert load_error(doc).cells == ("durable-leased-work/concurrency",)


def test_load_rejects_cloud_concurrency_without_spend_approval() -> None:
    doc = raw()
    cells(doc, "artifact-verification")["concurrency"] = {"limit": 4, "scope": "cloud"}
    error = load_error(doc)
    assert error.cells == ("artifact-verification/concurrency",)
    assert "spend approval" in str(error)


def test_load_accepts_cloud_concurrency_with_spend_approval() -> None:
    doc = raw()
    cells(doc, "artifact-verification")["concurrency"] = {
        "limit": 4,
        "scope": "cloud",
        "spend-approval": "SPEND-42 approved by the SRE lead",
    }
    edited = load_policy(doc)  # a version of one's own may
    assert edited.for_class("artifact-verification").concurrency.limit == 4


def test_load_rejects_retry_loop_for_leased_work() -> None:
    doc = raw()
    cells(doc, "durable-leased-work")["retry"] = {
        "kind": "attempts",
        "max-attempts": 3,
        "retryable": ["transport-error"],
    }
    error = load_error(doc)
    assert "durable-leased-work/retry" in error.cells
    assert "no automatic retry loop" in str(error)


def test_load_rejects_backoff_on_single_attempt_class() -> None:
    doc = raw()
    cells(doc, "confirmed-mutation")["backoff-and-jitter"] = {
        "initial-seconds": 1,
        "multiplier": 2,
        "max-seconds": 2,
        "jitter": "full",
    }
    assert load_error(doc).cells == ("confirmed-mutation/backoff-and-jitter",)
    doc = raw()
    cells(doc, "interactive-turn")["backoff-and-jitter"] = {
        "initial-seconds": 1,
        "multiplier": 2,
        "max-seconds": 2,
        "jitter": "none",
    }
    assert load_error(doc).cells == ("interactive-turn/backoff-and-jitter",)


def test_load_rejects_mutation_retries_without_durable_receipt() -> None:
    doc = raw()
    mutation = cells(doc, "confirmed-mutation")
    mutation["retry"] = {"kind": "attempts", "max-attempts": 2, "retryable": ["transport-error"]}
    mutation["backoff-and-jitter"] = {
        "initial-seconds": 1,
        "multiplier": 2,
        "max-seconds": 2,
        "jitter": "full",
    }
    mutation["idempotency-and-fencing"]["durable-receipt"] = False
    error = load_error(doc)
    # The identity cell itself stays as in the built-in, so it is named too.
    assert error.cells == (
        "confirmed-mutation/retry",
        "confirmed-mutation/idempotency-and-fencing",
    )
    assert "durable idempotency receipt" in str(error)


@pytest.mark.parametrize(
    "dimension",
    [
        "deadline",
        "attempt-timeout",
        "retry",
        "backpressure",
        "concurrency",
        "idempotency-and-fencing",
        "cancellation",
    ],
)
def test_load_rejects_not_applicable_for_required_dimension(dimension: str) -> None:
    doc = raw()
    cells(doc, "artifact-verification")[dimension] = {"not-applicable": "we would rather not"}
    error = load_error(doc)
    assert f"artifact-verification/{dimension}" in error.cells
    assert "may not be not-applicable" in str(error)


def test_load_rejects_cancelled_after_dispatch() -> None:
    doc = raw()
    cells(doc, "confirmed-mutation")["cancellation"]["after-dispatch"] = "cancel"
    error = load_error(doc)
    assert error.cells == ("confirmed-mutation/cancellation",)
    assert "never represented as cancelled" in str(error)


def test_load_rejects_discarding_a_dispatched_effect() -> None:
    doc = raw()
    cells(doc, "watcher-delivery")["cancellation"]["after-dispatch"] = "discard-read"
    assert load_error(doc).cells == ("watcher-delivery/cancellation",)


def test_load_rejects_effecting_class_without_identity_requirements() -> None:
    doc = raw()
    cells(doc, "watcher-delivery")["idempotency-and-fencing"]["requires-outcome-reference"] = False
    assert load_error(doc).cells == ("watcher-delivery/idempotency-and-fencing",)


def test_load_rejects_leased_work_without_monotonic_fence() -> None:
    doc = raw()
    cells(doc, "durable-leased-work")["idempotency-and-fencing"]["fencing"] = "not-applicable"
    assert load_error(doc).cells == ("durable-leased-work/idempotency-and-fencing",)


def test_load_rejects_circuit_class_without_breaker() -> None:
    doc = raw()
    cells(doc, "read-only-dependency")["circuit-breaking"] = {"not-applicable": "trust me"}
    assert load_error(doc).cells == ("read-only-dependency/circuit-breaking",)


def test_load_rejects_unknown_cell_kind() -> None:
    doc = raw()
    cells(doc, "interactive-turn")["circuit-breaking"]["kind"] = "fuse"
    assert load_error(doc).cells == ("interactive-turn/circuit-breaking",)


def test_load_rejects_queueing_reject_at_capacity() -> None:
    doc = raw()
    cells(doc, "confirmed-mutation")["backpressure"]["max-queued"] = 5
    assert load_error(doc).cells == ("confirmed-mutation/backpressure",)


def test_load_rejects_mutation_timeout_that_does_not_return_pending_receipt() -> None:
    doc = raw()
    cells(doc, "confirmed-mutation")["attempt-timeout"]["on-timeout"] = "fail-attempt"
    assert load_error(doc).cells == ("confirmed-mutation/attempt-timeout",)


def test_load_rejects_unknown_field_in_a_cell() -> None:
    doc = raw()
    cells(doc, "interactive-turn")["deadline"]["inherit-transport-default"] = True
    assert load_error(doc).cells == ("interactive-turn/deadline",)


@pytest.mark.parametrize("version", ["", " acme", "acme v3", 3, None])
def test_load_rejects_a_version_that_is_not_a_name(version: object) -> None:
    doc = raw()
    doc["version"] = version
    assert load_error(doc).cells == ("version",)


def test_load_rejects_a_version_and_an_older_spelling_that_differ() -> None:
    doc = raw()
    doc["policy"] = "operation-reliability.v1"
    assert load_error(doc).cells == ("version",)


def test_load_reports_every_problem_at_once() -> None:
    doc = raw()
    del cells(doc, "interactive-turn")["deadline"]
    cells(doc, "watcher-delivery")["retry"]["max-attempts"] = 9
    cells(doc, "artifact-verification")["concurrency"]["limit"] = float("inf")
    assert set(load_error(doc).cells) == {
        "interactive-turn/deadline",
        "watcher-delivery/retry",
        "artifact-verification/concurrency",
    }


def test_policy_rows_render_every_cell_on_one_line() -> None:
    rows = load_policy().rows()
    assert len(rows) == 60
    assert all("\n" not in text and text for _, _, text in rows)
    by_cell = {(cls, dim): text for cls, dim, text in rows}
    assert by_cell[("confirmed-mutation", "concurrency")].startswith("limit=8")
    assert by_cell[("artifact-verification", "circuit-breaking")].startswith("not-applicable: ")
    assert "jitter=none" in by_cell[("watcher-delivery", "backoff-and-jitter")]


def test_load_rejects_isolation_budget_that_differs_from_retry_budget() -> None:
    doc = raw()
    cells(doc, "watcher-delivery")["circuit-breaking"]["budget"] = 7
    assert load_error(doc).cells == ("watcher-delivery/circuit-breaking",)


def test_unknown_class_lookup_is_a_policy_error() -> None:
    with pytest.raises(PolicyError) as info:
        load_policy().for_class("batch-export")
    assert info.value.cells == ("batch-export",)
