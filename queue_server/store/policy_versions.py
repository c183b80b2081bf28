"""The policy versions the server has started under, with their digests."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from psycopg.types.json import Jsonb

from queue_server.store.sql import fetch_all, fetch_one, load
from queue_server.store.types import Conn, Row

_SQL = load("policy_versions")


async def record_load(
    conn: Conn, *, version: str, sha256: str, source: str, document: dict[str, Any]
) -> Row | None:
    """One load of this (version, sha256): first kept, last now, loads + 1; None when the
    version is kept with other content."""
    return await fetch_one(
        conn,
        _SQL["record_load"],
        {"version": version, "sha256": sha256, "source": source, "document": Jsonb(document)},
    )


async def publish(
    conn: Conn,
    *,
    version: str,
    sha256: str,
    document: dict[str, Any],
    actor: str,
    reason: str,
) -> Row | None:
    """Publish and activate this (version, sha256), with who and why; the same document again
    is activated again. None when the version is kept with other content."""
    return await fetch_one(
        conn,
        _SQL["publish"],
        {
            "version": version,
            "sha256": sha256,
            "document": Jsonb(document),
            "actor": actor,
            "reason": reason,
        },
    )


async def kept_sha256(conn: Conn, version: str) -> str | None:
    """The sha256 of the document kept under `version`, if any."""
    row = await fetch_one(conn, _SQL["kept_sha256"], {"version": version})
    return None if row is None else str(row["sha256"])


async def active(conn: Conn) -> Row | None:
    """The published version activated last (version, sha256, document), if any."""
    return await fetch_one(conn, _SQL["active"], {})


async def record_enqueue_envelope(
    conn: Conn, *, version: str, attempt_cap: int, backlog_cap: int, retention: timedelta
) -> None:
    """The ceilings `queue_server.enqueue` holds an application's items to, and its receipts'
    retention: the loaded policy's and the server's."""
    await conn.execute(
        _SQL["record_enqueue_envelope"],
        {
            "version": version,
            "attempt_cap": attempt_cap,
            "backlog_cap": backlog_cap,
            "retention": retention,
        },
    )


async def list_versions(conn: Conn) -> list[Row]:
    """Every version the server has run under, newest last start first."""
    return await fetch_all(conn, _SQL["list_versions"], {})
