"""The SQL a reviewer reads is the SQL the server runs.

`queue_server/store/sql/*.sql` hold every registered statement fully expanded; they
must match what the code renders, and every statement the server sends must be a
registered one (no SQL assembled at a call site).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import Any

import pytest

from queue_server.store import sql

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "queue_server"
# Not the server's statements: the SDK, the reliability policy, outbound HTTP, migrations.
NOT_SERVER = ("client", "policy", "transport", "migrations")
# Run what they are given: the statement is checked where it is chosen.
PASS_THROUGH = {("queue_server.store.sql", "fetch_one"), ("queue_server.store.sql", "fetch_all")}
RUNNERS = {"execute": 0, "fetch_one": 1, "fetch_all": 1}


def test_rendered_sql_files_match_the_code() -> None:
    stale = sql.differences()
    assert stale == [], f"run `python -m queue_server.store.sql --write` ({', '.join(stale)})"


def test_every_store_module_with_statements_has_its_file() -> None:
    rendered = sql.render()
    assert {p.name for p in sql.SQL_DIR.glob("*.sql")} == set(rendered)
    # The statements a reviewer looks for first are there, in full.
    transitions = (sql.SQL_DIR / "transitions.sql").read_text(encoding="utf-8")
    for name in ("acquire", "heartbeat", "complete", "complete_many", "requeue", "replay"):
        assert f"-- name: {name}\n" in transitions
    assert "{" not in transitions, "a fragment was left unexpanded"


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _server_modules() -> list[Path]:
    return [
        path
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] not in NOT_SERVER
    ]


def _statement_arg(call: ast.Call) -> ast.expr | None:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    index = RUNNERS.get(name or "")
    if index is None or len(call.args) <= index:
        return None
    return call.args[index]


def _values(expr: ast.expr, module: Any, local: dict[str, ast.expr]) -> list[Any]:
    """Every value `expr` can take, resolved through the module's and the function's names."""
    if isinstance(expr, ast.IfExp):
        return _values(expr.body, module, local) + _values(expr.orelse, module, local)
    if isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Name):
        mapping = getattr(module, expr.value.id)
        return list(mapping.values())
    if isinstance(expr, ast.Name):
        if expr.id in local:
            return _values(local[expr.id], module, {})
        if hasattr(module, expr.id):
            return [getattr(module, expr.id)]
    # A literal, an f-string, a concatenation, a call: SQL assembled at the call site.
    return [ast.unparse(expr)]


def unregistered_statements(path: Path, source: str | None = None) -> list[str]:
    """The statements a server module runs that are not registered, as `module:line: text`."""
    registered = {text for named in sql.statements().values() for text in named.values()}
    name = _module_name(path)
    module = importlib.import_module(name)
    tree = ast.parse(source if source is not None else path.read_text(encoding="utf-8"))
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if (name, function.name) in PASS_THROUGH:
            continue
        local = {
            node.targets[0].id: node.value
            for node in ast.walk(function)
            if isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
        }
        for call in ast.walk(function):
            if not isinstance(call, ast.Call) or (arg := _statement_arg(call)) is None:
                continue
            for value in _values(arg, module, local):
                if value not in registered:
                    found.append(f"{name}:{call.lineno}: {str(value)[:60]}")
    return found


def test_every_statement_the_server_runs_is_registered() -> None:
    found = [hit for path in _server_modules() for hit in unregistered_statements(path)]
    assert found == []


@pytest.mark.parametrize(
    "call",
    [
        'await conn.execute("SELECT 1")',
        'await conn.execute(f"SELECT {x}")',
        "await conn.execute(_GET_ITEM + ' FOR UPDATE')",
        'await fetch_one(conn, "SELECT 1", {})',
        "sql = 'SELECT 2'\n    await conn.execute(sql)",
    ],
)
def test_a_statement_assembled_at_the_call_site_is_found(call: str) -> None:
    path = PACKAGE / "store" / "reads.py"
    source = path.read_text(encoding="utf-8") + f"\n\nasync def planted(conn, x):\n    {call}\n"
    assert len(unregistered_statements(path, source)) == 1
