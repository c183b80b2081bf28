"""schemathesis against the real server's ``/openapi.json``, with valid (admin)
credentials, every phase the installed version has (examples, coverage,
fuzzing, stateful), bounded by ``--max-examples`` per operation and a wall-clock
timeout.

Hard findings (violations): any 5xx; an error answer that is not
``application/problem+json``; a status the operation does not document; and
schemathesis's own conformance failures (response schema, content type,
headers, ignored auth). Softer findings (a schema-valid request refused for a
semantic reason, a schema-violating one accepted, ``Allow`` headers, slow
long-polls) are reported in the metrics, not counted as violations.

schemathesis's text output is kept in ``reliability/results/schemathesis.txt``
(reproducible with its ``st replay``/curl lines while the run's cluster lives).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path

import httpx

from reliability.checkers import CheckReport, Violation
from reliability.cluster import Cluster, say, venv_bin
from reliability.history import JSONValue
from reliability.scenarios import FAST_API_ENV, REPO_ROOT, ScenarioOutcome

__all__ = ["HARD_CODES", "schema_fuzz", "schemathesis_available"]

RESULTS = Path(__file__).resolve().parent / "results"
#: schemathesis failure codes that count as violations (see the module docstring).
HARD_CODES = frozenset({f"ST1{n:02d}" for n in range(1, 12)} | {"ST401", "ST402", "ST901"})
METHODS = ("get", "put", "post", "delete", "patch")


def schemathesis_available() -> bool:
    return shutil.which(venv_bin("st")) is not None or Path(venv_bin("st")).exists()


def _documented(spec: dict[str, JSONValue]) -> dict[tuple[str, str], set[int]]:
    out: dict[tuple[str, str], set[int]] = {}
    paths = spec.get("paths")
    if not isinstance(paths, dict):
        return out
    for template, ops in paths.items():
        if not isinstance(ops, dict):
            continue
        for method, op in ops.items():
            if method in METHODS and isinstance(op, dict):
                responses = op.get("responses")
                codes = responses.keys() if isinstance(responses, dict) else ()
                out[(method.upper(), template)] = {int(c) for c in codes if c.isdigit()}
    return out


def _judge(
    exchanges: list[dict[str, JSONValue]], documented: dict[tuple[str, str], set[int]]
) -> tuple[list[Violation], Counter[str]]:
    """5xx, non-problem errors, undocumented statuses: one violation per (kind, route, status)."""
    seen: set[tuple[str, str, str, int]] = set()
    out: list[Violation] = []
    statuses: Counter[str] = Counter()
    for ex in exchanges:
        method, template = str(ex["method"]), str(ex["template"])
        status = int(str(ex["status"]))
        statuses[str(status)] += 1
        ctype = str(ex.get("content_type", ""))
        found: list[tuple[str, str]] = []
        if status >= 500:
            found.append(("no-5xx", f"answered {status}"))
        if status >= 400 and not ctype.startswith("application/problem+json"):
            found.append(("problem-json", f"{status} answered as {ctype!r}"))
        known = documented.get((method, template))
        if known is not None and status not in known:
            found.append(("documented-status", f"{status} is not documented ({sorted(known)})"))
        for checker, what in found:
            key = (checker, method, template, status)
            if key in seen:
                continue
            seen.add(key)
            out.append(
                Violation(
                    checker,
                    f"{method} {template}: {what}; request {ex.get('url')} "
                    f"body {ex.get('request_body')!s:.200}; answer {ex.get('answer')!s:.200}",
                )
            )
    return out, statuses


def schema_fuzz(
    *,
    max_examples: int = 40,
    phases: str = "examples,coverage,fuzzing,stateful",
    timeout: float = 240.0,
    seed: int = 20261129,
    name: str = "schema fuzz (schemathesis)",
) -> ScenarioOutcome:
    """schemathesis, all phases, valid credentials: no 5xx, problem+json errors,
    documented statuses only."""
    began = time.monotonic()
    st = venv_bin("st")
    if not Path(st).exists() and shutil.which(st) is None:
        report = CheckReport(
            scenario=name,
            operations=0,
            faults_injected=0,
            lost=0,
            duplicated=0,
            violations=(
                Violation("harness", "schemathesis is not installed (pip install schemathesis)"),
            ),
            by_checker={"harness": 1},
        )
        return ScenarioOutcome(report, time.monotonic() - began, {"installed": False})
    version = subprocess.run(
        [st, "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    with Cluster(name="fuzz", api_env=FAST_API_ENV) as cluster:
        cluster.create_tenant("alpha", max_concurrency=4)
        spec = httpx.get(f"{cluster.base_url}/openapi.json", timeout=10).json()
        documented = _documented(spec)
        work = cluster.root / "schemathesis"
        work.mkdir()
        log = work / "exchanges.jsonl"
        config = work / "schemathesis.toml"
        bearer = f"Bearer {cluster.admin_key}"
        config.write_text(
            "[parameters]\n"
            '"path.tenant" = "alpha"\n'
            '"path.queue" = "q"\n'
            f'"header.authorization" = "{bearer}"\n',
            encoding="utf-8",
        )
        argv = [
            st,
            "--config-file",
            str(config),
            "run",
            f"{cluster.base_url}/openapi.json",
            "-H",
            f"Authorization: {bearer}",
            "--checks",
            "all",
            "--phases",
            phases,
            "--max-examples",
            str(max_examples),
            "--seed",
            str(seed),
            "--workers",
            "2",
            "--no-shrink",
            "--request-timeout",
            "40",
            "--max-response-time",
            "35",
            "--report",
            "json",
            "--report-dir",
            str(work),
        ]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
            ),
            "SCHEMATHESIS_HOOKS": "reliability.st_hooks",
            "RELIABILITY_ST_LOG": str(log),
            "NO_COLOR": "1",
        }
        say(f"{name}: {version}, {phases}, {max_examples} examples per operation")
        timed_out = False
        try:
            run = subprocess.run(
                argv,
                cwd=work,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
            output, code = run.stdout + run.stderr, run.returncode
        except subprocess.TimeoutExpired as exc:
            timed_out = True
            raw = exc.stdout or b""
            output = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
            code = -1
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "schemathesis.txt").write_text(
            output.replace(cluster.admin_key, "[admin key]"), encoding="utf-8"
        )
        exchanges: list[dict[str, JSONValue]] = []
        if log.exists():
            for line in log.read_text(encoding="utf-8").splitlines():
                with contextlib.suppress(ValueError):
                    exchanges.append(json.loads(line))
        summary: dict[str, JSONValue] = {}
        for path in work.glob("json-*.json"):
            with contextlib.suppress(ValueError):
                summary = json.loads(path.read_text(encoding="utf-8"))
        api_alive = cluster.api_proc is not None and cluster.api_proc.poll() is None
    violations, statuses = _judge(exchanges, documented)
    failures = summary.get("failures")
    hard: dict[str, JSONValue] = {}
    soft: dict[str, JSONValue] = {}
    for failure in failures if isinstance(failures, list) else []:
        if not isinstance(failure, dict):
            continue
        st_code = str(failure.get("code"))
        entry: JSONValue = {
            "title": failure.get("title"),
            "count": failure.get("count"),
            "operations": failure.get("operations"),
        }
        (hard if st_code in HARD_CODES else soft)[st_code] = entry
        if st_code in HARD_CODES and st_code not in ("ST101", "ST103", "ST901"):
            # 5xx, undocumented statuses and non-problem errors are judged above, with inputs.
            violations.append(Violation("schemathesis", f"{code} {failure.get('title')}: {entry}"))
    if timed_out:
        violations.append(Violation("harness", f"schemathesis ran past {timeout:.0f}s"))
    if not exchanges:
        violations.append(Violation("harness", f"schemathesis made no request (exit {code})"))
    if not api_alive:
        violations.append(Violation("no-5xx", "the API process died"))
    phase_status = summary.get("phases")
    errors = summary.get("errors")
    metrics: dict[str, JSONValue] = {
        "schemathesis": version,
        "max_examples": max_examples,
        "exit_code": code,
        "requests": len(exchanges),
        "statuses": dict(sorted(statuses.items())),
        "phases": {
            str(k): (v.get("status") if isinstance(v, dict) else v)
            for k, v in (phase_status.items() if isinstance(phase_status, dict) else [])
        },
        "operations": summary.get("operations"),
        "hard_failures": hard,
        "soft_findings": soft,
        "tool_errors": errors,
    }
    by_checker: dict[str, int] = {}
    for violation in violations:
        by_checker[violation.checker] = by_checker.get(violation.checker, 0) + 1
    report = CheckReport(
        scenario=name,
        operations=len(exchanges),
        faults_injected=0,
        lost=0,
        duplicated=0,
        violations=tuple(violations),
        by_checker=by_checker or {"no-5xx": 0, "problem-json": 0, "documented-status": 0},
    )
    return ScenarioOutcome(report, time.monotonic() - began, metrics)
