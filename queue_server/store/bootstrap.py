"""The statements `queue-server serve` runs as the embedded PostgreSQL's superuser: the
server's own role (it owns the schema's objects, and is neither superuser nor CREATEROLE),
its database, and the hand-over of a database the superuser made before there was a role;
and the schema revisions a database is at, which `serve` reads before it migrates."""

from __future__ import annotations

from typing import Any

import psycopg

from queue_server.store.sql import load

_SQL = load("bootstrap")

# The database the embedded PostgreSQL serves the queue from, and the role that owns it.
DATABASE_NAME = "queue_server"
SERVER_ROLE = "queue_server"
# The local backup's role (replication and base backups only), made by `serve --backup-repo`.
BACKUP_ROLE = "queue_server_backup"


def ensure_role(conn: psycopg.Connection[Any], password: str) -> None:
    """The server's role, logging in with `password`, and no more privileges than that but
    reading every session's statistics (pg_read_all_stats); and queue_server_enqueuer,
    which applications' roles become members of."""
    exists = conn.execute(_SQL["role_exists"], (SERVER_ROLE,)).fetchone() is not None
    with psycopg.ClientCursor(conn) as cursor:
        if exists:
            cursor.execute(_SQL["set_role_password"], {"password": password})
        else:
            cursor.execute(_SQL["create_role"], {"password": password})
    conn.execute(_SQL["create_enqueuer_role"])
    conn.execute(_SQL["grant_read_all_stats"])


def ensure_backup_role(conn: psycopg.Connection[Any], password: str) -> None:
    """The local backup's role, logging in with `password`: replication and base backups."""
    exists = conn.execute(_SQL["role_exists"], (BACKUP_ROLE,)).fetchone() is not None
    with psycopg.ClientCursor(conn) as cursor:
        if exists:
            cursor.execute(_SQL["set_backup_role_password"], {"password": password})
        else:
            cursor.execute(_SQL["create_backup_role"], {"password": password})
    conn.execute(_SQL["grant_backup_privileges"])


def drop_replication_slot(conn: psycopg.Connection[Any], slot: str) -> bool:
    """Drop the replication slot `slot` if it exists and nobody reads it; whether it did."""
    return conn.execute(_SQL["drop_replication_slot"], (slot,)).fetchone() is not None


def ensure_database(conn: psycopg.Connection[Any]) -> None:
    """The server's database, owned by its role (a database the superuser made before is
    given to it; `hand_over` then gives it the objects inside)."""
    row = conn.execute(_SQL["database_owner"], (DATABASE_NAME,)).fetchone()
    if row is None:
        conn.execute(_SQL["create_database"])
    elif row[0] != SERVER_ROLE:
        conn.execute(_SQL["alter_database_owner"])


def hand_over(conn: psycopg.Connection[Any]) -> None:
    """Every object of the schema that another role owns, to the server's role (connected
    to its database as the superuser; nothing to do, and quick, once done)."""
    conn.execute(_SQL["hand_over_objects"])


def schema_revisions(conn: psycopg.Connection[Any]) -> set[str]:
    """The alembic revisions the database's schema is at: none before its first migration."""
    try:
        with conn.transaction():
            return {row[0] for row in conn.execute(_SQL["schema_revisions"]).fetchall()}
    except psycopg.errors.UndefinedTable:
        return set()


def in_recovery(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server is still replaying WAL (a restore not yet promoted)."""
    row = conn.execute(_SQL["in_recovery"]).fetchone()
    return bool(row and row[0])
