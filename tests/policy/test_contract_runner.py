"""The contract runner cannot pass on broken proofs: a bound test that fails on the runtime as
it is, a weakening that no longer applies, and a test that survives its weakening each fail
`python -m tests.contract`, by name (the bindings of tests/policy_proof/examples.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _contract_of_the_examples(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m tests.contract` on the bindings of tests/policy_proof/examples.py."""
    return subprocess.run(
        [
            *(sys.executable, "-m", "tests.contract"),
            *("--proofs", "tests.policy_proof.examples:EXAMPLES", *args),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_the_contract_runner_names_every_binding_that_proves_nothing() -> None:
    done = _contract_of_the_examples()
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    proved = [line for line in out.splitlines() if line.endswith("example: proves")]
    assert [line.split()[0] for line in proved] == ["caught"], out
    failed = out[out.index("contract FAILED:") :]
    here = "tests/policy_proof/examples.py::"
    assert (
        f"example: fails unweakened: test {here}test_the_attempt_cap_is_lifted fails unweakened"
        in failed
    )
    assert (
        "example: stale weakening: weakening 'example-stale-sql' cannot be applied: AssertionError"
        in failed
    )
    assert (
        f"example: survives: test {here}test_unrelated_to_the_cap still passes under lift-attempt-cap"
        in failed
    )
    assert "example: proves" not in failed


def test_the_suites_results_stand_for_the_unweakened_runs_and_a_failure_there_is_an_error(
    tmp_path: Path,
) -> None:
    """`make test` hands the contract the JUnit XML of the suite it just ran: a bound test
    that passed there (every parameter) is not run unweakened again; one that failed, errored
    or was skipped there fails unweakened; one the run did not have is run here."""
    from tests.contract import BASELINE, Proof, judge, passed_in, plan
    from tests.policy_proof.examples import EXAMPLES

    here = "tests.policy_proof.examples"
    results = tmp_path / "unit.xml"
    results.write_text(
        "<testsuites><testsuite>"
        f'<testcase classname="{here}" name="test_the_attempt_cap_is_the_policys[a]" />'
        f'<testcase classname="{here}" name="test_the_attempt_cap_is_the_policys[b]">'
        '<failure message="no" /></testcase>'
        f'<testcase classname="{here}" name="test_unrelated_to_the_cap" />'
        "</testsuite></testsuites>"
    )
    known = passed_in(results)
    policys, lifted = (
        f"tests/policy_proof/examples.py::test_the_attempt_cap_{end}"
        for end in ("is_the_policys", "is_lifted")
    )
    unrelated = "tests/policy_proof/examples.py::test_unrelated_to_the_cap"
    assert known.holds(unrelated)
    assert not known.holds(policys)  # one parameter failed
    runs = plan(EXAMPLES, 2, known)
    assert [run.tests for run in runs if run.weakening is None] == [(lifted,)]
    assert {run.weakening for run in runs} == {None, "lift-attempt-cap", "example-stale-sql"}

    def proof(weakening: str | None, failed: set[str], passed: set[str]) -> Proof:
        return Proof(weakening, tuple(failed | passed), frozenset(failed), frozenset(passed), 0, "")

    proofs = {
        f"{BASELINE}0": proof(None, {lifted}, set()),
        f"{BASELINE}suite": known,
        "lift-attempt-cap": proof("lift-attempt-cap", {policys}, {lifted, unrelated}),
        "example-stale-sql": proof("example-stale-sql", {policys}, set()),
    }
    words = {v.cell: (v.word, v.problem) for v in judge(EXAMPLES, proofs)}
    assert words["example: proves"] == ("ERROR", f"test {policys} fails unweakened")
    assert words["example: fails unweakened"] == ("ERROR", f"test {lifted} fails unweakened")
    assert words["example: survives"][0] == "MISSED"


def test_the_weakenings_whose_tests_took_longest_in_the_suite_are_proven_first(
    tmp_path: Path,
) -> None:
    """The four proofs of ten seconds were last in the registry and ran on alone at the end
    of `make test`: planned by their tests' times in the suite's results, they start first."""
    from tests.contract import durations_in, plan

    here = "tests.policy_proof.examples"
    results = tmp_path / "unit.xml"
    results.write_text(
        "<testsuites><testsuite>"
        f'<testcase classname="{here}" name="test_the_attempt_cap_is_the_policys[a]" time="0.5" />'
        f'<testcase classname="{here}" name="test_the_attempt_cap_is_the_policys[b]" time="0.25" />'
        f'<testcase classname="{here}" name="test_the_attempt_cap_is_lifted" time="0.1" />'
        f'<testcase classname="{here}" name="test_unrelated_to_the_cap" time="9.0" />'
        "</testsuite></testsuites>"
    )
    durations = durations_in(results)
    assert durations[f"{here.replace('.', '/')}.py::test_the_attempt_cap_is_the_policys"] == 0.75
    pairs = [
        ("short", "tests/policy_proof/examples.py::test_the_attempt_cap_is_lifted", "short"),
        ("long", "tests/policy_proof/examples.py::test_unrelated_to_the_cap", "long"),
        ("middle", "tests/policy_proof/examples.py::test_the_attempt_cap_is_the_policys", "mid"),
    ]
    assert [run.weakening for run in plan(pairs, 1, None, durations)][1:] == [
        "long",
        "mid",
        "short",
    ]
    # Without the suite's times, the registry's order.
    assert [run.weakening for run in plan(pairs, 1)][1:] == ["short", "long", "mid"]


@pytest.mark.slow
def test_weakened_runs_saved_beside_the_suite_are_judged_later_and_not_made_again(
    tmp_path: Path,
) -> None:
    """`make test` makes the weakened runs beside the suite (`--save-proofs`) and judges
    them after it (`--proofs-from`): the judgment reads the saved runs, here one doctored
    to survive its weakening, and makes only the unweakened ones and any the file lacks."""
    import json

    saved = tmp_path / "proofs.json"
    made = _contract_of_the_examples("--save-proofs", str(saved))
    assert made.returncode == 0, made.stdout + made.stderr
    rows = json.loads(saved.read_text())
    assert {row["weakening"] for row in rows} == {"lift-attempt-cap", "example-stale-sql"}
    (lifted,) = (row for row in rows if row["weakening"] == "lift-attempt-cap")
    policys = "tests/policy_proof/examples.py::test_the_attempt_cap_is_the_policys"
    assert policys in lifted["failed"]
    lifted["passed"] += lifted["failed"]
    lifted["failed"] = []
    saved.write_text(json.dumps([lifted]))  # the stale weakening's run left out
    judged = _contract_of_the_examples("--proofs-from", str(saved))
    out = judged.stdout
    assert judged.returncode == 1, out + judged.stderr
    failed = out[out.index("contract FAILED:") :]
    assert f"example: proves: test {policys} still passes under lift-attempt-cap" in failed
    assert "cannot be applied: AssertionError" in failed  # made here: missing from the file


def test_a_saved_run_of_other_tests_or_another_weakening_is_not_taken(tmp_path: Path) -> None:
    from tests.contract import Proof, Run, load_proofs, save_proofs

    tests = ("tests/policy_proof/examples.py::test_unrelated_to_the_cap",)
    proof = Proof("lift-attempt-cap", tests, frozenset(tests), frozenset(), 1.5, "out")
    path = tmp_path / "proofs.json"
    save_proofs({"lift-attempt-cap": proof}, path)
    assert load_proofs(path, [Run("lift-attempt-cap", "lift-attempt-cap", tests)]) == {
        "lift-attempt-cap": proof
    }
    other_tests = Run("lift-attempt-cap", "lift-attempt-cap", (*tests, "tests/x.py::test_y"))
    assert load_proofs(path, [other_tests]) == {}
    assert load_proofs(path, [Run("lift-attempt-cap", "another", tests)]) == {}
    assert load_proofs(path, []) == {}
