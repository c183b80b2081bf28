"""The test suite's own layout: test modules share code through tests/helpers/ only."""

from __future__ import annotations

import ast
import subprocess
import sys
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


# The benchmark's extra (`.[bench]` in pyproject.toml): `make test` and CI install the package
# without it, so no module the suite or the reliability suites import may need one of these.
BENCH_ONLY = ("pgqueuer", "procrastinate", "py_spy")

_IMPORT_WITHOUT = """
import importlib, importlib.abc, sys

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in sys.argv[1].split(","):
            raise ModuleNotFoundError(f"No module named {name!r} (the bench extra)")
        return None

sys.meta_path.insert(0, Refuse())
failed = []
for module in sys.argv[2:]:
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        failed.append(f"{module}: {exc}")
print("\\n".join(failed))
"""


def _reaches_the_bench_package(modules: dict[str, set[str]]) -> set[str]:
    """The modules among `modules` (name: what it imports) whose imports, followed through
    the repository's own modules, reach `bench`."""
    reaching = {name for name, imported in modules.items() if any(
        i == "bench" or i.startswith("bench.") for i in imported)}  # fmt: skip
    while True:
        more = {
            name
            for name, imported in modules.items()
            if name not in reaching and imported & reaching
        }
        if not more:
            return reaching
        reaching |= more


def test_every_test_and_reliability_module_imports_without_the_benchmarks_extra() -> None:
    """CI runs `make test` where `.[bench]` is not installed: a test of the benchmark's report
    that imports a module needing pgqueuer fails to be collected there, and nowhere else.
    Each module that reaches the benchmark's package is imported with the extra refused."""
    sources = {
        module_name(path): path.read_text()
        for top in (TESTS, ROOT / "reliability", ROOT / "bench")
        for path in top.rglob("*.py")
        if path.name != "__main__.py" and "__pycache__" not in path.parts
    }
    modules = {name: imports_of(text, name) for name, text in sources.items()}
    suspects = sorted(
        name
        for name in _reaches_the_bench_package(modules)
        if not name.startswith("bench.") and name != "bench"
    )
    assert "tests.test_bench_report" in suspects  # the walk finds what it must
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_WITHOUT, ",".join(BENCH_ONLY), *suspects],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    assert done.stdout.strip() == "", done.stdout


ONE_OFF_CALLS = {"get", "post", "put", "patch", "delete", "head", "options", "request", "stream"}


def tls_loading_calls(source: str) -> list[int]:
    """Lines of `source` that make an httpx client loading the CA bundle of its own: a module
    function (`httpx.get`) or an `httpx.Client`/`AsyncClient` given neither `verify` nor
    `transport`."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner, name = node.func.value, node.func.attr
        if not (isinstance(owner, ast.Name) and owner.id == "httpx"):
            continue
        given = {keyword.arg for keyword in node.keywords}
        own_context = name in ONE_OFF_CALLS and "verify" not in given
        own_client = name in {"Client", "AsyncClient"} and not given & {"verify", "transport"}
        if own_context or own_client:
            lines.append(node.lineno)
    return lines


def test_the_tests_http_calls_share_one_tls_context() -> None:
    """Each such client costs about 20 ms of CPU: tests/helpers/web.py has the shared ones."""
    offenders = sorted(
        f"{path.relative_to(ROOT)}:{line}"
        for path in TESTS.rglob("*.py")
        for line in tls_loading_calls(path.read_text())
    )
    assert offenders == [], "use tests.helpers.web:\n" + "\n".join(offenders)


def test_the_tls_check_finds_module_calls_and_clients_of_their_own() -> None:
    source = (
        "httpx.get(url)\n"
        "httpx.Client(base_url=url)\n"
        "httpx.get(url, verify=tls_context())\n"
        "httpx.AsyncClient(transport=transport)\n"
        "client.get(url)\n"
        "httpx.post(url, json={})\n"
    )
    assert tls_loading_calls(source) == [1, 2, 6]
