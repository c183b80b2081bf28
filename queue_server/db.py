"""The one seam to PostgreSQL: a pool of set-up connections, `conn()`, `tx()`, driver errors.

Every connection the server opens for statements comes from a `Database` and is set
up here: server-side timeouts, UTC, and jsonb in and out through orjson. A driver
failure becomes a domain error here and nowhere else:

    PoolTimeout (no connection within the wait)  -> ServiceUnavailableError (503)
    QueryCanceled, LockNotAvailable (timeouts)   -> TimeoutExceededError (503)
    OperationalError (connection lost, refused)  -> ServiceUnavailableError (503)

Statements live in `queue_server.store`; callers hand them the connection this yields.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
import psycopg
import psycopg.errors
from psycopg.rows import dict_row
from psycopg.types.json import set_json_dumps, set_json_loads
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from queue_server import errors
from queue_server.settings import Settings
from queue_server.store.types import Conn

# An idle transaction never holds locks for longer than this.
IDLE_IN_TRANSACTION_MS = 60_000


async def _configure(conn: Conn) -> None:
    """jsonb in and out through orjson: several times faster than the standard library
    on the payloads of a batch."""
    set_json_dumps(orjson.dumps, context=conn)
    set_json_loads(orjson.loads, context=conn)


class Database:
    """A pool of connections in autocommit mode, each set up by `_configure`."""

    def __init__(
        self,
        conninfo: str,
        *,
        name: str,
        min_size: int,
        max_size: int,
        options: str,
        timeout: float,
        prepare_threshold: int | None = None,
    ) -> None:
        self.conninfo = conninfo
        self.timeout = timeout
        kwargs: dict[str, Any] = {"autocommit": True, "row_factory": dict_row, "options": options}
        if prepare_threshold is not None:
            kwargs["prepare_threshold"] = prepare_threshold
        self.pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
            conninfo,
            min_size=min_size,
            max_size=max_size,
            kwargs=kwargs,
            configure=_configure,
            # No check on checkout (it costs a round trip per request): a connection that
            # broke fails its request with a 503 and the pool replaces it.
            timeout=timeout,
            open=False,
            name=name,
        )

    @classmethod
    def for_api(cls, settings: Settings, conninfo: str) -> Database:
        """The API process's pool: bounded statements and lock waits, generic plans."""
        options = (
            f"-c statement_timeout={settings.statement_timeout_ms}"
            f" -c lock_timeout={settings.lock_timeout_ms}"
            f" -c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_MS} -c TimeZone=UTC"
            # Plans that do not depend on one tenant's statistics: a tenant whose rows
            # ANALYZE has not seen yet must not send acquire down the primary key.
            " -c plan_cache_mode=force_generic_plan"
        )
        return cls(
            conninfo,
            name="queue-server",
            min_size=settings.pool_min_size,
            max_size=settings.pool_max_size,
            options=options,
            timeout=settings.pool_timeout,
            # Every statement prepared at first use, so every one runs its generic plan.
            prepare_threshold=0,
        )

    @classmethod
    def for_deliverer(cls, settings: Settings, conninfo: str) -> Database:
        """A deliverer's pool: one connection per dispatch in flight, plus the claim's."""
        return cls(
            conninfo,
            name="queue-server-deliver",
            min_size=1,
            max_size=settings.delivery_concurrency + 1,
            options="-c TimeZone=UTC -c statement_timeout=15000",
            timeout=30.0,
        )

    async def open(self, *, wait: bool = False) -> None:
        await self.pool.open(wait=wait)

    async def close(self) -> None:
        await self.pool.close()

    @contextlib.asynccontextmanager
    async def conn(self, timeout: float | None = None) -> AsyncIterator[Conn]:
        """A pooled connection in autocommit mode; driver failures become domain errors."""
        try:
            async with self.pool.connection(timeout=timeout or self.timeout) as conn:
                yield conn
        except PoolTimeout as exc:
            raise errors.ServiceUnavailableError() from exc
        except (psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable) as exc:
            raise errors.TimeoutExceededError() from exc
        except psycopg.OperationalError as exc:
            raise errors.ServiceUnavailableError() from exc

    @contextlib.asynccontextmanager
    async def tx(self) -> AsyncIterator[Conn]:
        """A pooled connection inside one transaction, committed when the block ends."""
        # Not in pipeline mode: measured here, psycopg spent more CPU on the pipeline
        # than the round trips it saved cost.
        async with self.conn() as conn, conn.transaction():
            yield conn
