"""Imports only go down: api -> services -> idempotency -> db -> store.

Layers, top to bottom (a module imports from its own layer or a lower one):

    app, infra.serve, cli      composition: build and run everything
    console                    the web console's pages (on the API's request models)
    api | workers              HTTP routes | background loops; neither imports the other
    services                   transaction boundaries and policy
    idempotency                the receipt protocol
    db                         the seam to PostgreSQL
    store                      every statement

Beside them, importable from any layer and importing none: the shared values and
utilities (errors, models, settings, views, tracecontext, auth, version, store.types, the
schema in store.tables, the transport broker, the migrations, and infra's metrics, key cache,
embedded PostgreSQL, migrate and HTTP protocol).

The client distribution (client/: the SDK, the reliability policy and the wire shapes) is
below them all: any layer may import the policy and the wire shapes, and the client imports
nothing of the server's. Only the composition layer uses the SDK itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "queue_server"
# The namespace package's other tree: the client distribution's.
CLIENT_TREE = ROOT / "client" / "queue_server"

LAYERS: list[set[str]] = [
    {"queue_server.app", "queue_server.infra.serve", "queue_server.cli"},
    {"queue_server.console"},
    {"queue_server.api", "queue_server.background"},
    {"queue_server.services"},
    {"queue_server.idempotency"},
    {"queue_server.db"},
    {"queue_server.store"},
]
SHARED = {
    "queue_server",
    "queue_server.errors",
    "queue_server.models",
    "queue_server.settings",
    "queue_server.views",
    "queue_server.version",
    "queue_server.tracecontext",
    "queue_server.auth",
    "queue_server.store.types",
    "queue_server.store.tables",
    "queue_server.transport",
    "queue_server.infra",
    "queue_server.migrations",
}
# Same layer, no imports between them.
INDEPENDENT = [("queue_server.api", "queue_server.background")]
CLIENT = "queue_server.client"
# The client distribution's units: each imports only these.
CLIENT_DISTRIBUTION = {CLIENT, "queue_server.policy", "queue_server.wire"}


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _longest(module: str, prefixes: set[str]) -> str | None:
    matches = [p for p in prefixes if _within(module, p)]
    return max(matches, key=len) if matches else None


def place(module: str) -> tuple[str, int | None]:
    """(the unit a module belongs to, its layer index or None for shared modules)."""
    layered = {p: i for i, layer in enumerate(LAYERS) for p in layer}
    unit = _longest(module, set(layered) | SHARED | CLIENT_DISTRIBUTION) or module
    if unit == "queue_server" and module != "queue_server":
        raise ValueError(f"{module} belongs to no layer: add it to tests/test_layers.py")
    return unit, layered.get(unit)


def imports(module: str, source: str) -> list[tuple[int, str]]:
    """Every queue_server module `source` imports, by line (relative imports resolved)."""
    package = module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return [(line, name) for line, name in found if _within(name, "queue_server")]


def violations(module: str, source: str) -> list[str]:
    unit, layer = place(module)
    found = []
    for line, target in imports(module, source):
        try:
            target_unit, target_layer = place(target)
        except ValueError:
            continue  # `from queue_server.x import name`: the module itself is checked
        where = f"{module}:{line} imports {target}"
        if unit in CLIENT_DISTRIBUTION:
            if target_unit not in CLIENT_DISTRIBUTION:
                found.append(f"{where}: the client distribution imports nothing of the server's")
            continue
        if target_unit in CLIENT_DISTRIBUTION - {CLIENT}:
            continue  # the policy and the wire shapes are below every layer
        if target_unit == CLIENT:
            if unit not in LAYERS[0]:
                found.append(f"{where}: only the composition layer uses the client")
            continue
        if layer is None:
            if target_layer is not None:
                found.append(f"{where}: a shared module imports a layer")
            continue
        if target_layer is not None and target_layer < layer:
            found.append(f"{where}: an import upwards")
        for a, b in INDEPENDENT:
            if {unit, target_unit} == {a, b}:
                found.append(f"{where}: {a} and {b} are independent")
    return found


def _module_name(path: Path) -> str:
    base = CLIENT_TREE.parent if path.is_relative_to(CLIENT_TREE) else ROOT
    return ".".join(path.relative_to(base).with_suffix("").parts).removesuffix(".__init__")


def _modules() -> list[Path]:
    return [
        p
        for tree in (PACKAGE, CLIENT_TREE)
        for p in sorted(tree.rglob("*.py"))
        if "migrations/versions" not in p.relative_to(tree).as_posix()
    ]


def test_imports_only_go_down() -> None:
    found = [hit for path in _modules() for hit in violations(_module_name(path), path.read_text())]
    assert found == []


def test_every_module_has_a_place() -> None:
    for path in _modules():
        place(_module_name(path))


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("queue_server.store.reads", "from queue_server.services import items"),
        ("queue_server.store.reads", "from queue_server import db"),
        ("queue_server.db", "import queue_server.idempotency"),
        ("queue_server.services.items", "from queue_server.api.deps import respond"),
        ("queue_server.services.items", "from queue_server.background.notifier import Notifier"),
        ("queue_server.api.routes", "from queue_server.background import sweeper"),
        ("queue_server.background.sweeper", "from queue_server.api import deps"),
        ("queue_server.views", "from queue_server.store import reads"),
        ("queue_server.errors", "from queue_server.services import common"),
        ("queue_server.client.worker", "from queue_server.errors import QueueServerError"),
        ("queue_server.client.core", "from queue_server.version import __version__"),
        ("queue_server.policy.retry", "from queue_server.transport.errors import TransportError"),
        ("queue_server.wire", "from queue_server import views"),
        ("queue_server.services.items", "from queue_server.client import QueueClient"),
        ("queue_server.store.tenants", "from ..services import keys"),
    ],
)
def test_a_planted_upward_import_is_found(module: str, source: str) -> None:
    assert violations(module, source) != []


def test_the_actual_imports_of_a_service_pass() -> None:
    path = PACKAGE / "services" / "items.py"
    assert violations("queue_server.services.items", path.read_text()) == []
    assert any(
        target.startswith("queue_server.store")
        for _, target in imports("queue_server.services.items", path.read_text())
    )


def test_no_module_exports_a_private_name() -> None:
    """`__all__` is what a module offers; a name with a leading underscore is its own."""
    exported = []
    for path in sorted(p for tree in (PACKAGE, CLIENT_TREE) for p in tree.rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if not (
                isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
                and isinstance(node.value, ast.List | ast.Tuple)
            ):
                continue
            exported += [
                f"{path.relative_to(ROOT)}: {element.value}"
                for element in node.value.elts
                if isinstance(element, ast.Constant)
                and isinstance(element.value, str)
                and element.value.startswith("_")
            ]
    assert exported == []


LONG = 800  # lines: past this a module holds more than one idea, unless it is a catalogue


def test_a_module_past_800_lines_is_a_catalogue_and_its_first_line_says_so() -> None:
    """One idea per file: a module longer than 800 lines is a catalogue read by name (a
    flow per route, a table per relation), and the first line of its docstring says so."""
    unexplained = []
    for path in sorted(p for tree in (PACKAGE, CLIENT_TREE) for p in tree.rglob("*.py")):
        source = path.read_text()
        if source.count("\n") <= LONG:
            continue
        docstring = ast.get_docstring(ast.parse(source), clean=False) or ""
        first = docstring.split("\n\n", 1)[0]
        if "catalogue" not in first or str(LONG) not in first:
            unexplained.append(f"{path.relative_to(ROOT)}: {source.count(chr(10))} lines")
    assert unexplained == [], unexplained
