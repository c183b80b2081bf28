"""Console sessions: the sha256 of each session's random id, its key, its expiry and its end."""

from __future__ import annotations

from queue_server.store.sql import load
from queue_server.store.types import Conn, Row

_SQL = load("console_sessions")


async def open_session(conn: Conn, *, session_hash: str, key_id: str, ttl: float) -> None:
    await conn.execute(
        _SQL["open_session"], {"session_hash": session_hash, "key_id": key_id, "ttl": ttl}
    )


async def session_key(conn: Conn, session_hash: str) -> Row | None:
    """The key (id, tenant, role) of a live session, or None."""
    cur = await conn.execute(_SQL["session_key"], {"session_hash": session_hash})
    return await cur.fetchone()


async def end_session(conn: Conn, session_hash: str) -> None:
    await conn.execute(_SQL["end_session"], {"session_hash": session_hash})
