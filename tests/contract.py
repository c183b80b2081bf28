"""The contract verifier with its weakenings: `python -m tests.contract` (run by `make test`).

For every binding of `tests/policy_proof/bindings.py` (and each negative control), run its
test under its weakening (`pytest -p tests.weakenings --weaken NAME`) and require that the
test fails: the weakened runtime must be caught. Tests of one weakening run in one pytest
process of their own, forked from this one once it has imported the libraries (see
`preload`); all share one embedded PostgreSQL (QUEUE_SERVER_TEST_PGDATA), so the whole
proof takes about half a minute. Exit 1 when the registry is incomplete or a weakening
goes unnoticed. `--write-docs` rewrites the table in docs/reliability-policy.md (the
drift test compares it with `render_table()`).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from queue_server.infra.embedded import EmbeddedPostgres
from tests.helpers.database import fast_logins
from tests.helpers.scratch import use_scratch_dir
from tests.policy_proof.bindings import BINDINGS, EXTRA_PROOFS, NEGATIVE_CONTROLS
from tests.policy_proof.verifier import render_table, verify_contract

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
    """One weakening's run: which of its tests failed, as they must."""

    weakening: str
    tests: tuple[str, ...]
    failed: frozenset[str]
    seconds: float
    output: str

    def caught(self, test: str) -> bool:
        return test in self.failed


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


_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+?)(?: - .*)?$", re.MULTILINE)


def _pytest_args(weakening: str, tests: Sequence[str]) -> list[str]:
    return [
        "-p",
        "tests.weakenings",
        "--weaken",
        weakening,
        "-q",
        "-rfE",
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

    The project's own modules are then forgotten, so each proof imports them after its
    weakening is applied, as a fresh process would: a value read at import (a module's
    permit gate sized from the policy) sees the weakened policy.
    """
    from importlib.metadata import entry_points

    import pytest  # noqa: F401
    import pytest_postgresql.janitor  # noqa: F401

    import tests.helpers.api  # noqa: F401  (the app and the clients the fixtures build)

    for plugin in entry_points(group="pytest11"):
        if plugin.name not in NO_PLUGINS:
            plugin.load()
    for name in [n for n in sys.modules if n.split(".")[0] in ("queue_server", "tests")]:
        if name not in _KEEP:
            del sys.modules[name]


# The verifier's own modules, which it goes on using.
_KEEP = frozenset({"tests", "tests.contract", "tests.helpers", "tests.helpers.scratch"})


@dataclass
class _Forked:
    weakening: str
    tests: tuple[str, ...]
    output: Path
    began: float


def _fork(weakening: str, tests: Sequence[str], env: dict[str, str], out: Path) -> int:
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
        code = int(pytest.main(_pytest_args(weakening, tests)))
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def prove_all(
    groups: dict[str, list[str]], env_of: Callable[[str], dict[str, str]], jobs: int, root: Path
) -> list[Proof]:
    """Each weakening's tests in a process of its own, `jobs` at once, forked from this one."""
    preload()
    waiting = list(groups.items())
    running: dict[int, _Forked] = {}
    proofs: dict[str, Proof] = {}
    while waiting or running:
        while waiting and len(running) < jobs:
            name, tests = waiting.pop(0)
            out = root / f"proof-{name}.log"
            pid = _fork(name, tests, env_of(name), out)
            running[pid] = _Forked(name, tuple(tests), out, time.monotonic())
        pid, _ = os.wait()
        forked = running.pop(pid, None)
        if forked is None:
            continue
        output = forked.output.read_text(errors="replace")
        failed = frozenset(m.group(1) for m in _FAILED.finditer(output))
        proofs[forked.weakening] = Proof(
            forked.weakening, forked.tests, failed, time.monotonic() - forked.began, output
        )
    return [proofs[name] for name in groups]


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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.contract", description=__doc__)
    parser.add_argument("--jobs", type=int, default=3, help="weakenings proven at once")
    parser.add_argument("--only", action="append", default=[], help="only these weakenings")
    parser.add_argument("--write-docs", action="store_true", help="rewrite the docs table")
    parser.add_argument("--json", type=Path, help="write the proofs as JSON here")
    parser.add_argument("-v", "--verbose", action="store_true", help="print pytest's output")
    args = parser.parse_args(argv)

    report = verify_contract()
    problems = [f"{f.cell}: {f.message}" for f in report.failures]
    pairs = [(b.cell, b.test, b.weakening) for b in (*BINDINGS, *EXTRA_PROOFS)]
    pairs += [(f"negative control: {c.path}", c.test, c.weakening) for c in NEGATIVE_CONTROLS]
    problems += [
        f"{cell}: test {test} not found" for cell, test, _ in pairs if not _test_exists(test)
    ]
    from tests.weakenings import WEAKENINGS

    problems += [
        f"{cell}: weakening {name!r} is not in tests/weakenings.py"
        for cell, _, name in pairs
        if name not in WEAKENINGS
    ]
    if problems:
        print("contract registry FAILED:", *problems, sep="\n  ")
        return 1

    groups: dict[str, list[str]] = {}
    for _, test, name in pairs:
        if not args.only or name in args.only:
            groups.setdefault(name, [])
            if test not in groups[name]:
                groups[name].append(test)

    use_scratch_dir()  # the server below, and the proofs' pytest runs
    root = Path(tempfile.mkdtemp(prefix="qs-contract-pg-"))
    # As root, PostgreSQL runs as a system user that must traverse to its data directory.
    root.chmod(0o711)
    pg = EmbeddedPostgres(root / "data", server_settings={"max_connections": "300", "fsync": "off"})
    began = time.monotonic()
    pg.start()
    fast_logins(pg)
    try:
        env = {**os.environ, PGDATA_ENV: str(pg.pgdata)}
        env.pop("QUEUE_SERVER_POLICY", None)
        _migrated_template(pg)
        shared = {**env, TEMPLATE_ENV: TEMPLATE}

        def env_of(name: str) -> dict[str, str]:
            return env if WEAKENINGS[name].own_schema else shared

        proofs = prove_all(groups, env_of, max(1, args.jobs), root)
    finally:
        pg.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)

    by_name = {p.weakening: p for p in proofs}
    missed = []
    rows = []
    for cell, test, name in pairs:
        if name not in by_name:
            continue
        caught = by_name[name].caught(test)
        rows.append({"cell": cell, "test": test, "weakening": name, "caught": caught})
        print(f"{'caught' if caught else 'MISSED':7} {name:45} {cell}")
        if not caught:
            missed.append((cell, test, name))
    for proof in proofs:
        if args.verbose or any(m[2] == proof.weakening for m in missed):
            print(f"\n--- {proof.weakening} ({proof.seconds:.1f}s) ---\n{proof.output[-3000:]}")
    print(
        f"\n{len(rows)} bindings, {len(proofs)} weakenings in {time.monotonic() - began:.0f}s;"
        f" cells: {report.bound} bound, {report.not_applicable} not-applicable,"
        f" {report.declared} declared only"
    )
    if args.json:
        args.json.write_text(json.dumps({"proofs": rows}, indent=2) + "\n")
    if missed:
        print("contract FAILED: a weakened runtime passed its test:")
        for cell, test, name in missed:
            print(f"  {cell}: {test} still passes under {name}")
        return 1
    if args.write_docs and not args.only:
        write_docs(render_table())
        print(f"wrote the table of {DOCS.relative_to(ROOT)}")
    print("contract verified: every binding's test fails under its weakening")
    return 0


if __name__ == "__main__":
    sys.exit(main())
