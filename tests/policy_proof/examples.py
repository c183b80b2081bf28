"""Bindings for the contract verifier's own test (`tests/policy/test_contract_runner.py`):
one that proves, and one for each way a binding can prove nothing. Not collected by the
suite (the name is not `test_*.py`); `python -m tests.contract --proofs
tests.policy_proof.examples:EXAMPLES` runs them.
"""

from __future__ import annotations

from queue_server.policy.model import OperationClass
from queue_server.policy.runtime import runtime_policy
from queue_server.policy.values import LeasedWork

_HERE = "tests/policy_proof/examples.py::"

# (cell, test, weakening), as `tests.contract` builds them from the bindings.
EXAMPLES: tuple[tuple[str, str, str], ...] = (
    ("example: proves", _HERE + "test_the_attempt_cap_is_the_policys", "lift-attempt-cap"),
    ("example: fails unweakened", _HERE + "test_the_attempt_cap_is_lifted", "lift-attempt-cap"),
    (
        "example: stale weakening",
        _HERE + "test_the_attempt_cap_is_the_policys",
        "example-stale-sql",
    ),
    ("example: survives", _HERE + "test_unrelated_to_the_cap", "lift-attempt-cap"),
)


def _attempt_cap() -> int:
    policy = runtime_policy(environ={})
    return LeasedWork.of(policy.for_class(OperationClass.DURABLE_LEASED_WORK)).attempt_cap


def test_the_attempt_cap_is_the_policys() -> None:
    assert _attempt_cap() == 5


def test_the_attempt_cap_is_lifted() -> None:
    # Wrong on the real runtime (the built-in cap is 5): a binding to it must be refused even
    # though the weakening makes it pass-or-fail either way.
    assert _attempt_cap() == 100


def test_unrelated_to_the_cap() -> None:
    assert sorted("cba") == ["a", "b", "c"]
