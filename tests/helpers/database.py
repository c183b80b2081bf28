"""The suite's own PostgreSQL: logins that cost less CPU; each test's database made and dropped; a
snapshot held as a pg_dump holds it."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator

import psycopg
from psycopg import sql

from queue_server.infra.embedded import EmbeddedPostgres


def fast_logins(pg: EmbeddedPostgres) -> None:
    """Re-hash the superuser's password with one SCRAM iteration instead of 4,096.

    Logins still need the password (SCRAM-SHA-256, as the embedded server requires); each
    one costs about 0.4 ms of client CPU instead of 3.3 ms, and the suite logs in thousands
    of times (every test's pool, listener and direct connection). For the suite's own server
    only: the product's embedded server keeps PostgreSQL's default.
    """
    with psycopg.connect(pg.url("postgres"), autocommit=True) as conn:
        conn.execute("SET scram_iterations = 1")
        conn.execute(sql.SQL("ALTER ROLE postgres PASSWORD {}").format(sql.Literal(pg.password)))


@contextlib.contextmanager
def held_snapshot(database_url: str) -> Iterator[float]:
    """A second session in a REPEATABLE READ transaction that has read work_items, as a
    pg_dump or a report holds it; yields the monotonic time its transaction began."""
    with psycopg.connect(database_url) as other:
        began = time.monotonic()
        other.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        other.execute("SELECT count(*) FROM work_items")
        yield began
        other.rollback()


class Databases:
    """Creates each test's database from the template and drops it, over one connection to
    the server kept for the session: a connection per CREATE and per DROP (as
    pytest-postgresql's janitor makes) was two backends' starts a test."""

    def __init__(self, pg: EmbeddedPostgres, template: str) -> None:
        self.pg = pg
        self.template = template
        self.conn: psycopg.Connection[tuple[object, ...]] | None = None

    def _admin(self) -> psycopg.Connection[tuple[object, ...]]:
        if self.conn is None or self.conn.closed or self.conn.broken:
            self.conn = psycopg.connect(self.pg.url(), autocommit=True)
        return self.conn

    def create(self) -> str:
        name = f"t_{uuid.uuid4().hex[:12]}"
        admin = self._admin()
        # Nobody may be connected to a template that is copied.
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
            (self.template,),
        )
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(self.template)
            )
        )
        return name

    def drop(self, name: str) -> None:
        # FORCE ends the sessions a test left open; a new one waits on the DROP, then fails.
        self._admin().execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
