"""The contract's further proofs (`EXTRA_PROOFS`: one weakening per guard of the batch routes
and of triage) are as well formed as the bindings, and only for cells that are bound."""

from __future__ import annotations

from tests.policy_proof.bindings import BINDINGS, EXTRA_PROOFS
from tests.policy_proof.verifier import resolve
from tests.weakenings import WEAKENINGS


def test_each_extra_proof_names_importable_code_a_test_and_a_registered_weakening() -> None:
    bound = {b.cell for b in BINDINGS}
    for proof in EXTRA_PROOFS:
        assert resolve(proof.enforced_by) is not None, proof
        assert proof.cell in bound, proof
        path, _, name = proof.test.partition("::")
        assert path.startswith("tests/"), proof
        assert name.startswith("test_"), proof
        assert proof.weakening in WEAKENINGS, proof


def test_each_guard_weakening_of_the_batch_routes_and_triage_has_a_proof() -> None:
    proven = {proof.weakening for proof in EXTRA_PROOFS} | {b.weakening for b in BINDINGS}
    guards = {
        name
        for name in WEAKENINGS
        if name.startswith(("batch-", "triage-"))
        or name in ("drop-holder-guard", "drop-expiry-guard")
    }
    assert guards <= proven, guards - proven
