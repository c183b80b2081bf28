"""The contract verifier with its weakenings: `python -m tests.contract` (run by `make test`).

For every binding of `tests/policy_proof/bindings.py` (and each negative control), first run
its test on the runtime as it is: it must pass (a test that fails unweakened proves nothing
by failing weakened). Then run it under its weakening (`pytest -p tests.weakenings --weaken
NAME`) and require that it fails: the weakened runtime must be caught. A weakening that can
no longer be applied (its SQL text or its target is gone) is an error naming it, never a
pass. Each run is a pytest process of its own, forked from this one once it has imported
the libraries (see `preload`), several at once; all share one embedded PostgreSQL
(QUEUE_SERVER_TEST_PGDATA). Exit 1 when the registry is incomplete, a bound test fails
unweakened, a weakening cannot be applied or goes unnoticed. `--write-docs` rewrites the
table in docs/reliability-policy.md (the drift test compares it with `render_table()`).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from queue_server.infra.embedded import EmbeddedPostgres
from tests.helpers.database import fast_logins
from tests.helpers.scratch import use_scratch_dir
from tests.policy_proof.bindings import BINDINGS, EXTRA_PROOFS, NEGATIVE_CONTROLS
from tests.policy_proof.verifier import render_table, verify_contract
from tests.weakenings import UNAPPLIABLE, WEAKENINGS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "reliability-policy.md"
BEGIN = "<!-- contract table: written by `python -m tests.contract --write-docs` -->"
END = "<!-- end of contract table -->"
PGDATA_ENV = "QUEUE_SERVER_TEST_PGDATA"
TEMPLATE_ENV = "QUEUE_SERVER_TEST_TEMPLATE"
TEMPLATE = "qs_contract_template"
# Plugins the bound tests do not use: their imports cost a second per process.
NO_PLUGINS = ("schemathesis", "hypothesispytest", "playwright", "base_url", "cacheprovider")


@dataclass(frozen=True)
class Proof:
    """One pytest run: a weakening's (or, `weakening` None, the unweakened runtime's)."""

    weakening: str | None
    tests: tuple[str, ...]
    failed: frozenset[str]
    passed: frozenset[str]
    seconds: float
    output: str

    def caught(self, test: str) -> bool:
        return test in self.failed

    def holds(self, test: str) -> bool:
        """The test ran and passed (every parameter of it)."""
        return test in self.passed and test not in self.failed

    @property
    def unappliable(self) -> str | None:
        """Why the weakening could not be applied, if it could not."""
        found = re.search(rf"{re.escape(UNAPPLIABLE)} (.*)", self.output)
        return found.group(1).strip() if found else None


def _test_exists(spec: str) -> bool:
    path, _, name = spec.partition("::")
    file = ROOT / path
    if not file.is_file():
        return False
    tree = ast.parse(file.read_text())
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name
        for node in tree.body
    )


# pytest's short summary (`-rfEp`): one line per test, parameters stripped (`[...]`).
_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+?)(?:\[\S*\])?(?: - .*)?$", re.MULTILINE)
_PASSED = re.compile(r"^PASSED (\S+?)(?:\[\S*\])?$", re.MULTILINE)


def _pytest_args(weakening: str | None, tests: Sequence[str]) -> list[str]:
    return [
        "-p",
        "tests.weakenings",
        *(("--weaken", weakening) if weakening else ()),
        "-q",
        "-rfEp",
        *(arg for plugin in NO_PLUGINS for arg in ("-p", f"no:{plugin}")),
        "-o",
        "addopts=",
        "-W",
        "ignore",
        *tests,
    ]


def preload() -> None:
    """Import the libraries every proof's pytest imports (pytest's plugins, FastAPI, psycopg,
    alembic...), once, before the proofs are forked from this process: a fresh interpreter
    spends about three seconds of CPU on them before its first test.

    The project's own modules stay imported (the server, the SDK, the store: most of a
    proof's start-up): a weakening patches them where the runtime reads at call time, and no
    module of the package reads the policy at import. The test modules are forgotten, so
    each proof collects them as a fresh process would.
    """
    from importlib.metadata import entry_points

    import pytest  # noqa: F401
    import pytest_postgresql.janitor  # noqa: F401

    import tests.helpers.api  # noqa: F401  (the app and the clients the fixtures build)

    for plugin in entry_points(group="pytest11"):
        if plugin.name not in NO_PLUGINS:
            plugin.load()
    # What the proofs run in process besides the app: the CLI and the deliverer.
    importlib.import_module("queue_server.cli.main")
    importlib.import_module("queue_server.background.deliverer")

    for name in [n for n in sys.modules if n.split(".")[0] == "tests"]:
        if name not in _KEEP:
            del sys.modules[name]


# The verifier's own modules, which it goes on using.
_KEEP = frozenset({"tests", "tests.contract", "tests.helpers", "tests.helpers.scratch"})
# A proof's key: the weakening's name, or BASELINE and a chunk number for the unweakened runs.
BASELINE = ""


@dataclass(frozen=True)
class Run:
    """One pytest process to fork: `weakening` applied (None: the runtime as it is)."""

    key: str
    weakening: str | None
    tests: tuple[str, ...]


@dataclass
class _Forked:
    run: Run
    output: Path
    began: float


def _fork(run: Run, env: dict[str, str], out: Path) -> int:
    """A child of this (preloaded, single-threaded) process that runs the proof's pytest with
    `env` as its environment, its output into `out`; its pid."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        import pytest

        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(ROOT)
        code = int(pytest.main(_pytest_args(run.weakening, run.tests)))
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def prove_all(
    runs: Sequence[Run], env_of: Callable[[Run], dict[str, str]], jobs: int, root: Path
) -> dict[str, Proof]:
    """Each run in a process of its own, `jobs` at once, forked from this one; by key."""
    preload()
    waiting = list(runs)
    running: dict[int, _Forked] = {}
    proofs: dict[str, Proof] = {}
    while waiting or running:
        while waiting and len(running) < jobs:
            run = waiting.pop(0)
            out = root / f"proof-{run.key}.log"
            pid = _fork(run, env_of(run), out)
            running[pid] = _Forked(run, out, time.monotonic())
        pid, _ = os.wait()
        forked = running.pop(pid, None)
        if forked is None:
            continue
        output = forked.output.read_text(errors="replace")
        proofs[forked.run.key] = Proof(
            forked.run.weakening,
            forked.run.tests,
            frozenset(m.group(1) for m in _FAILED.finditer(output)),
            frozenset(m.group(1) for m in _PASSED.finditer(output)),
            time.monotonic() - forked.began,
            output,
        )
    return proofs


def save_proofs(proofs: dict[str, Proof], path: Path) -> None:
    """The proofs as JSON, for a later run's `--proofs-from`; written whole or not at all."""
    rows = [
        {
            "key": key,
            "weakening": p.weakening,
            "tests": list(p.tests),
            "failed": sorted(p.failed),
            "passed": sorted(p.passed),
            "seconds": p.seconds,
            "output": p.output,
        }
        for key, p in proofs.items()
    ]
    staged = path.with_name(path.name + ".new")
    staged.write_text(json.dumps(rows))
    staged.replace(path)


def load_proofs(path: Path, runs: Sequence[Run]) -> dict[str, Proof]:
    """The saved proofs of these runs: a run's proof counts only if it ran the same tests
    under the same weakening (a file from another tree's bindings proves nothing here)."""
    wanted = {run.key: run for run in runs}
    proofs = {}
    for row in json.loads(path.read_text()):
        run = wanted.get(row["key"])
        if run is None or (run.weakening, run.tests) != (row["weakening"], tuple(row["tests"])):
            continue
        proofs[run.key] = Proof(
            run.weakening,
            run.tests,
            frozenset(row["failed"]),
            frozenset(row["passed"]),
            row["seconds"],
            row["output"],
        )
    return proofs


def _cases(results: Path) -> Iterator[tuple[str, Any]]:
    """Each test case of a run's JUnit XML: the test it is a parameter of, and its element."""
    from xml.etree import ElementTree

    for case in ElementTree.parse(results).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/") + ".py"
        yield f"{module}::{case.get('name', '').split('[', 1)[0]}", case


def passed_in(results: Path) -> Proof:
    """The unweakened runtime's proof, read from a run of the suite that just ran on it
    (`make test` runs the suite, then this: its JUnit XML), rather than run again: a test
    holds when every parameter of it passed there, and fails unweakened when one did not
    (failed, errored or skipped). `plan` runs unweakened here only the bound tests the run
    did not have."""
    passed: set[str] = set()
    failed: set[str] = set()
    for test, case in _cases(results):
        outcome = {child.tag for child in case} & {"failure", "error", "skipped"}
        (failed if outcome else passed).add(test)
    return Proof(None, tuple(sorted(passed | failed)), frozenset(failed), frozenset(passed), 0, "")


def durations_in(results: Path) -> dict[str, float]:
    """Each test's seconds in a run of the suite (its JUnit XML), its parameters added up."""
    seconds: dict[str, float] = {}
    for test, case in _cases(results):
        seconds[test] = seconds.get(test, 0.0) + float(case.get("time") or 0)
    return seconds


def plan(
    pairs: Sequence[tuple[str, str, str]],
    chunks: int,
    known: Proof | None = None,
    durations: dict[str, float] | None = None,
) -> list[Run]:
    """The unweakened runs of every bound test (in `chunks` processes), then one run per
    weakening with its tests. The unweakened runs go first: they hold the most tests.
    A test whose unweakened outcome is `known` (`passed_in`) is not run unweakened again.
    With the tests' `durations` (`durations_in`), the weakenings whose tests took longest
    go first: a proof of ten seconds started last would run on alone at the end."""
    tests = [
        test
        for test in dict.fromkeys(test for _, test, _ in pairs)
        if known is None or test not in known.tests
    ]
    size = max(1, -(-len(tests) // max(1, chunks)))
    runs = [
        Run(f"{BASELINE}{n}", None, tuple(tests[i : i + size]))
        for n, i in enumerate(range(0, len(tests), size))
    ]
    groups: dict[str, list[str]] = {}
    for _, test, name in pairs:
        groups.setdefault(name, [])
        if test not in groups[name]:
            groups[name].append(test)
    weakened = [Run(name, name, tuple(group)) for name, group in groups.items()]
    if durations:
        weakened.sort(key=lambda run: -sum(durations.get(test, 0.0) for test in run.tests))
    return runs + weakened


@dataclass(frozen=True)
class Verdict:
    """What the runs say about one binding: `word` caught, or ERROR (the proof could not be
    made) or MISSED (the weakened runtime passed), with the problem."""

    cell: str
    test: str
    weakening: str
    word: str
    problem: str | None = None


def judge(pairs: Sequence[tuple[str, str, str]], proofs: dict[str, Proof]) -> list[Verdict]:
    baseline = [p for p in proofs.values() if p.weakening is None]
    verdicts = []
    for cell, test, name in pairs:
        runs = [p for p in baseline if test in p.tests]
        weakened = proofs[name]
        if not runs or not runs[0].holds(test):
            verdict = Verdict(cell, test, name, "ERROR", f"test {test} fails unweakened")
        elif weakened.unappliable:
            verdict = Verdict(
                cell,
                test,
                name,
                "ERROR",
                f"weakening {name!r} cannot be applied: {weakened.unappliable}",
            )
        elif not weakened.caught(test):
            verdict = Verdict(cell, test, name, "MISSED", f"test {test} still passes under {name}")
        else:
            verdict = Verdict(cell, test, name, "caught")
        verdicts.append(verdict)
    return verdicts


def _migrated_template(pg: EmbeddedPostgres) -> None:
    """One template at head for every weakening that leaves the schema alone."""
    import psycopg

    from queue_server.infra import migrate

    with psycopg.connect(pg.url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {TEMPLATE}".encode())
    migrate.upgrade(pg.url(TEMPLATE))
    with psycopg.connect(pg.url(), autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE {TEMPLATE} WITH is_template true".encode())


def write_docs(table: str) -> None:
    text = DOCS.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    DOCS.write_text(text[:start] + "\n\n" + table + "\n" + text[end:])


def prove(runs: Sequence[Run], jobs: int) -> dict[str, Proof]:
    """The runs, on a PostgreSQL of their own with a template at head (none: no server)."""
    if not runs:
        return {}
    use_scratch_dir()  # the server below, and the proofs' pytest runs
    root = Path(tempfile.mkdtemp(prefix="qs-contract-pg-"))
    # As root, PostgreSQL runs as a system user that must traverse to its data directory.
    root.chmod(0o711)
    settings = {"max_connections": "300", "fsync": "off", "track_commit_timestamp": "on"}
    pg = EmbeddedPostgres(root / "data", server_settings=settings)  # as tests/conftest.py's
    pg.start()
    fast_logins(pg)
    try:
        env = {**os.environ, PGDATA_ENV: str(pg.pgdata)}
        env.pop("QUEUE_SERVER_POLICY", None)
        _migrated_template(pg)
        shared = {**env, TEMPLATE_ENV: TEMPLATE}

        def env_of(run: Run) -> dict[str, str]:
            own = run.weakening is not None and WEAKENINGS[run.weakening].own_schema
            return env if own else shared

        return prove_all(runs, env_of, jobs, root)
    finally:
        pg.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.contract", description=__doc__)
    # Four at once on two cores: a proof waits on its database and servers for much of its
    # time (three: 46 s, four: 38 s, five: 33 s with both cores near full).
    parser.add_argument("--jobs", type=int, default=4, help="weakenings proven at once")
    parser.add_argument("--only", action="append", default=[], help="only these weakenings")
    parser.add_argument("--write-docs", action="store_true", help="rewrite the docs table")
    parser.add_argument("--json", type=Path, help="write the proofs as JSON here")
    parser.add_argument(
        "--passed-in",
        type=Path,
        metavar="JUNIT_XML",
        help="the suite's results on this very tree (`make test` passes the run it just made):"
        " a bound test that passed there is not run unweakened again",
    )
    parser.add_argument(
        "--save-proofs",
        type=Path,
        metavar="JSON",
        help="make the weakened runs only, save them here and stop, judging nothing (`make"
        " test` makes them beside the suite, at a lower priority, then judges with"
        " --proofs-from and --passed-in once the suite has passed)",
    )
    parser.add_argument(
        "--proofs-from",
        type=Path,
        metavar="JSON",
        help="runs that a --save-proofs run made on this very tree: not made again (a run"
        " missing from the file, or the file itself, is made here)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="print pytest's output")
    parser.add_argument(
        "--proofs",
        metavar="MODULE:NAME",
        help="prove these (cell, test, weakening) triples instead of the bindings (the"
        " verifier's own test: tests.policy_proof.examples:EXAMPLES)",
    )
    args = parser.parse_args(argv)

    report = verify_contract()
    problems = [f"{f.cell}: {f.message}" for f in report.failures]
    pairs = [(b.cell, b.test, b.weakening) for b in (*BINDINGS, *EXTRA_PROOFS)]
    pairs += [(f"negative control: {c.path}", c.test, c.weakening) for c in NEGATIVE_CONTROLS]
    problems += [
        f"{cell}: test {test} not found" for cell, test, _ in pairs if not _test_exists(test)
    ]
    problems += [
        f"{cell}: weakening {name!r} is not in tests/weakenings.py"
        for cell, _, name in pairs
        if name not in WEAKENINGS
    ]
    if args.proofs:
        module, _, name = args.proofs.partition(":")
        pairs = list(getattr(importlib.import_module(module), name))
        problems = [
            f"{cell}: test {test} not found" for cell, test, _ in pairs if not _test_exists(test)
        ]
    if problems:
        print("contract registry FAILED:", *problems, sep="\n  ")
        return 1

    if args.only:
        pairs = [pair for pair in pairs if pair[2] in args.only]

    began = time.monotonic()
    jobs = max(1, args.jobs)
    known = passed_in(args.passed_in) if args.passed_in else None
    durations = durations_in(args.passed_in) if args.passed_in else None
    runs = plan(pairs, jobs, known, durations)
    if args.save_proofs:
        runs = [run for run in runs if run.weakening is not None]
    saved = {}
    if args.proofs_from and args.proofs_from.exists():
        saved = load_proofs(args.proofs_from, runs)
        runs = [run for run in runs if run.key not in saved]
    proofs = {**saved, **prove(runs, jobs)}
    if args.save_proofs:
        save_proofs(proofs, args.save_proofs)
        print(f"saved {len(proofs)} weakened runs to {args.save_proofs}")
        return 0
    if known is not None:
        proofs[f"{BASELINE}suite"] = known

    verdicts = judge(pairs, proofs)
    for v in verdicts:
        print(f"{v.word:7} {v.weakening:45} {v.cell}")
    wrong = [v for v in verdicts if v.problem]
    shown = {v.weakening for v in wrong} | {
        key
        for key, p in proofs.items()
        if p.weakening is None and any(v.test in p.tests for v in wrong)
    }
    for key, proof in proofs.items():
        if args.verbose or key in shown:
            label = proof.weakening or "unweakened"
            print(f"\n--- {label} ({proof.seconds:.1f}s) ---\n{proof.output[-3000:]}")
    weakenings = sum(1 for p in proofs.values() if p.weakening)
    print(
        f"\n{len(verdicts)} bindings, {weakenings} weakenings in {time.monotonic() - began:.0f}s;"
        f" cells: {report.bound} bound, {report.not_applicable} not-applicable,"
        f" {report.declared} declared only"
    )
    if args.json:
        rows = [
            {"cell": v.cell, "test": v.test, "weakening": v.weakening, "problem": v.problem}
            for v in verdicts
        ]
        args.json.write_text(json.dumps({"proofs": rows}, indent=2) + "\n")
    if wrong:
        print("contract FAILED:")
        for v in wrong:
            print(f"  {v.cell}: {v.problem}")
        return 1
    if args.write_docs and not args.only:
        write_docs(render_table())
        print(f"wrote the table of {DOCS.relative_to(ROOT)}")
    print("contract verified: every bound test passes as it is and fails under its weakening")
    return 0


if __name__ == "__main__":
    sys.exit(main())
