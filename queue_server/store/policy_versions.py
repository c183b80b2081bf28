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
) -> Row:
    """One start under this (version, sha256): first kept, last now, loads + 1."""
    row = await fetch_one(
        conn,
        _SQL["record_load"],
        {"version": version, "sha256": sha256, "source": source, "document": Jsonb(document)},
    )
    assert row is not None
    return row


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
