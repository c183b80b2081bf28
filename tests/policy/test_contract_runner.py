"""The contract runner cannot pass on broken proofs: a bound test that fails on the runtime as
it is, a weakening that no longer applies, and a test that survives its weakening each fail
`python -m tests.contract`, by name (the bindings of tests/policy_proof/examples.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_contract_runner_names_every_binding_that_proves_nothing() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.contract",
            "--proofs",
            "tests.policy_proof.examples:EXAMPLES",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
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
