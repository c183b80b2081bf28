"""The quick modes CI runs: they name real scenarios with arguments those scenarios take."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

from reliability.suite import QUICK, SCENARIOS

ROOT = Path(__file__).resolve().parents[2]


def test_every_quick_setting_binds_to_its_scenario() -> None:
    assert set(QUICK) <= set(SCENARIOS)
    for name, kwargs in QUICK.items():
        # A renamed or dropped parameter would make the quick run raise, not shrink.
        inspect.signature(SCENARIOS[name]).bind(**kwargs)


def test_ci_runs_the_suite_and_both_quick_modes_and_takes_the_topology_down() -> None:
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    steps = [line.strip() for line in script.splitlines() if line.strip().startswith("make ")]
    assert steps == ["make test", "make reliability-quick", "make failover-quick"]
    assert "trap" in script
    assert "ha.py down" in script


def test_both_quick_modes_have_help() -> None:
    for module in ("reliability", "reliability.failover"):
        done = subprocess.run(
            [sys.executable, "-m", module, "--help"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        assert "--quick" in done.stdout


def test_the_soak_has_help_and_takes_its_length() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "reliability.soak", "--help"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "--minutes" in done.stdout
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "python -m reliability.soak --minutes $(or $(MINUTES),60)" in makefile
