"""Only the transport broker and the queue-server client may hold a raw network client."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("queue_server",)
# The broker owns outbound HTTP; the client SDK only ever talks to the queue server's own API.
OWNERS = (Path("queue_server/transport"), Path("queue_server/client"))
FORBIDDEN = ("httpx", "requests", "urllib.request", "http.client", "aiohttp", "socket")
_DYNAMIC_IMPORTERS = {"import_module", "__import__"}


def _forbidden(module: str) -> bool:
    """Whether a dotted module name is, or is inside, a network client module."""
    return any(module == f or module.startswith(f + ".") for f in FORBIDDEN)


def network_imports(source: str) -> list[str]:
    """Every network-client module a source file imports, statically or by name."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if _forbidden(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if _forbidden(node.module):
                found.append(node.module)
            # `from urllib import request` and `from http import client` name the module too.
            found += [
                f"{node.module}.{a.name}"
                for a in node.names
                if _forbidden(f"{node.module}.{a.name}")
            ]
        elif isinstance(node, ast.Call) and _called_name(node.func) in _DYNAMIC_IMPORTERS:
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found += [arg.value] if _forbidden(arg.value) else []
    return found


def _called_name(func: ast.expr) -> str | None:
    """The bare name of a called function or method."""
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _owned(path: Path) -> bool:
    """Whether a source file lives in a module allowed to hold a network client."""
    rel = path.relative_to(ROOT)
    return any(rel.is_relative_to(owner) for owner in OWNERS)


def test_no_module_outside_the_broker_and_client_imports_a_network_client() -> None:
    offenders = {
        str(path.relative_to(ROOT)): hits
        for top in SCANNED
        for path in sorted((ROOT / top).rglob("*.py"))
        if not _owned(path)
        if (hits := network_imports(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}


def test_the_scan_covers_the_server_and_cli_sources() -> None:
    scanned = [p for top in SCANNED for p in (ROOT / top).rglob("*.py") if not _owned(p)]
    assert ROOT / "queue_server" / "infra" / "embedded.py" in scanned
    assert any(p.parts[-2] == "cli" for p in scanned)


@pytest.mark.parametrize(
    "source",
    [
        "import socket",
        "import httpx as h",
        "import urllib.request",
        "from urllib import request",
        "from http import client",
        "from http.client import HTTPConnection",
        "import aiohttp.web",
        "from requests import Session",
        "def f():\n    import socket",
        "importlib.import_module('socket')",
        "__import__('http.client')",
    ],
)
def test_negative_control_detects_every_spelling(source: str) -> None:
    assert network_imports(source) != []


@pytest.mark.parametrize(
    "source",
    [
        "import urllib.parse",
        "from urllib.parse import quote",
        "from http import HTTPStatus",
        "import socketserver_helpers_not_real",
        "from . import socket",
        "import ssl",
    ],
)
def test_negative_control_allows_non_network_modules(source: str) -> None:
    assert network_imports(source) == []
