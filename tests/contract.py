"""The contract verifier with its weakenings: `python -m tests.contract` (run by `make test`).

For every binding of `tests/policy_proof/bindings.py` (and each negative control), run its
test under its weakening (`pytest -p tests.weakenings --weaken NAME`) and require that the
test fails: the weakened runtime must be caught. Tests of one weakening run in one pytest
process; all processes share one embedded PostgreSQL (QUEUE_SERVER_TEST_PGDATA), so the
whole proof takes about a minute. Exit 1 when the registry is incomplete or a weakening
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
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from queue_server.infra.embedded import EmbeddedPostgres
from tests.policy_proof.bindings import BINDINGS, NEGATIVE_CONTROLS
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


def prove(weakening: str, tests: Sequence[str], env: dict[str, str]) -> Proof:
    """Run `tests` under `weakening`; return which of them failed."""
    began = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
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
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = done.stdout + done.stderr
    failed = frozenset(m.group(1) for m in _FAILED.finditer(output))
    return Proof(weakening, tuple(tests), failed, time.monotonic() - began, output)


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
    pairs = [(b.cell, b.test, b.weakening) for b in BINDINGS]
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

    root = Path(tempfile.mkdtemp(prefix="qs-contract-pg-"))
    # As root, PostgreSQL runs as a system user that must traverse to its data directory.
    root.chmod(0o711)
    pg = EmbeddedPostgres(root / "data", server_settings={"max_connections": "300", "fsync": "off"})
    began = time.monotonic()
    pg.start()
    try:
        env = {**os.environ, PGDATA_ENV: str(pg.pgdata)}
        env.pop("QUEUE_SERVER_POLICY", None)
        _migrated_template(pg)
        shared = {**env, TEMPLATE_ENV: TEMPLATE}

        def run(item: tuple[str, list[str]]) -> Proof:
            name, tests = item
            return prove(name, tests, env if WEAKENINGS[name].own_schema else shared)

        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            proofs = list(pool.map(run, groups.items()))
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
