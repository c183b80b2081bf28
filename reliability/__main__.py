"""``python -m reliability``: run the reliability suite and print the summary table.

Writes ``reliability/results/latest.md`` and ``latest.json`` (the table, each
scenario's metrics and every violation). Exits 1 if any scenario failed.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

from reliability.checkers import CheckReport, Violation, render_summary_table
from reliability.cluster import say
from reliability.history import JSONValue
from reliability.scenarios import ScenarioOutcome
from reliability.suite import QUICK, SCENARIOS

RESULTS = Path(__file__).resolve().parent / "results"


def _failed(name: str, exc: BaseException, seconds: float) -> ScenarioOutcome:
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    report = CheckReport(
        scenario=name,
        operations=0,
        faults_injected=0,
        lost=0,
        duplicated=0,
        violations=(Violation("harness", f"the scenario raised: {text}"),),
        by_checker={"harness": 1},
    )
    return ScenarioOutcome(report, seconds, {"error": text})


def server_source() -> str:
    """Which server code the run exercised: the commit, and whether queue_server/ or client/
    (the SDK's distribution, with the policy and the wire shapes) had uncommitted changes (or
    PYTHONPATH pointed the server at another tree)."""
    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        try:
            done = subprocess.run(
                ["git", *args], cwd=root, capture_output=True, text=True, check=False, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return ""
        return done.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = bool(git("status", "--porcelain", "--", "queue_server", "client"))
    override = os.environ.get("PYTHONPATH", "")
    where = f"PYTHONPATH={override}" if override else "the working tree"
    state = "with uncommitted changes to queue_server/ or client/" if dirty else "clean"
    return f"server code from {where} at commit {commit} ({state})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reliability", description=__doc__)
    parser.add_argument(
        "--only",
        action="append",
        choices=sorted(SCENARIOS),
        help="run only this scenario (repeatable)",
    )
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="every scenario once with a small load and short phases (under 10 minutes),"
        " judged by the same checkers; results in reliability/results/quick unless --out",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="results directory (default reliability/results)"
    )
    args = parser.parse_args(argv)
    out = args.out or (RESULTS / "quick" if args.quick else RESULTS)
    if args.list:
        for name, fn in SCENARIOS.items():
            doc = (fn.__doc__ or "").strip().splitlines()
            print(f"{name}\t{doc[0] if doc else ''}")
        return 0
    names = args.only or list(SCENARIOS)
    outcomes: list[ScenarioOutcome] = []
    began = time.monotonic()
    for i, name in enumerate(names, 1):
        say(f"=== [{i}/{len(names)}] {name}")
        start = time.monotonic()
        try:
            scenario = SCENARIOS[name]
            if args.quick:
                scenario = functools.partial(scenario, **QUICK.get(name, {}))
            outcome = scenario()
        except Exception as exc:  # one broken scenario must not hide the others
            traceback.print_exc()
            outcome = _failed(name, exc, time.monotonic() - start)
        outcomes.append(outcome)
        report = outcome.report
        say(
            f"=== {name}: {report.result} in {outcome.seconds:.1f}s, "
            f"{report.operations} operations, {len(report.violations)} violations"
        )
        for violation in report.violations[:10]:
            say(f"    {violation}")
        for key, value in outcome.metrics.items():
            say(f"    {key}: {json.dumps(value)}")
    total = time.monotonic() - began
    table = render_summary_table(o.report for o in outcomes)
    print(table)
    print(f"\n{sum(o.passed for o in outcomes)}/{len(outcomes)} passed in {total:.0f}s")
    _write(out, outcomes, table, total, quick=args.quick)
    return 0 if all(o.passed for o in outcomes) else 1


def _write(
    out: Path, outcomes: list[ScenarioOutcome], table: str, total: float, *, quick: bool
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    lines = [
        "# Reliability suite: latest " + ("quick run (--quick: small load)" if quick else "run"),
        "",
        f"Run {stamp} on {platform.node() or 'this machine'} "
        f"(Python {platform.python_version()}, {os.cpu_count()} CPUs), {total:.0f} s in all; "
        f"{server_source()}. Figures as measured in this run.",
        "",
        table,
        "",
        "## Scenario metrics",
        "",
    ]
    for outcome in outcomes:
        lines.append(f"### {outcome.report.scenario} ({outcome.seconds:.1f} s)")
        lines.append("")
        for key, value in outcome.metrics.items():
            lines.append(f"- {key}: `{json.dumps(value)}`")
        checks = ", ".join(f"{k} {v}" for k, v in outcome.report.by_checker.items())
        lines.append(f"- violations by checker: {checks}")
        for violation in outcome.report.violations[:50]:
            lines.append(f"- VIOLATION {violation}")
        lines.append("")
    (out / "latest.md").write_text("\n".join(lines), encoding="utf-8")
    data: dict[str, JSONValue] = {
        "run_at": stamp,
        "seconds": round(total, 1),
        "server": server_source(),
        "scenarios": [
            {
                "scenario": o.report.scenario,
                "result": o.report.result,
                "seconds": round(o.seconds, 1),
                "operations": o.report.operations,
                "faults_injected": o.report.faults_injected,
                "lost": o.report.lost,
                "duplicated": o.report.duplicated,
                "violations": [str(v) for v in o.report.violations[:200]],
                "by_checker": dict(o.report.by_checker),
                "metrics": o.metrics,
            }
            for o in outcomes
        ],
    }
    (out / "latest.json").write_text(json.dumps(data, indent=2, sort_keys=True), encoding="utf-8")
    say(f"wrote {out / 'latest.md'} and {out / 'latest.json'}")


if __name__ == "__main__":
    sys.exit(main())
