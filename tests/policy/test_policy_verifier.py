"""The contract verifier: totality, bindings, named tests, and the cancel-after-dispatch negative control."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from queue_server.policy import (
    BINDINGS,
    DECISIONS,
    CancelAfterDispatchMutationPath,
    ConfirmedMutationPath,
    Dimension,
    OperationClass,
    verify_cancellation_rule,
    verify_contract,
)


def test_cancellation_rule_passes_on_real_mutation_path() -> None:
    verdict = verify_cancellation_rule(ConfirmedMutationPath())
    assert verdict.passed, verdict.failures
    assert verdict.path == "ConfirmedMutationPath"


def test_cancellation_rule_fails_on_cancel_after_dispatch_negative_control() -> None:
    verdict = verify_cancellation_rule(CancelAfterDispatchMutationPath())
    assert not verdict.passed
    text = "\n".join(verdict.failures)
    assert "a dispatched effect was reported cancelled" in text
    assert "did not continue to its outcome receipt" in text


def test_verify_contract_passes_on_the_real_policy() -> None:
    report = verify_contract()
    assert report.passed, report.failures
    assert report.cells_checked == 60
    assert report.bindings_checked == 60
    assert report.real_path is not None
    assert report.real_path.passed
    assert report.negative_control is not None
    assert not report.negative_control.passed
    assert json.loads(json.dumps(report.as_dict()))["passed"] is True


def test_every_cell_has_exactly_one_binding() -> None:
    cells = [(b.operation_class, b.dimension) for b in BINDINGS]
    assert len(cells) == len(set(cells)) == len(OperationClass) * len(Dimension)
    assert all(b.moves_to for b in BINDINGS)


def test_verify_contract_fails_when_negative_control_passes() -> None:
    report = verify_contract(negative_control=ConfirmedMutationPath())
    assert not report.passed
    assert any("negative control" in f.message for f in report.failures)


def test_verify_contract_fails_on_weakened_mutation_path() -> None:
    report = verify_contract(mutation_path=CancelAfterDispatchMutationPath())
    assert not report.passed
    assert {f.cell for f in report.failures} == {"confirmed-mutation/cancellation"}


def test_verify_contract_reports_missing_binding() -> None:
    report = verify_contract(bindings=BINDINGS[1:])
    assert not report.passed
    assert [f.cell for f in report.failures] == [BINDINGS[0].cell]
    assert "found 0" in report.failures[0].message


def test_verify_contract_reports_unresolvable_binding() -> None:
    broken = replace(BINDINGS[0], enforced_by="queue_server.policy.admission.no_such_gate")
    report = verify_contract(bindings=(broken, *BINDINGS[1:]))
    assert [f.cell for f in report.failures] == [broken.cell]
    assert "does not resolve" in report.failures[0].message


def test_verify_contract_reports_missing_test() -> None:
    broken = replace(BINDINGS[0], test="tests/policy/test_policy_admission.py::test_nothing_here")
    report = verify_contract(bindings=(broken, *BINDINGS[1:]))
    assert [f.cell for f in report.failures] == [broken.cell]
    assert "not found" in report.failures[0].message


def test_verify_contract_reports_test_that_does_not_exercise_binding() -> None:
    broken = replace(
        BINDINGS[0],
        test="tests/policy/test_policy_verifier.py::test_every_cell_has_exactly_one_binding",
    )
    report = verify_contract(bindings=(broken, *BINDINGS[1:]))
    assert [f.cell for f in report.failures] == [broken.cell]
    assert "does not exercise" in report.failures[0].message


def test_verify_contract_reports_missing_tests_tree(tmp_path: Path) -> None:
    report = verify_contract(tests_root=tmp_path)
    tests_named = sum(len(d.tests) for d in DECISIONS)
    assert len(report.failures) == len(BINDINGS) + tests_named
    assert all("not found" in f.message for f in report.failures)


def test_every_adr_decision_point_is_bound_to_code_and_tests() -> None:
    assert [d.point for d in DECISIONS] == list(range(1, 9))
    assert all(d.enforced_by and d.tests for d in DECISIONS)


def test_verify_contract_reports_decision_point_without_its_test() -> None:
    broken = replace(DECISIONS[5], tests=("tests/policy/test_policy_gates.py::test_gone",))
    report = verify_contract(decisions=(*DECISIONS[:5], broken, *DECISIONS[6:]))
    assert [f.cell for f in report.failures] == ["decision-6"]


def test_verify_contract_reports_missing_decision_point() -> None:
    report = verify_contract(decisions=DECISIONS[:-1])
    assert [f.cell for f in report.failures] == ["decisions"]
