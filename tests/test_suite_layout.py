"""The test suite's own layout: test modules share code through tests/helpers/ only."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def imports_of(source: str, module: str) -> set[str]:
    """Every module `source` (the text of `module`) imports, relative imports resolved."""
    package = module.split(".")[:-1]  # an __init__ module's own package, too
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            name = ".".join([*base, *([node.module] if node.module else [])])
            found.add(name)
            # `from tests.api import test_races` names a module too.
            found.update(f"{name}.{alias.name}" for alias in node.names)
    return found


def is_test_module(name: str) -> bool:
    last = name.rsplit(".", 1)[-1]
    return name.startswith("tests.") and (last.startswith("test_") or last == "conftest")


def test_no_module_under_tests_imports_a_test_module_or_a_conftest() -> None:
    offenders = sorted(
        f"{path.relative_to(ROOT)} imports {name}"
        for path in TESTS.rglob("*.py")
        for name in imports_of(path.read_text(), module_name(path))
        if is_test_module(name)
    )
    assert offenders == [], "share it through tests/helpers/ instead:\n" + "\n".join(offenders)


def test_the_check_resolves_absolute_relative_and_from_package_imports() -> None:
    source = (
        "from tests.api.test_races import x\n"
        "from .conftest import y\n"
        "from . import test_leases\n"
        "import tests.cli.conftest\n"
        "from tests.helpers.api import Api\n"
    )
    found = {n for n in imports_of(source, "tests.api.test_items") if is_test_module(n)}
    assert found == {
        "tests.api.test_races",
        "tests.api.conftest",
        "tests.api.test_leases",
        "tests.cli.conftest",
    }


def test_conftest_files_define_fixtures_and_hooks_only() -> None:
    """Helpers live in tests/helpers/; a conftest holds fixtures, hooks and their private parts."""
    offenders = []
    for path in TESTS.rglob("conftest.py"):
        for node in ast.parse(path.read_text()).body:
            where = path.relative_to(ROOT)
            if isinstance(node, ast.ClassDef):
                offenders.append(f"{where}: class {node.name}")
            elif (
                isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                and not node.decorator_list
                and not node.name.startswith(("pytest_", "_"))
            ):
                offenders.append(f"{where}: def {node.name}")
    assert offenders == [], "move these to tests/helpers/:\n" + "\n".join(offenders)
