"""`make test` lints beside the suite: a lint finding or a failing suite still fails it, lint's
output is shown either way, and the policy contract runs only when both passed.

The Makefile runs in a scratch copy, read through a GNUmakefile that includes it and puts
stand-ins for `lint` and `unit` (and the package checks) in place of the real targets: make
reads GNUmakefile first, in `make test` and in the sub-makes its recipe starts alike."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def make_test(scratch: Path, *, suite: int, lint: int) -> subprocess.CompletedProcess[str]:
    # The Makefile and what its install stamp is made from (the stamp is newer: no install).
    for name in ("Makefile", "pyproject.toml", "requirements.lock", "client/pyproject.toml"):
        (scratch / name).parent.mkdir(exist_ok=True)
        shutil.copy(ROOT / name, scratch / name)
    (scratch / "GNUmakefile").write_text(
        "include Makefile\n"
        f"lint:\n\t@echo lint-ran; exit {lint}\n"
        f"unit:\n\t@echo suite-ran; exit {suite}\n"
        "browser promtool:\n\t@:\n"
    )
    stamp = scratch / "installed"
    stamp.touch()
    bin_dir = scratch / "bin"
    bin_dir.mkdir()
    # The contract: its weakened runs beside the suite (their output goes to a log), its
    # judgment after it.
    (bin_dir / "python").write_text(
        '#!/bin/sh\ncase "$*" in *--save-proofs*) echo proofs-made "$@";; *) echo contract-ran "$@";; esac\n'
    )
    (bin_dir / "python").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    return subprocess.run(
        ["make", "--no-print-directory", "test", f"STAMP={stamp}", f"BIN={bin_dir}"],
        cwd=scratch,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(("suite", "lint"), [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_a_lint_finding_or_a_failing_suite_fails_make_test_and_only_a_pass_runs_the_contract(
    tmp_path: Path, suite: int, lint: int
) -> None:
    done = make_test(tmp_path, suite=suite, lint=lint)
    out = done.stdout
    passed = suite == 0 and lint == 0
    assert (done.returncode == 0) is passed, out + done.stderr
    assert "suite-ran" in out
    # Lint's output follows the suite's, whatever either did.
    assert out.index("suite-ran") < out.index("--- make lint") < out.index("lint-ran"), out
    assert ("make lint failed (exit" in out) is bool(lint), out
    assert ("contract-ran" in out) is passed, out
    if passed:
        judged = next(line for line in out.splitlines() if line.startswith("contract-ran"))
        assert "--passed-in .test-results/unit.xml" in judged, judged
        assert "--proofs-from .test-results/proofs.json" in judged, judged
    # The weakened runs were made whatever the suite did, at a lower priority.
    made = (tmp_path / ".test-results" / "proofs.log").read_text()
    assert made.startswith("proofs-made -m tests.contract --save-proofs .test-results/proofs.json")


def test_the_contracts_weakened_runs_are_made_at_a_lower_priority_beside_the_suite() -> None:
    recipe = (ROOT / "Makefile").read_text().split("\ntest:", 1)[1].split("\n\n", 1)[0]
    beside = recipe.index("nice -n 10 $(BIN)/python -m tests.contract --save-proofs")
    assert recipe.index("& linting") < beside < recipe.index("unit; suite=")
