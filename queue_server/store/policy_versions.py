"""The policy versions the server has started under, with their digests."""

from __future__ import annotations

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


async def list_versions(conn: Conn) -> list[Row]:
    """Every version the server has run under, newest last start first."""
    return await fetch_all(conn, _SQL["list_versions"], {})
