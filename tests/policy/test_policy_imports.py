"""The policy package's imports: one direction, no cycle, no lazy loader; and what the server
loads of it: the whole package, never the proof machinery or the demonstrators (test code).

A cycle is found on the source, wherever an import stands (at the top, under `if
TYPE_CHECKING:`, deferred into a function): a deferred import hides a cycle from any run, and
the package's `__init__` runs first whichever module is imported, so no import order would.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

import queue_server.policy as policy_package

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "queue_server"
# The client distribution's tree of the namespace package: the SDK, the policy, the wire shapes.
CLIENT_TREE = ROOT / "client" / "queue_server"
POLICY = CLIENT_TREE / "policy"
NAME = "queue_server.policy"

# The proof that each cell is enforced, and the thin clients of the other operation classes:
# test code, and where they used to live in the package.
PROOF = ("tests", "queue_server.policy.bindings", "queue_server.policy.verifier")
DEMONSTRATORS = ("breaker", "permits", "mutation", "cancellation")


def _module(path: Path) -> str:
    return f"{NAME}.{path.stem}" if path.stem != "__init__" else NAME


def _sources() -> dict[str, str]:
    return {_module(path): path.read_text() for path in sorted(POLICY.glob("*.py"))}


def policy_imports(module: str, source: str, modules: set[str]) -> set[str]:
    """The modules of the policy package that `source` imports, anywhere in it.

    `from queue_server.policy import x` reads the package (its `__init__`, which imports every
    module) unless `x` is a module of its own; relative imports are resolved."""
    package = module if module == NAME else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {name for name in found if name in modules and name != module}


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Every import cycle of `graph` (module: what it imports), each from its first module."""
    found: list[list[str]] = []
    seen: set[tuple[str, ...]] = set()

    def walk(path: list[str]) -> None:
        for target in sorted(graph.get(path[-1], ())):
            if target in path:
                cycle = path[path.index(target) :]
                key = tuple(sorted(cycle))
                if key not in seen:
                    seen.add(key)
                    found.append([*cycle, target])
            else:
                walk([*path, target])

    for start in sorted(graph):
        walk([start])
    return found


def import_graph(sources: Mapping[str, str]) -> dict[str, set[str]]:
    return {m: policy_imports(m, text, set(sources)) for m, text in sources.items()}


def lazy_loading(source: str) -> list[str]:
    """What in a package's `__init__` defers its names: a module `__getattr__` or `__dir__`
    (PEP 562), `importlib` itself, or a public name bound only under `if TYPE_CHECKING:`."""
    tree = ast.parse(source)
    found = [
        f"def {node.name}"
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name in ("__getattr__", "__dir__")
    ]
    found += [
        f"imports {alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
        if "importlib" in (alias.name, getattr(node, "module", None))
    ]
    bound = {
        alias.asname or alias.name
        for node in tree.body
        if isinstance(node, ast.ImportFrom | ast.Import)
        for alias in node.names
    }
    exported = next(
        (
            [
                e.value
                for e in node.value.elts
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            ]
            for node in tree.body
            if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
            and isinstance(node.value, ast.List | ast.Tuple)
        ),
        [],
    )
    found += [f"{name} is not imported at the top" for name in exported if name not in bound]
    return found


def _loaded_by(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running `code`."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    modules: list[str] = json.loads(done.stdout.splitlines()[-1])
    return set(modules)


def _proof_modules(modules: set[str]) -> set[str]:
    return {m for m in modules for p in PROOF if m == p or m.startswith(p + ".")}


# -- one direction ------------------------------------------------------------------------


def test_the_policy_package_has_no_import_cycle() -> None:
    graph = import_graph(_sources())
    assert "queue_server.policy.values" in graph["queue_server.policy.loader"]  # it sees edges
    assert cycles(graph) == []


@pytest.mark.parametrize(
    ("module", "planted"),
    [
        # The cycles this package had: the package read back from a module it imports,
        # and two modules each importing the other, at the top or deferred.
        ("model", "from queue_server.policy import values\n"),
        ("model", "def f():\n    from queue_server.policy.values import LeasedWork\n"),
        (
            "errors",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from queue_server.policy.model import RefusalReason\n",
        ),
        ("v2", "from . import runtime\n"),
        ("retry", "from queue_server.policy import PolicyError\n"),
    ],
)
def test_a_planted_cycle_is_found(module: str, planted: str) -> None:
    sources = _sources()
    sources[f"{NAME}.{module}"] += "\n" + planted
    assert cycles(import_graph(sources)) != []


# -- no lazy loader -------------------------------------------------------------------------


def test_the_package_imports_every_name_it_offers_and_every_module_at_once() -> None:
    source = (POLICY / "__init__.py").read_text()
    assert lazy_loading(source) == []
    for name in policy_package.__all__:
        assert name in vars(policy_package), name
    loaded = _loaded_by(f"import {NAME}")
    assert {m for m in _sources() if m not in loaded} == set()


def test_a_lazy_loader_is_found() -> None:
    planted = (
        "from __future__ import annotations\n"
        "import importlib\n"
        "from typing import TYPE_CHECKING, Any\n"
        "if TYPE_CHECKING:\n"
        "    from queue_server.policy.model import OperationClass\n"
        "_WHERE = {'OperationClass': 'model'}\n"
        "def __getattr__(name: str) -> Any:\n"
        "    return getattr(importlib.import_module(f'{__name__}.{_WHERE[name]}'), name)\n"
        "__all__ = ['OperationClass']\n"
    )
    assert lazy_loading(planted) == [
        "def __getattr__",
        "imports importlib",
        "OperationClass is not imported at the top",
    ]


# -- what the server loads ----------------------------------------------------------------


def test_importing_the_app_loads_no_module_of_the_proof_machinery() -> None:
    loaded = _loaded_by("import queue_server.app")
    assert "queue_server.app" in loaded
    assert _proof_modules(loaded) == set()
    policy = {m for m in loaded if m == NAME or m.startswith(NAME + ".")}
    assert policy == set(_sources())


def test_the_check_finds_a_proof_module_the_process_imported() -> None:
    loaded = _loaded_by("import queue_server.app\nimport tests.policy_proof.verifier")
    assert {
        "tests.policy_proof.verifier",
        "tests.policy_proof.bindings",
        "tests.demonstrators.mutation",
    } <= _proof_modules(loaded)


def test_the_installed_package_holds_no_proof_machinery_and_no_demonstrator() -> None:
    assert not (POLICY / "bindings.py").exists()
    assert not (POLICY / "verifier.py").exists()
    for name in DEMONSTRATORS:
        assert not (POLICY / f"{name}.py").exists(), name
    for name in ("mutations", "turns", "verifier", "dependency"):
        assert not (CLIENT_TREE / "client" / f"{name}.py").exists(), name
    planted = [
        str(path.relative_to(ROOT))
        for path in [*PACKAGE.rglob("*.py"), *CLIENT_TREE.rglob("*.py")]
        if "CancelAfterDispatch" in path.read_text() or "InMemoryReceiptStore" in path.read_text()
    ]
    assert planted == []


def test_the_policy_package_stays_under_two_thousand_lines() -> None:
    lines = sum(len(path.read_text().splitlines()) for path in POLICY.glob("*.py"))
    assert lines < 2000, lines
