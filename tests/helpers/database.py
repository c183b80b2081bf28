"""The suite's own PostgreSQL: logins that cost less CPU, each test's database cloned by file
copy, a snapshot held as a pg_dump holds it."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
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


def stop_now(pg: EmbeddedPostgres, within: float = 10.0) -> None:
    """Stop the suite's server as a crash would (SIGQUIT: PostgreSQL's immediate shutdown), and
    kill it if it is still there after `within` seconds.

    Each worker stops its server as its last test ends, and the run waits for it: `pg_ctl
    stop` waits up to 60 s, which one worker's teardown once took whole (the machine idle
    meanwhile). What is left of the server is thrown away with its directory either way.
    """
    try:
        pid = int((pg.pgdata / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGQUIT)
    except (OSError, ValueError, IndexError):
        return  # not running
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        # It removes its pid file as it exits (a zombie left unreaped would still answer).
        if not (pg.pgdata / "postmaster.pid").exists():
            return
        time.sleep(0.02)
    print(f"PostgreSQL {pid} did not stop in {within:.0f} s after SIGQUIT: killed", file=sys.stderr)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


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


class Clones:
    """Each test's database, a copy of the migrated template, on one maintenance session.

    `STRATEGY FILE_COPY` copies the template's files (about 8 ms of the server's CPU on
    tmpfs) where PostgreSQL's default, WAL_LOG, reads and logs every block of them (about
    50 ms); the suite clones a database for nearly every test. The copy's price, two
    checkpoints, is small on a server that runs with fsync off. `DROP ... WITH (FORCE)`
    ends the sessions a test left behind (a server it started, a pool) in the same
    statement.
    """

    def __init__(self, pg: EmbeddedPostgres, template: str) -> None:
        self._pg = pg
        self._template = template
        self._conn: psycopg.Connection[tuple[object, ...]] | None = None

    def _execute(self, statement: sql.Composed) -> None:
        for attempt in (1, 2):
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(self._pg.url("postgres"), autocommit=True)
            try:
                self._conn.execute(statement)
                return
            except psycopg.OperationalError:
                # Once more only when the session was ended under it (a test that ends
                # backends); any other refusal is the test run's to see.
                if not self._conn.broken or attempt == 2:
                    raise
                self._conn.close()

    @contextlib.contextmanager
    def clone(self) -> Iterator[str]:
        """A new database cloned from the template, dropped when the block ends."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        self._execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                sql.Identifier(name), sql.Identifier(self._template)
            )
        )
        try:
            yield name
        finally:
            self._sessions_gone(name)
            self._execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))

    def _sessions_gone(self, name: str, within: float = 0.1) -> None:
        """Wait, briefly, for the sessions the test closed to end: a DROP that finds one
        still ending sleeps a tenth of a second before it looks again (PostgreSQL's
        CountOtherDBBackends), which a quarter of the tests paid. A session still there
        after `within` is ended by the DROP's FORCE."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            try:
                assert self._conn is not None
                row = self._conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (name,)
                ).fetchone()
            except psycopg.OperationalError:
                return  # the DROP reconnects
            if row is None or not row[0]:
                return
            time.sleep(0.002)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
