"""Who may open a connection: the transport broker, for the outside world; the SDK's one
transport (`client/queue_server/client/connection.py`), for the queue server itself; and the
modules named in ALLOWED below, each for exactly what it is named with and why.

The check reads every module of the installed package (`queue_server/`) and finds:

- imports of network client modules (httpx, requests, aiohttp, urllib3, socket,
  http.client, urllib.request, ftplib, smtplib, ..., uvicorn), static or by name
  (`importlib.import_module("socket")`, `__import__("http.client")`);
- calls, by their resolved name, of what opens a connection, a listening socket or a
  name lookup, however the module was reached (an alias, a `from` import, a module
  object from `import_module`, `getattr(obj, "create_connection")`): `socket.socket`,
  `socket.create_connection`, `ssl` `wrap_socket`, `http.client.HTTPConnection`,
  `urllib.request.urlopen`, `asyncio.open_connection`, a loop's `create_connection`,
  httpx clients, database connections and pools, uvicorn's server;
- subprocess calls (`subprocess.*`, `os.system`, `os.exec*`, `asyncio.create_subprocess_*`)
  whose command is a network tool by name (curl, wget, nc, ssh, openssl, psql, ...).

A finding outside its module's allowance fails the check. There is no exemption by
package: the SDK's other modules, the CLI and the server are checked like the rest.
Tests, the reliability harness and the benchmark are not part of the product and
are not scanned.
"""

from __future__ import annotations

import ast
import functools
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "queue_server"
# The namespace package's two trees: the server's, and the SDK's distribution (client/).
TREES = (PACKAGE, f"client/{PACKAGE}")
SDK = f"client/{PACKAGE}/client"

# Importing any of these (or a submodule) acquires a network client or server.
NETWORK_MODULES = (
    "httpx",
    "httpcore",
    "requests",
    "aiohttp",
    "urllib3",
    "socket",
    "http.client",
    "urllib.request",
    "ftplib",
    "smtplib",
    "poplib",
    "imaplib",
    "telnetlib",
    "xmlrpc.client",
    "websockets",
    "websocket",
    "pycurl",
    "paramiko",
    "asyncssh",
    "uvicorn",
    # The OTLP exporter posts spans to the collector the operator names.
    "opentelemetry.exporter",
)
# Calls that open a connection, a listening socket or a name lookup, by resolved name.
CONNECTING_CALLS = frozenset(
    {
        "socket.socket",
        "socket.create_connection",
        "socket.create_server",
        "socket.fromfd",
        "socket.socketpair",
        "socket.getaddrinfo",
        "socket.gethostbyname",
        "socket.gethostbyname_ex",
        "ssl.wrap_socket",
        "ssl.get_server_certificate",
        "http.client.HTTPConnection",
        "http.client.HTTPSConnection",
        "urllib.request.urlopen",
        "urllib.request.urlretrieve",
        "urllib.request.build_opener",
        "asyncio.open_connection",
        "asyncio.open_unix_connection",
        "asyncio.start_server",
        "asyncio.start_unix_server",
        "httpx.Client",
        "httpx.AsyncClient",
        "httpx.HTTPTransport",
        "httpx.AsyncHTTPTransport",
        "httpx.get",
        "httpx.post",
        "httpx.put",
        "httpx.patch",
        "httpx.delete",
        "httpx.head",
        "httpx.options",
        "httpx.request",
        "httpx.stream",
        "requests.get",
        "requests.post",
        "requests.request",
        "requests.Session",
        "aiohttp.ClientSession",
        "psycopg.connect",
        "psycopg.Connection.connect",
        "psycopg.AsyncConnection.connect",
        "psycopg_pool.ConnectionPool",
        "psycopg_pool.AsyncConnectionPool",
        "sqlalchemy.create_engine",
        "sqlalchemy.ext.asyncio.create_async_engine",
        "asyncpg.connect",
        "asyncpg.create_pool",
        "uvicorn.run",
        "uvicorn.Server",
    }
)
# Method names that open a connection on whatever object they are called: an event
# loop's, an SSL context's, a socket's.
CONNECTING_METHODS = frozenset(
    {
        "create_connection",
        "create_unix_connection",
        "create_server",
        "create_unix_server",
        "create_datagram_endpoint",
        "open_connection",
        "open_unix_connection",
        "start_server",
        "start_unix_server",
        "sock_connect",
        "wrap_socket",
        "wrap_bio",
        "urlopen",
        "getaddrinfo",
    }
)
SUBPROCESS_CALLS = frozenset(
    {
        "subprocess.run",
        "subprocess.Popen",
        "subprocess.call",
        "subprocess.check_call",
        "subprocess.check_output",
        "subprocess.getoutput",
        "subprocess.getstatusoutput",
        "os.system",
        "os.popen",
        "os.execv",
        "os.execve",
        "os.execvp",
        "os.execvpe",
        "os.execl",
        "os.execlp",
        "os.spawnv",
        "os.spawnvp",
        "os.posix_spawn",
        "os.posix_spawnp",
        "asyncio.create_subprocess_exec",
        "asyncio.create_subprocess_shell",
    }
)
NETWORK_TOOLS = frozenset(
    {
        "curl",
        "wget",
        "nc",
        "ncat",
        "netcat",
        "socat",
        "telnet",
        "ssh",
        "scp",
        "sftp",
        "ftp",
        "rsync",
        "openssl",
        "http",
        "https",
        "aria2c",
        "psql",
        "pg_isready",
        "pg_dump",
        "dig",
        "nslookup",
    }
)


@dataclass(frozen=True, order=True)
class Finding:
    """One way a module reaches the network: `import X`, a call `X.y`, or `tool curl`."""

    line: int
    what: str


@dataclass(frozen=True)
class Allowance:
    """What one module may use, and why it is the module to use it."""

    uses: frozenset[str]
    why: str


def _allow(why: str, *uses: str) -> Allowance:
    return Allowance(frozenset(uses), why)


ALLOWED: dict[str, Allowance] = {
    # The broker: the one owner of outbound HTTP to anything but the queue server.
    "queue_server/transport/broker.py": _allow(
        "the transport broker: every outbound dispatch, one leased request at a time",
        "import httpx",
        "httpx.AsyncHTTPTransport",
        "httpx.AsyncClient",
    ),
    "queue_server/transport/ssrf.py": _allow(
        "the broker's SSRF policy resolves a target once, before the lease, and pins the"
        " address it checked; it parses URLs with httpx's parser and opens no connection",
        "import httpx",
        "import socket",
        "socket.getaddrinfo",
        "getaddrinfo",
    ),
    "client/queue_server/policy/retry.py": _allow(
        "names httpx's exception types to classify failures; opens nothing",
        "import httpx",
    ),
    # The SDK's in-memory double answers its clients' requests in the process.
    "client/queue_server/client/testing.py": _allow(
        "the SDK's test double: httpx's request and response types, answered in process"
        " (its clients come from client/connection.py's in_process, with no socket)",
        "import httpx",
    ),
    # The SDK's one transport to the queue server itself.
    "client/queue_server/client/connection.py": _allow(
        "the SDK's one transport: connection pools to the queue server's own base URL"
        " (httpx's, and the lean keep-alive connections of a worker's hot calls)",
        "import httpx",
        "httpx.Client",
        "httpx.AsyncClient",
        "import socket",
        "socket.create_connection",
        "create_connection",
        "wrap_socket",
        "asyncio.open_connection",
        "open_connection",
    ),
    # The server's own listening socket.
    "queue_server/cli/main.py": _allow(
        "`queue-server serve` runs uvicorn: the API's own listening socket; its workers"
        " come from a fork server (the context of uvicorn._subprocess), a process, no socket",
        "import uvicorn",
        "import uvicorn._subprocess",
        "uvicorn.Server",
        "uvicorn.run",
    ),
    "queue_server/infra/http_protocol.py": _allow(
        "subclasses uvicorn's HTTP protocol class to answer malformed requests as problems;"
        " it opens no socket (uvicorn does, in `serve`)",
        "import uvicorn.protocols.http.httptools_impl",
    ),
    # The operator's telemetry collector, only when OTEL_EXPORTER_OTLP_ENDPOINT names one.
    "queue_server/infra/tracing.py": _allow(
        "the OTLP/HTTP span exporter: batches of spans to the collector named by"
        " OTEL_EXPORTER_OTLP_ENDPOINT, never a target a tenant chose (docs/observability.md)",
        "import opentelemetry.exporter.otlp.proto.http.trace_exporter",
    ),
    # The database driver: connections to PostgreSQL, nowhere else.
    "queue_server/db.py": _allow(
        "the one seam to PostgreSQL: the pool, and one direct session to set role defaults",
        "psycopg_pool.AsyncConnectionPool",
        "psycopg.AsyncConnection.connect",
    ),
    "queue_server/background/notifier.py": _allow(
        "the listener: one direct PostgreSQL session for LISTEN (a pooler cannot carry it)",
        "psycopg.AsyncConnection.connect",
    ),
    "queue_server/infra/serve.py": _allow(
        "creates the server's database in the embedded PostgreSQL before migrating it, opens"
        " the session of `queue-server db`'s role grants, and reads the database's"
        " max_connections at start to size the pools",
        "psycopg.connect",
    ),
    "queue_server/infra/migrate.py": _allow(
        "Alembic's engine for migrations (NullPool: one connection per command)",
        "sqlalchemy.create_engine",
    ),
    "queue_server/migrations/env.py": _allow(
        "Alembic's environment: the engine migrations run on",
        "sqlalchemy.create_engine",
    ),
}


class _Scanner(ast.NodeVisitor):
    """Resolves names through the module's imports and records every network use."""

    def __init__(self) -> None:
        self.aliases: dict[str, str] = {}
        self.found: set[Finding] = set()

    def _module_used(self, line: int, module: str) -> None:
        if any(module == m or module.startswith(m + ".") for m in NETWORK_MODULES):
            self.found.add(Finding(line, f"import {module}"))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._module_used(node.lineno, alias.name)
            if alias.asname:
                self.aliases[alias.asname] = alias.name
            else:
                top = alias.name.split(".")[0]
                self.aliases[top] = top
        self.generic_visit(node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and node.level == 0:
            self._module_used(node.lineno, node.module)
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                # `from urllib import request` names a network module too.
                if full in NETWORK_MODULES:
                    self._module_used(node.lineno, full)
                self.aliases[alias.asname or alias.name] = full
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        # `s = importlib.import_module("socket")`: `s` now names the module.
        imported = _imported_by_name(node.value)
        if imported is not None:
            for target in node.targets:
                if isinstance(target, ast.Name):
                    self.aliases[target.id] = imported
        self.generic_visit(node)

    def resolve(self, node: ast.expr) -> str | None:
        """The dotted name an expression denotes, through the module's aliases."""
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            return f"{base}.{node.attr}" if base is not None else None
        return _imported_by_name(node)

    def visit_Call(self, node: ast.Call) -> None:
        imported = _imported_by_name(node)
        if imported is not None:
            self._module_used(node.lineno, imported)
        name = self.resolve(node.func)
        if name in CONNECTING_CALLS:
            self.found.add(Finding(node.lineno, name))
        method = node.func.attr if isinstance(node.func, ast.Attribute) else None
        if method in CONNECTING_METHODS:
            self.found.add(Finding(node.lineno, method))
        if name == "getattr" and len(node.args) >= 2:
            attr = node.args[1]
            if isinstance(attr, ast.Constant) and attr.value in CONNECTING_METHODS:
                self.found.add(Finding(node.lineno, str(attr.value)))
        if name in SUBPROCESS_CALLS:
            tool = _command_name(node)
            if tool in NETWORK_TOOLS:
                self.found.add(Finding(node.lineno, f"tool {tool}"))
        self.generic_visit(node)


def _imported_by_name(node: ast.expr) -> str | None:
    """The module `importlib.import_module("x")` or `__import__("x")` loads, if literal."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    arg = node.args[0]
    if called in {"import_module", "__import__"} and isinstance(arg, ast.Constant):
        return str(arg.value) if isinstance(arg.value, str) else None
    return None


def _command_name(call: ast.Call) -> str | None:
    """The program a subprocess call runs, when the code names it literally."""
    if not call.args:
        return None
    first = call.args[0]
    if isinstance(first, ast.List | ast.Tuple) and first.elts:
        first = first.elts[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        words = first.value.split()
        return Path(words[0]).name if words else None
    return None


@functools.lru_cache(maxsize=1024)
def _uses(source: str) -> tuple[Finding, ...]:
    scanner = _Scanner()
    scanner.visit(ast.parse(source))
    return tuple(sorted(scanner.found))


def network_uses(source: str) -> list[Finding]:
    """Every way a module's source reaches the network, by line."""
    return list(_uses(source))


def offenders(root: Path) -> dict[str, list[str]]:
    """Each module of the package's trees under `root` with a network use outside its allowance."""
    found: dict[str, list[str]] = {}
    for path in sorted(p for tree in TREES for p in (root / tree).rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        allowed = ALLOWED.get(rel, Allowance(frozenset(), "")).uses
        bad = [
            f"line {f.line}: {f.what}"
            for f in network_uses(path.read_text(encoding="utf-8"))
            if f.what not in allowed
        ]
        if bad:
            found[rel] = bad
    return found


def test_only_the_named_modules_open_connections() -> None:
    assert offenders(ROOT) == {}


def test_every_allowance_is_used_and_has_a_reason() -> None:
    for rel, allowance in ALLOWED.items():
        used = {f.what for f in network_uses((ROOT / rel).read_text(encoding="utf-8"))}
        assert allowance.uses <= used, f"{rel}: allowed but unused: {allowance.uses - used}"
        assert allowance.why


def test_the_sdk_has_one_transport() -> None:
    sdk = [
        rel
        for rel in ALLOWED
        if rel.startswith(f"{SDK}/") and any(u.startswith("httpx.") for u in ALLOWED[rel].uses)
    ]
    assert sdk == [f"{SDK}/connection.py"]


PLANTED = """
import asyncio
import importlib
import os
import subprocess
from http import client as web
from urllib.request import urlopen as fetch
import ssl


async def leak(loop, ctx, raw):
    socket = importlib.import_module("socket")
    socket.create_connection(("example.com", 80))
    __import__("socket").socket()
    web.HTTPSConnection("example.com")
    fetch("http://example.com/")
    ctx.wrap_socket(raw, server_hostname="example.com")
    ssl.get_server_certificate(("example.com", 443))
    await asyncio.open_connection("example.com", 80)
    await loop.create_connection(object, "example.com", 80)
    getattr(loop, "create_connection")
    subprocess.run(["curl", "-s", "http://example.com/"], check=False)
    subprocess.Popen("/usr/bin/wget -q http://example.com/", shell=True)
    os.system("nc example.com 80")
    await asyncio.create_subprocess_exec("ssh", "example.com")
"""


@pytest.fixture
def copy_of_package(tmp_path: Path) -> Path:
    for tree in TREES:
        shutil.copytree(ROOT / tree, tmp_path / tree, ignore=shutil.ignore_patterns("__pycache__"))
    assert offenders(tmp_path) == {}
    return tmp_path


def test_a_planted_violation_in_a_new_module_fails_the_check(copy_of_package: Path) -> None:
    planted = copy_of_package / PACKAGE / "background" / "planted.py"
    planted.write_text(PLANTED)
    found = offenders(copy_of_package)
    assert list(found) == [f"{PACKAGE}/background/planted.py"]
    hits = {entry.split(": ", 1)[1] for entry in found[f"{PACKAGE}/background/planted.py"]}
    assert hits >= {
        "import http.client",
        "import urllib.request",
        "import socket",
        "socket.create_connection",
        "socket.socket",
        "http.client.HTTPSConnection",
        "urllib.request.urlopen",
        "wrap_socket",
        "ssl.get_server_certificate",
        "asyncio.open_connection",
        "open_connection",
        "create_connection",
        "tool curl",
        "tool wget",
        "tool nc",
        "tool ssh",
    }


@pytest.mark.parametrize(
    ("module", "line"),
    [
        # An allowed module may use what it is named with, and nothing else.
        (f"{SDK}/connection.py", "import urllib.request\nurllib.request.urlopen('http://h/')\n"),
        (f"{SDK}/client.py", "import httpx\nhttpx.Client()\n"),
        (f"{SDK}/working.py", "import socket\n"),
        ("client/queue_server/policy/retry.py", "import socket\n"),
        ("db.py", "import httpx\nhttpx.AsyncClient()\n"),
        ("background/deliverer.py", "import asyncio\nasyncio.open_connection('h', 1)\n"),
        ("transport/ssrf.py", "import httpx\nhttpx.AsyncClient()\n"),
        ("infra/embedded.py", "import subprocess\nsubprocess.run(['curl', 'http://h/'])\n"),
        ("cli/main.py", "import urllib.request\n"),
    ],
)
def test_a_planted_violation_in_an_existing_module_fails_the_check(
    copy_of_package: Path, module: str, line: str
) -> None:
    rel = module if module.startswith("client/") else f"{PACKAGE}/{module}"
    path = copy_of_package / rel
    path.write_text(path.read_text() + "\n\n" + line)
    assert list(offenders(copy_of_package)) == [rel]


@pytest.mark.parametrize(
    "source",
    [
        "import urllib.parse",
        "from urllib.parse import quote",
        "from http import HTTPStatus",
        "import ssl\nctx = ssl.create_default_context()",
        "import platform\nplatform.node()",
        "import subprocess\nsubprocess.run(['pg_ctl', 'start'])",
        "import subprocess\nsubprocess.run(command)",
        "from . import socket",
    ],
)
def test_what_opens_nothing_is_not_a_finding(source: str) -> None:
    assert network_uses(source) == []
