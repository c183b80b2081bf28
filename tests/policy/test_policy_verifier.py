"""The contract verifier's registry: totality, well-formed bindings, the cancellation rule and
its negative control; and the docs table it writes, which must not drift."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from queue_server.policy import Dimension, OperationClass, load_policy
from tests.contract import BEGIN, DOCS, END
from tests.demonstrators.mutation import ConfirmedMutationPath
from tests.policy_proof.bindings import BINDINGS, DECLARED, NEGATIVE_CONTROLS
from tests.policy_proof.mutation import CancelAfterDispatchMutationPath
from tests.policy_proof.verifier import render_table, verify_cancellation_rule, verify_contract
from tests.weakenings import WEAKENINGS


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
    assert report.bound == len(BINDINGS)
    assert report.bound + report.not_applicable + report.declared == 60
    assert report.real_path is not None
    assert report.real_path.passed
    assert report.negative_control is not None
    assert not report.negative_control.passed
    assert json.loads(json.dumps(report.as_dict()))["passed"] is True


def test_every_cell_is_bound_not_applicable_or_declared_once() -> None:
    policy = load_policy()
    bound = [(b.operation_class, b.dimension) for b in BINDINGS]
    assert len(bound) == len(set(bound))
    assert not set(bound) & set(DECLARED)
    for cls in OperationClass:
        for dim in Dimension:
            ways = (cls, dim) in bound, (cls, dim) in DECLARED, policy.cell(cls, dim).__class__
            assert ways[0] or ways[1] or ways[2].__name__ == "NotApplicable", (cls, dim)


def test_every_class_has_a_binding_proven_by_a_weakening() -> None:
    classes = {b.operation_class for b in BINDINGS}
    assert classes == set(OperationClass)
    assert all(b.weakening in WEAKENINGS for b in BINDINGS)
    assert {c.weakening for c in NEGATIVE_CONTROLS} <= set(WEAKENINGS)
    assert len({c.path for c in NEGATIVE_CONTROLS}) == 2


def test_verify_contract_fails_when_a_cell_is_neither_bound_nor_declared() -> None:
    report = verify_contract(bindings=BINDINGS[1:])
    assert not report.passed
    assert [f.cell for f in report.failures] == [BINDINGS[0].cell]


def test_verify_contract_fails_when_a_bound_cell_is_also_declared() -> None:
    first = BINDINGS[0]
    report = verify_contract(
        declared={**DECLARED, (first.operation_class, first.dimension): "twice"}
    )
    assert [f.cell for f in report.failures] == [first.cell]


def test_verify_contract_fails_on_unresolvable_code_or_a_missing_weakening() -> None:
    broken = replace(BINDINGS[0], enforced_by="queue_server.services.envelope.NoSuchThing")
    report = verify_contract(bindings=(broken, *BINDINGS[1:]))
    assert [f.cell for f in report.failures] == [BINDINGS[0].cell]
    assert "does not resolve" in report.failures[0].message
    unweakened = replace(BINDINGS[0], weakening="")
    report = verify_contract(bindings=(unweakened, *BINDINGS[1:]))
    assert "weakening" in report.failures[0].message


def test_verify_contract_needs_the_negative_control_on_both_mutation_paths() -> None:
    report = verify_contract(controls=NEGATIVE_CONTROLS[:1])
    assert any("REST-backed bridge" in f.message for f in report.failures)


def test_verify_contract_fails_when_negative_control_passes() -> None:
    report = verify_contract(negative_control=ConfirmedMutationPath())
    assert not report.passed
    assert any("negative control" in f.message for f in report.failures)


def test_verify_contract_fails_on_weakened_mutation_path() -> None:
    report = verify_contract(mutation_path=CancelAfterDispatchMutationPath())
    assert not report.passed
    assert report.real_path is not None
    assert not report.real_path.passed


def test_the_docs_table_is_the_one_the_verifier_writes() -> None:
    text = Path(DOCS).read_text()
    written = text[text.index(BEGIN) + len(BEGIN) : text.index(END)].strip()
    assert written == render_table().strip(), "run: python -m tests.contract --write-docs"
