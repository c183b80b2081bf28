"""Every statement the server runs, written as SQL, by store module and name.

Each store module has its file beside this one, `<module>.sql`, of named blocks:

    -- name: heartbeat
    -- leased -> leased: the holder, with its fence, before expiry.
    WITH upd AS (
        UPDATE work_items ...

A block is the text from its `-- name:` line to the next one (its comment lines
included: they are sent as written). The store module loads its file once, at import,
and runs each statement by name:

    _SQL = load("transitions")
    await fetch_one(conn, _SQL["heartbeat"], params)

The text in the file is the text sent; nothing is assembled per call, so every
statement stays prepared (and, on the API's connections, generic). A name the file
does not hold is a KeyError that names the file.

A block may hold variants of its statement: a line that ends in `--@other` belongs to the
statement `other` only (the tag taken off), one that ends in the block's own name to the
block's statement only, and the untagged lines to both. The acquire of a rate-limited queue
(`acquire_rated`) is the acquire's variant, so the two read as one text and cannot drift.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, LiteralString

from queue_server.store.types import Conn, Row

SQL_DIR = Path(__file__).parent

_NAME = re.compile(r"^-- name: ([a-z_][a-z0-9_]*)\s*$")
_ONLY = re.compile(r"^(.*?)\s*--@([a-z_][a-z0-9_]*)\s*$")


def _variants(name: str, lines: list[str]) -> dict[str, list[str]]:
    """The statements of one block: its own, and one per `--@other` tag its lines carry."""
    tags = {m.group(2) for m in map(_ONLY.match, lines) if m}
    out: dict[str, list[str]] = {n: [] for n in {name, *tags}}
    for line in lines:
        match = _ONLY.match(line)
        for n, kept in out.items():
            if match is None:
                kept.append(line)
            elif match.group(2) == n:
                kept.append(match.group(1))
    return out


class Statements(Mapping[str, LiteralString]):
    """The named statements of one `<module>.sql` file."""

    def __init__(self, module: str, named: dict[str, LiteralString]) -> None:
        self.module = module
        self._named = named

    def __getitem__(self, name: str) -> LiteralString:
        try:
            return self._named[name]
        except KeyError:
            raise KeyError(f"{self.module}.sql has no statement named {name!r}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._named)

    def __len__(self) -> int:
        return len(self._named)


def parse(text: str, module: str = "<text>") -> dict[str, LiteralString]:
    """The `-- name:` blocks of a file's text, in file order; the lines before the first
    name are the file's own comment. Two blocks of one name are an error."""
    named: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        match = _NAME.match(line)
        if match:
            name = match.group(1)
            if name in named:
                raise ValueError(f"{module}.sql names two statements {name!r}")
            current = named[name] = []
        elif current is not None:
            current.append(line)
        elif line.strip() and not line.startswith("--"):
            raise ValueError(f"{module}.sql has SQL before its first `-- name:` line")
    statements: dict[str, LiteralString] = {}
    for block, block_lines in named.items():
        for name, lines in _variants(block, block_lines).items():
            if name in statements or (name != block and name in named):
                raise ValueError(f"{module}.sql names two statements {name!r}")
            body = "\n".join(lines).strip()
            if not body:
                raise ValueError(f"{module}.sql: the statement {name!r} is empty")
            # Read from the package's own file: as fixed as a literal in the code (mypy
            # takes LiteralString for str; the annotation says what the text is).
            statements[name] = body
    return statements


def load(module: str) -> Statements:
    """The statements of `store/sql/<module>.sql`, read once (at the module's import)."""
    path = SQL_DIR / f"{module}.sql"
    return Statements(module, parse(path.read_text(encoding="utf-8"), module))


async def fetch_one(conn: Conn, sql: LiteralString, params: dict[str, Any]) -> Row | None:
    """Run a named statement; its first row, or None."""
    cur = await conn.execute(sql, params)
    return await cur.fetchone()


async def fetch_all(conn: Conn, sql: LiteralString, params: dict[str, Any]) -> list[Row]:
    """Run a named statement; all its rows."""
    cur = await conn.execute(sql, params)
    return await cur.fetchall()
