"""A policy of one's own is a version of its own: what the loader accepts from a document that
names itself, the absolute bounds of durable-leased-work, and why a changed document may not
keep the built-in's name."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from queue_server.policy import PolicyError, default_policy, load_policy
from queue_server.policy.v2 import OPERATION_RELIABILITY_V2
from tests.helpers.api import policy_document

LEASED = "durable-leased-work"
BUILT_IN_CHANGED = (
    "version: operation-reliability.v2 is the built-in policy; a changed document needs a"
    " version of its own (policy new --version NAME)"
)


def refused(doc: dict[str, Any]) -> PolicyError:
    with pytest.raises(PolicyError) as info:
        load_policy(doc)
    return info.value


def acme(**leased: Any) -> dict[str, Any]:
    """acme.v3: the built-in under a version of its own, with durable-leased-work cells."""
    return policy_document({LEASED: leased}, version="acme.v3")


def long_jobs() -> dict[str, Any]:
    """Two-hour leases and an attempt budget of 25 (the isolation budget follows it)."""
    doc = acme(deadline={"seconds": 7200})
    cells = doc["classes"][LEASED]
    cells["retry"]["max-acquisitions"] = 25  # the isolation budget, left unstated, follows it
    return doc


def test_a_document_names_itself_with_its_version() -> None:
    assert default_policy().version == "operation-reliability.v2"
    assert default_policy().as_document()["version"] == "operation-reliability.v2"
    policy = load_policy(long_jobs())
    assert policy.version == "acme.v3"
    assert policy.loaded()["version"] == "acme.v3"
    assert policy.digest != default_policy().digest
    assert policy.sha256 == policy.digest.removeprefix("sha256:")
    assert len(policy.sha256) == 64
    # What `policy show --json` prints of it is a document the loader takes back unchanged.
    assert load_policy(policy.as_document()).digest == policy.digest


def test_a_version_of_ones_own_may_raise_the_leased_work_values() -> None:
    leased = load_policy(long_jobs()).leased_work
    assert (leased.deadline, leased.attempt_cap) == (7200, 25)


def test_the_older_spelling_policy_names_the_same_version() -> None:
    doc = long_jobs()
    doc["policy"] = doc.pop("version")
    assert load_policy(doc).version == "acme.v3"
    assert load_policy(copy.deepcopy(OPERATION_RELIABILITY_V2)).version == (
        "operation-reliability.v2"
    )


def test_a_changed_document_under_the_built_in_version_is_refused() -> None:
    doc = long_jobs()
    doc["version"] = "operation-reliability.v2"
    error = refused(doc)
    assert error.cells == ("version",)
    assert str(error) == BUILT_IN_CHANGED
    # The older spelling of the key does not hide it.
    doc["policy"] = doc.pop("version")
    assert str(refused(doc)) == BUILT_IN_CHANGED


def test_a_change_that_breaks_a_rule_under_the_built_in_version_names_both() -> None:
    doc = copy.deepcopy(OPERATION_RELIABILITY_V2)
    doc["classes"]["read-only-dependency"]["retry"]["max-attempts"] = 6
    assert refused(doc).cells == ("version", "read-only-dependency/retry")


def test_the_built_in_with_only_its_notes_changed_is_still_the_built_in() -> None:
    doc = copy.deepcopy(OPERATION_RELIABILITY_V2)
    doc["classes"][LEASED]["deadline"]["note"] = "our own words"
    assert load_policy(doc).version == "operation-reliability.v2"


def test_a_revision_label_is_gone_a_change_is_a_version() -> None:
    doc = long_jobs()
    doc["revision"] = "short-leases"
    assert refused(doc).cells == ("revision",)


def test_six_attempts_for_read_only_dependency_are_refused_naming_the_cell() -> None:
    doc = policy_document({}, version="acme.v3")
    doc["classes"]["read-only-dependency"]["retry"]["max-attempts"] = 6
    error = refused(doc)
    assert error.cells == ("read-only-dependency/retry",)
    assert "1 to 5 attempts, the first attempt included; got 6" in str(error)


# (cell, the bound, the document with the value set to it)
BOUNDS: list[tuple[str, float, Any]] = [
    (
        f"{LEASED}/deadline",
        604800,
        lambda v: acme(deadline={"seconds": v}),
    ),
    (
        f"{LEASED}/attempt-timeout",
        3600,
        lambda v: acme(
            deadline={"seconds": 7200},
            **{"attempt-timeout": {"seconds": v, "on-timeout": "lease-expires"}},
        ),
    ),
    (
        f"{LEASED}/retry",
        100,
        lambda v: acme(
            retry={"kind": "queue-reacquisition", "max-acquisitions": v},
            **{
                "circuit-breaking": {
                    **OPERATION_RELIABILITY_V2["classes"][LEASED]["circuit-breaking"],
                    "budget": v,
                }
            },
        ),
    ),
    (
        f"{LEASED}/backoff-and-jitter",
        86400,
        lambda v: acme(**{"backoff-and-jitter": {"kind": "requeue-delay", "max-seconds": v}}),
    ),
]


@pytest.mark.parametrize(("cell", "bound", "document"), BOUNDS, ids=[b[0] for b in BOUNDS])
def test_each_leased_work_bound_is_accepted_at_it_and_refused_one_above(
    cell: str, bound: float, document: Any
) -> None:
    load_policy(document(bound))
    error = refused(document(bound + 1))
    assert error.cells == (cell,)
    assert f"{bound + 1:g} exceeds the bound of {bound:g}" in str(error)


def test_identity_fencing_and_outcome_cells_stay_as_in_the_built_in() -> None:
    identity = dict(OPERATION_RELIABILITY_V2["classes"][LEASED]["idempotency-and-fencing"])
    identity["durable-receipt"] = False
    resumability = {"mechanism": "lease-expiry-and-ledger-replay", "identity": "item id"}
    error = refused(acme(**{"idempotency-and-fencing": identity, "resumability": resumability}))
    assert error.cells == (f"{LEASED}/idempotency-and-fencing", f"{LEASED}/resumability")
    assert "weakening them needs a new decision" in str(error)


def test_the_attempt_timeout_must_still_fit_the_deadline() -> None:
    error = refused(acme(**{"attempt-timeout": {"seconds": 1800, "on-timeout": "lease-expires"}}))
    assert error.cells == (f"{LEASED}/attempt-timeout",)
    assert "does not fit the deadline 900s" in str(error)


def test_a_stated_isolation_budget_must_be_the_retry_budget() -> None:
    doc = long_jobs()
    doc["classes"][LEASED]["circuit-breaking"]["budget"] = 5
    with pytest.raises(PolicyError) as refused:
        load_policy(doc)
    assert f"{LEASED}/circuit-breaking" in {cell for cell, _ in refused.value.problems}
    doc["classes"][LEASED]["circuit-breaking"]["budget"] = 25
    assert load_policy(doc).leased_work.attempt_cap == 25
