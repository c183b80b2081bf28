"""The suite's own PostgreSQL: logins that cost less CPU; a snapshot held as a pg_dump holds it."""

from __future__ import annotations

import contextlib
import time
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
