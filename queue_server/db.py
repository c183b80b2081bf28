"""The one seam to PostgreSQL: a pool of set-up connections, `conn()`, `tx()`, driver errors.

Every connection the server opens for statements comes from a `Database` and is set
up here: server-side timeouts, UTC, generic plans, and jsonb in and out through
orjson. A driver failure becomes a domain error here and nowhere else:

    PoolTimeout (no connection within the wait)  -> ServiceUnavailableError (503)
    QueryCanceled, LockNotAvailable (timeouts)   -> TimeoutExceededError (503)
    IdleInTransactionSessionTimeout (a transaction of ours left idle past
      QUEUE_SERVER_IDLE_IN_TRANSACTION_TIMEOUT_MS: the server ended the session and
      rolled it back; the pool discards the connection) -> TimeoutExceededError (503)
    the server is gone or no longer the primary  -> ServiceUnavailableError (503),
      OperationalError (connection lost, 57P01 admin shutdown, 57P03 cannot connect
      now), 25006 read-only (a demoted primary), and the InternalError psycopg raises
      on a connection that broke mid-protocol behind a pooler ("received 2 results
      from command 'BEGIN'", no SQLSTATE); the connection is closed and the pool
      drained, so no request is lent a connection to the old primary.
    the admission's refusals (`admission_refusals`, SQLSTATEs of migration 0017):
      QS429 -> BacklogCapReachedError (429), QS404 -> TenantNotFoundError (404),
      QS422 -> InvalidRequestError (422, the policy envelope; QS400 too, a dependency
      refused: migration 0035), QS409 -> ConflictError (409,
      the item holding a unique key finished while the enqueue ran: migration 0030)

Directly connected (`database_pooler = "none"`) a session gets its settings at
connect (`options`) and prepares every statement. Through a pooler in transaction
mode (PgBouncer) a server session serves many clients, one transaction at a time,
so nothing may live on it between transactions: no startup options (PgBouncer 1.18
refuses them), no prepared statements (before PgBouncer 1.21 they land on another
server connection: psycopg's `prepare_threshold=None`), no LISTEN (the notifier has a
direct session of its own). The settings become the defaults of the server's role in
its database instead, set over a direct session before the pool opens.

The commit-cancel trap of synchronous replication: a COMMIT whose wait for the
standby is cancelled returns success with a warning, committed on the primary only.
So `tx()` never lets a COMMIT be cancelled, and a connection that reports such a
warning has it confirmed by a later COMMIT that waits (`confirm_durable`) before
anything is answered.

Statements live in `queue_server.store`; callers hand them the connection this yields.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import orjson
import psycopg
import psycopg.errors
from psycopg import _queries
from psycopg.rows import dict_row
from psycopg.types.json import set_json_dumps, set_json_loads
from psycopg.types.string import TextLoader
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from queue_server import errors
from queue_server.settings import Settings
from queue_server.store.sessions import APPLY_ROLE_DEFAULTS, WAIT_FOR_STANDBY, WANT_ROLE_DEFAULTS
from queue_server.store.types import Conn

log = logging.getLogger(__name__)

# The refusal the admission raises at the cap: its DETAIL gives the figures.
# The detail of QS429 (queue_server.admission_shards): the figures, then why.
_CAP_DETAIL = re.compile(r"Backlog (-?\d+) \+ (\d+) new would exceed the cap of (\d+)[. ].*", re.S)


@contextlib.contextmanager
def admission_refusals(tenant: str) -> Iterator[None]:
    """The enqueue admission's SQL refusals (`queue_server.admit`) as domain errors.

    The transaction is aborted by then: a caller that goes on in it after a refusal
    (a schedule's pass) runs the admission in a savepoint.
    """
    try:
        yield
    except psycopg.Error as exc:
        detail = exc.diag.message_detail or None
        if exc.sqlstate == "QS429":
            found = _CAP_DETAIL.fullmatch(detail or "")
            figures = (
                {}
                if found is None
                else {
                    "backlog": int(found[1]),
                    "backlog_cap": int(found[3]),
                    "requested": int(found[2]),
                }
            )
            raise errors.BacklogCapReachedError(detail, **figures) from exc
        if exc.sqlstate == "QS404":
            raise errors.TenantNotFoundError(tenant=tenant) from exc
        if exc.sqlstate in ("QS400", "QS422"):  # QS400: a dependency refused (0035)
            raise errors.InvalidRequestError(detail) from exc
        if exc.sqlstate == "QS409":  # the item holding a unique key finished meanwhile
            raise errors.ConflictError(detail) from exc
        raise


# psycopg converts a statement's `%(name)s` placeholders once per text and caches the
# result, but only for statements up to 4 KiB; the acquire is four times that, and
# converting it again on every call (0.1 ms) cost as much CPU as the rest of psycopg's
# share of the request. Our statements are a fixed set (the `.sql` files), so the cache
# stays as small as it is; tests/test_sql_files.py holds every statement under this bound.
_queries.MAX_CACHED_STATEMENT_LENGTH = max(_queries.MAX_CACHED_STATEMENT_LENGTH, 64 * 1024)

T = TypeVar("T")

#: PostgreSQL's warning when a COMMIT's wait for a synchronous standby is cancelled.
SYNC_CANCEL_WARNING = "canceling wait for synchronous replication"


def session_settings(settings: Settings, *, outbox_cap: int | None = None) -> dict[str, str]:
    """The settings every API session runs with; `outbox_cap` (the loaded policy's
    watcher-delivery max-queued) is what the outbox_admit trigger of migration 0014 holds
    each watcher's pending deliveries to."""
    cap = {} if outbox_cap is None else {"queue_server.outbox_cap": str(outbox_cap)}
    return {
        **cap,
        "statement_timeout": str(settings.statement_timeout_ms),
        "lock_timeout": str(settings.lock_timeout_ms),
        # A transaction of ours left idle (a request stalled between its statements) ends
        # then: it would hold its locks, and its snapshot would hold the xmin horizon back,
        # so every transition's dead row version stays (docs/operators.md#a-held-snapshot).
        "idle_in_transaction_session_timeout": str(settings.idle_in_transaction_timeout_ms),
        "TimeZone": "UTC",
        # Plans that do not depend on one tenant's statistics: a tenant whose rows
        # ANALYZE has not seen yet must not send acquire down the primary key.
        "plan_cache_mode": "force_generic_plan",
    }


def _options(values: dict[str, str]) -> str:
    return " ".join(f"-c {name}={value}" for name, value in values.items())


class Database:
    """A pool of connections in autocommit mode, each set up by `_configure`."""

    def __init__(
        self,
        conninfo: str,
        *,
        name: str,
        min_size: int,
        max_size: int,
        options: str | None,
        timeout: float,
        prepare_threshold: int | bool | None = False,
        role_defaults: dict[str, str] | None = None,
        direct_conninfo: str | None = None,
    ) -> None:
        """`options`: settings sent at connect (None through a transaction pooler);
        `prepare_threshold`: psycopg's (None prepares nothing; False keeps psycopg's
        default); `role_defaults`: settings made the role's defaults in the database
        over `direct_conninfo` before the pool opens (through a transaction pooler)."""
        self.conninfo = conninfo
        self.timeout = timeout
        self.role_defaults = role_defaults
        self.direct_conninfo = direct_conninfo or conninfo
        #: Called with the cause of every 503 for a failed connection (a metric).
        self.on_unavailable: Callable[[str], None] = lambda cause: None
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "row_factory": dict_row,
            "application_name": name,
        }
        if options is not None:
            kwargs["options"] = options
        if prepare_threshold is not False:
            kwargs["prepare_threshold"] = prepare_threshold
        self._opened: weakref.WeakKeyDictionary[Conn, float] = weakref.WeakKeyDictionary()
        self._unconfirmed: weakref.WeakSet[Conn] = weakref.WeakSet()
        self._drained_at = 0.0
        self.pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
            conninfo,
            min_size=min_size,
            max_size=max_size,
            kwargs=kwargs,
            configure=self._configure,
            # No check on checkout (it costs a round trip per request): a connection that
            # broke fails its request with a 503 and the pool replaces it.
            timeout=timeout,
            open=False,
            name=name,
        )

    @classmethod
    def for_api(
        cls, settings: Settings, conninfo: str, *, outbox_cap: int | None = None
    ) -> Database:
        """The API process's pool: bounded statements and lock waits, generic plans; the
        policy's outbox cap on every session (None: a pool that writes no outbox rows)."""
        values = session_settings(settings, outbox_cap=outbox_cap)
        pooled = settings.database_pooler == "transaction"
        return cls(
            conninfo,
            name="queue-server",
            min_size=settings.pool_min_size,
            max_size=settings.pool_max_size,
            options=None if pooled else _options(values),
            timeout=settings.pool_timeout,
            # Every statement prepared at first use, so every one runs its generic plan;
            # nothing prepared where the pooler cannot keep it.
            prepare_threshold=0 if settings.uses_prepared_statements else None,
            role_defaults=values if pooled else None,
            direct_conninfo=settings.listen_url(conninfo),
        )

    @classmethod
    def for_deliverer(cls, settings: Settings, conninfo: str, *, concurrency: int) -> Database:
        """A deliverer's pool: one connection per dispatch in flight, plus the claim's."""
        pooled = settings.database_pooler == "transaction"
        return cls(
            conninfo,
            name="queue-server-deliver",
            min_size=1,
            max_size=concurrency + 1,
            # Through a transaction pooler the API processes' role defaults apply.
            options=None
            if pooled
            else _options(
                {
                    "TimeZone": "UTC",
                    "statement_timeout": "15000",
                    "idle_in_transaction_session_timeout": str(
                        settings.idle_in_transaction_timeout_ms
                    ),
                }
            ),
            timeout=30.0,
            prepare_threshold=False if settings.uses_prepared_statements else None,
        )

    async def _configure(self, conn: Conn) -> None:
        """jsonb in and out through orjson (several times faster than the standard library
        on the payloads of a batch); uuids as text; when the connection was opened; and a
        watch for a cancelled synchronous-replication wait."""
        set_json_dumps(orjson.dumps, context=conn)
        set_json_loads(orjson.loads, context=conn)
        # Ids arrive as the text the API shows: no uuid.UUID made and turned back into a
        # string for every id of every row (profiled: 4% of a batched lease cycle's CPU).
        conn.adapters.register_loader("uuid", TextLoader)
        self._opened[conn] = time.monotonic()

        def on_notice(diag: psycopg.errors.Diagnostic) -> None:
            if (diag.message_primary or "").startswith(SYNC_CANCEL_WARNING):
                self._unconfirmed.add(conn)
                log.warning("a COMMIT returned before a synchronous standby confirmed it")

        conn.add_notice_handler(on_notice)

    async def open(self, *, wait: bool = False) -> None:
        if self.role_defaults is not None:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self.direct_conninfo, autocommit=True, connect_timeout=10
                ) as conn:
                    await ensure_role_defaults(conn, self.role_defaults)
            except psycopg.Error as exc:
                log.warning("could not check the role's session defaults: %s", exc)
        await self.pool.open(wait=wait)

    async def close(self) -> None:
        await self.pool.close()

    @contextlib.asynccontextmanager
    async def conn(self, timeout: float | None = None) -> AsyncIterator[Conn]:
        """A pooled connection in autocommit mode; driver failures become domain errors."""
        try:
            async with self.pool.connection(timeout=timeout or self.timeout) as conn:
                try:
                    yield conn
                    if conn in self._unconfirmed:
                        await self._confirm(conn)
                except psycopg.Error as exc:
                    if server_connection_lost(exc) is not None:
                        await self._drop(conn)
                    raise
        except PoolTimeout as exc:
            self.on_unavailable("pool-timeout")
            raise errors.ServiceUnavailableError() from exc
        except (
            psycopg.errors.QueryCanceled,
            psycopg.errors.LockNotAvailable,
            psycopg.errors.IdleInTransactionSessionTimeout,
        ) as exc:
            raise errors.TimeoutExceededError() from exc
        except psycopg.Error as exc:
            cause = server_connection_lost(exc)
            if cause is None:
                raise
            self.on_unavailable(cause)
            raise errors.ServiceUnavailableError() from exc

    @contextlib.asynccontextmanager
    async def tx(self) -> AsyncIterator[Conn]:
        """A pooled connection inside one transaction, committed when the block ends;
        the COMMIT is never cancelled (see `uncancelled`)."""
        # Not in pipeline mode: measured here, psycopg spent more CPU on the pipeline
        # than the round trips it saved cost.
        async with self.conn() as conn:
            transaction = conn.transaction()
            await transaction.__aenter__()
            try:
                yield conn
            except BaseException as exc:
                await transaction.__aexit__(type(exc), exc, exc.__traceback__)
                raise
            await uncancelled(transaction.__aexit__(None, None, None))

    async def _confirm(self, conn: Conn) -> None:
        """A COMMIT on this connection returned before the synchronous standby had it:
        wait for a later COMMIT to be confirmed, or answer 503."""
        self._unconfirmed.discard(conn)
        await uncancelled(confirm_durable(conn))
        if conn in self._unconfirmed:
            self._unconfirmed.discard(conn)
            raise errors.ServiceUnavailableError(
                "The commit was not confirmed by a synchronous standby; retry with the same"
                " Idempotency-Key."
            )

    async def _drop(self, conn: Conn) -> None:
        """This connection's server is gone or demoted, and so, most likely, is every
        other connection's: close this one, and drain the pool unless it was drained
        after this connection was opened (that drain dealt with it and its peers)."""
        opened = self._opened.get(conn, 0.0)
        if not conn.closed:
            await conn.close()
        if opened >= self._drained_at:
            self._drained_at = time.monotonic()
            await self.pool.drain()


def server_connection_lost(exc: BaseException) -> str | None:
    """Why the error says this connection's server is gone or no longer the primary
    ("connection-lost", "read-only", "protocol"), or None."""
    if isinstance(exc, psycopg.errors.QueryCanceled | psycopg.errors.LockNotAvailable):
        return None
    if isinstance(exc, psycopg.OperationalError):
        return "connection-lost"
    if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
        return "read-only"
    if isinstance(exc, psycopg.InternalError) and exc.sqlstate is None:
        return "protocol"
    return None


async def ensure_role_defaults(
    conn: psycopg.AsyncConnection[Any], values: dict[str, str]
) -> list[str]:
    """Make `values` the defaults of the connected role in this database (what every
    server connection a transaction pooler opens starts with); returns what changed."""
    changed: list[str] = []

    def on_notice(diag: psycopg.errors.Diagnostic) -> None:
        changed.append((diag.message_primary or "").removeprefix("queue-server: "))

    conn.add_notice_handler(on_notice)
    await conn.execute(WANT_ROLE_DEFAULTS, {"settings": orjson.dumps(values).decode()})
    await conn.execute(APPLY_ROLE_DEFAULTS)
    if changed:
        log.warning(
            "%s; server connections a pooler opened before keep their old values until it"
            " renews them",
            "; ".join(changed),
        )
    return changed


@contextlib.asynccontextmanager
async def direct_session(conninfo: str) -> AsyncIterator[Conn]:
    """One short session outside any pool (the metrics listener's scrape): autocommit,
    rows as dicts, statements bounded to 10 s."""
    async with await psycopg.AsyncConnection.connect(
        conninfo,
        autocommit=True,
        row_factory=dict_row,
        options="-c statement_timeout=10000 -c TimeZone=UTC",
    ) as conn:
        yield conn


async def confirm_durable(conn: Conn) -> None:
    """Commit a transaction whose COMMIT waits until the synchronous standby has
    everything up to it: whatever this session saw committed before is replicated when
    this returns. (Without synchronous replication it costs one commit.)"""
    async with conn.transaction():
        await conn.execute(WAIT_FOR_STANDBY)


async def uncancelled(aw: Awaitable[T]) -> T:
    """Await `aw` to its end even if the caller is cancelled meanwhile (the cancellation
    is raised after): psycopg answers a cancellation by cancelling the statement on the
    server, and a cancelled COMMIT under synchronous replication commits on the primary
    without the standby."""
    task = asyncio.ensure_future(aw)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():
                raise
            cancelled = True
            continue
        if cancelled:
            raise asyncio.CancelledError
        return result
