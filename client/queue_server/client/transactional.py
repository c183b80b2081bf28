"""Enqueue inside the application's own database transaction: `enqueue_in` and
`enqueue_many_in` call `queue_server.enqueue` / `queue_server.enqueue_many` (migration
0017) on the connection the application already holds, so the item exists exactly when
the application's own rows commit.

    with psycopg.connect(url) as conn, conn.transaction():
        order_id = conn.execute("INSERT INTO orders ... RETURNING id").fetchone()[0]
        enqueue_in(conn, "acme", "emails", {"order": order_id}, key=f"order-{order_id}")

Takes a psycopg `Connection` (returns the item id) or `AsyncConnection` (returns an
awaitable of it), or a SQLAlchemy `Session` or `Connection` (on the psycopg driver,
`postgresql+psycopg://`). Never commits: the caller's transaction decides. A
refusal is the typed error of `queue_server.client.errors` (`BacklogCapReachedError`,
`IdempotencyKeyReuseError`, `PolicyEnvelopeError`, `InvalidRequestError`,
`TenantNotFoundError`, `EnqueueNotGrantedError`), with the driver's error as its cause;
after one, the transaction is aborted (roll it back, or call inside a savepoint).

The items keep a W3C trace context (`traceparent`, `tracestate`): the one given, else,
when opentelemetry-api is installed and a valid span is current, that span's (in the W3C
propagator's format). The database drops a malformed one; it never refuses the enqueue.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, overload

from queue_server.client import errors
from queue_server.client.tracing import current_context

if TYPE_CHECKING:
    import psycopg

# psycopg (%(name)s) and SQLAlchemy (:name) spellings of the same two calls.
_ENQUEUE = (
    "SELECT queue_server.enqueue(%(tenant)s, %(queue)s, %(payload)s::jsonb, %(key)s,"
    " %(priority)s, %(delay)s::interval, %(max_acquisitions)s,"
    " %(traceparent)s::text, %(tracestate)s::text)"
)
# The keys (server migration 0034), named only when one is given: a call without them is
# the call an older server knows.
_KEYS = (
    "unique_key",
    "unique_for",
    "partition_key",
    "ordering_key",
    "depends_on",  # server migration 0036, as the next
    "on_dependency_failure",
)
_ENQUEUE_KEYS = (
    "SELECT queue_server.enqueue(%(tenant)s, %(queue)s, %(payload)s::jsonb, %(key)s,"
    " %(priority)s, %(delay)s::interval, %(max_acquisitions)s,"
    " %(traceparent)s::text, %(tracestate)s::text, unique_key => %(unique_key)s::text,"
    " unique_for => %(unique_for)s::interval, partition_key => %(partition_key)s::text,"
    " ordering_key => %(ordering_key)s::text, depends_on => %(depends_on)s::uuid[],"
    " on_dependency_failure => %(on_dependency_failure)s::text)"
)
_SA_ENQUEUE_KEYS = (
    "SELECT queue_server.enqueue(:tenant, :queue, CAST(:payload AS jsonb), :key,"
    " :priority, CAST(:delay AS interval), :max_acquisitions,"
    " CAST(:traceparent AS text), CAST(:tracestate AS text),"
    " unique_key => CAST(:unique_key AS text), unique_for => CAST(:unique_for AS interval),"
    " partition_key => CAST(:partition_key AS text),"
    " ordering_key => CAST(:ordering_key AS text),"
    " depends_on => CAST(:depends_on AS uuid[]),"
    " on_dependency_failure => CAST(:on_dependency_failure AS text))"
)
_ENQUEUE_MANY = (
    "SELECT queue_server.enqueue_many(%(tenant)s, %(queue)s, %(items)s::jsonb, %(key)s,"
    " %(traceparent)s::text, %(tracestate)s::text)"
)
_SA_ENQUEUE = (
    "SELECT queue_server.enqueue(:tenant, :queue, CAST(:payload AS jsonb), :key,"
    " :priority, CAST(:delay AS interval), :max_acquisitions,"
    " CAST(:traceparent AS text), CAST(:tracestate AS text))"
)
_SA_ENQUEUE_MANY = (
    "SELECT queue_server.enqueue_many(:tenant, :queue, CAST(:items AS jsonb), :key,"
    " CAST(:traceparent AS text), CAST(:tracestate AS text))"
)


def _delay(delay: float | timedelta) -> timedelta:
    return delay if isinstance(delay, timedelta) else timedelta(seconds=delay)


def _trace(traceparent: str | None, tracestate: str | None) -> dict[str, str | None]:
    """The trace context to send: the one given, else the current span's (none without
    opentelemetry, or without a valid current span)."""
    if traceparent is None and tracestate is None:
        carrier = current_context()
        traceparent, tracestate = carrier.get("traceparent"), carrier.get("tracestate")
    return {"traceparent": traceparent, "tracestate": tracestate}


def _item(item: Any) -> dict[str, Any]:
    """One entry of `enqueue_many_in`: a mapping with `payload` (and optionally `priority`,
    `delay` in seconds or a timedelta, `max_acquisitions`, `unique_key`, `unique_for` in
    seconds or a timedelta, `partition_key`, `ordering_key`), or an SDK `NewItem`."""
    if not isinstance(item, dict):
        item = {
            k: getattr(item, k)
            for k in ("payload", "priority", "delay", "max_acquisitions", *_KEYS)
            if hasattr(item, k)
        }
    out = dict(item)
    for name in ("delay", "unique_for"):
        if isinstance(out.get(name), timedelta):
            out[name] = out[name].total_seconds()
    return {k: v for k, v in out.items() if v is not None or k == "payload"}


def _typed(exc: BaseException) -> BaseException:
    """The SDK's typed error for a refusal of queue_server.enqueue, else `exc` itself."""
    cause = getattr(exc, "orig", None) or exc  # SQLAlchemy wraps the driver's error
    diag = getattr(cause, "diag", None)
    if diag is None:
        return exc
    found = errors.from_sqlstate(
        getattr(cause, "sqlstate", None), diag.message_primary or str(cause), diag.message_detail
    )
    return exc if found is None else found


class _Call:
    """One call of a function of migration 0017, ready for either kind of connection."""

    def __init__(self, sql: str, sa_sql: str, params: dict[str, Any]) -> None:
        self.sql, self.sa_sql, self.params = sql, sa_sql, params

    def psycopg_params(self) -> dict[str, Any]:
        return {
            k: json.dumps(v) if k in ("payload", "items") else v for k, v in self.params.items()
        }

    def run(self, conn: Any) -> Any:
        import psycopg

        if isinstance(conn, psycopg.AsyncConnection):
            return self._run_async_psycopg(conn)
        if isinstance(conn, psycopg.Connection):
            try:
                row = conn.execute(self.sql, self.psycopg_params()).fetchone()
            except psycopg.Error as exc:
                raise _typed(exc) from exc
            assert row is not None
            return row[0]
        return self._run_sqlalchemy(conn)

    async def _run_async_psycopg(self, conn: psycopg.AsyncConnection[Any]) -> Any:
        import psycopg

        try:
            cur = await conn.execute(self.sql, self.psycopg_params())
            row = await cur.fetchone()
        except psycopg.Error as exc:
            raise _typed(exc) from exc
        assert row is not None
        return row[0]

    def _run_sqlalchemy(self, conn: Any) -> Any:
        from sqlalchemy import exc as sa_exc
        from sqlalchemy import text
        from sqlalchemy.engine import Connection
        from sqlalchemy.orm import Session

        if not isinstance(conn, Session | Connection):
            raise TypeError(
                "enqueue_in takes a psycopg Connection or AsyncConnection, or a SQLAlchemy"
                f" Session or Connection, not {type(conn).__name__}"
            )
        try:
            return conn.execute(text(self.sa_sql), self.psycopg_params()).scalar_one()
        except sa_exc.DBAPIError as exc:
            raise _typed(exc) from exc


@overload
def enqueue_in(
    conn: psycopg.AsyncConnection[Any],
    tenant: str,
    queue: str,
    payload: Any,
    *,
    key: str,
    priority: int = 0,
    delay: float | timedelta = 0,
    max_acquisitions: int | None = None,
    traceparent: str | None = None,
    tracestate: str | None = None,
    unique_key: str | None = None,
    unique_for: float | timedelta | None = None,
    partition_key: str | None = None,
    ordering_key: str | None = None,
    depends_on: Sequence[str] | None = None,
    on_dependency_failure: str | None = None,
) -> Awaitable[str]: ...


@overload
def enqueue_in(
    conn: Any,
    tenant: str,
    queue: str,
    payload: Any,
    *,
    key: str,
    priority: int = 0,
    delay: float | timedelta = 0,
    max_acquisitions: int | None = None,
    traceparent: str | None = None,
    tracestate: str | None = None,
    unique_key: str | None = None,
    unique_for: float | timedelta | None = None,
    partition_key: str | None = None,
    ordering_key: str | None = None,
    depends_on: Sequence[str] | None = None,
    on_dependency_failure: str | None = None,
) -> Any: ...


def enqueue_in(
    conn: Any,
    tenant: str,
    queue: str,
    payload: Any,
    *,
    key: str,
    priority: int = 0,
    delay: float | timedelta = 0,
    max_acquisitions: int | None = None,
    traceparent: str | None = None,
    tracestate: str | None = None,
    unique_key: str | None = None,
    unique_for: float | timedelta | None = None,
    partition_key: str | None = None,
    ordering_key: str | None = None,
    depends_on: Sequence[str] | None = None,
    on_dependency_failure: str | None = None,
) -> Any:
    """Enqueue one item in `conn`'s open transaction; its id (a string), or an awaitable of
    it for an async connection. `key`: the idempotency key (the same key and arguments
    return the same id; other arguments raise `IdempotencyKeyReuseError`; the trace context
    is not one of them). `traceparent`/`tracestate`: the W3C trace context to keep with the
    item; when neither is given, the current OpenTelemetry span's, if any. `unique_key`
    (with `unique_for`), `partition_key`, `ordering_key`, `depends_on` (item ids) and
    `on_dependency_failure` are the REST enqueue's: with a unique key already held, the id
    answered is the holder's; with a dependency not completed, the item waits."""
    keys = {
        "unique_key": unique_key,
        "unique_for": None if unique_for is None else _delay(unique_for),
        "partition_key": partition_key,
        "ordering_key": ordering_key,
        "depends_on": None if depends_on is None else [str(d) for d in depends_on],
        "on_dependency_failure": on_dependency_failure,
    }
    keyed = any(v is not None for v in keys.values())
    call = _Call(
        _ENQUEUE_KEYS if keyed else _ENQUEUE,
        _SA_ENQUEUE_KEYS if keyed else _SA_ENQUEUE,
        {
            "tenant": tenant,
            "queue": queue,
            "payload": payload,
            "key": key,
            "priority": priority,
            "delay": _delay(delay),
            "max_acquisitions": max_acquisitions,
            **_trace(traceparent, tracestate),
            **(keys if keyed else {}),
        },
    )
    result = call.run(conn)
    if isinstance(result, Awaitable):
        return _as_str(result)
    return str(result)


async def _as_str(result: Awaitable[Any]) -> str:
    return str(await result)


async def _as_strs(result: Awaitable[Any]) -> list[str]:
    return [str(i) for i in await result]


@overload
def enqueue_many_in(
    conn: psycopg.AsyncConnection[Any],
    tenant: str,
    queue: str,
    items: Sequence[Any],
    *,
    key: str,
    traceparent: str | None = None,
    tracestate: str | None = None,
) -> Awaitable[list[str]]: ...


@overload
def enqueue_many_in(
    conn: Any,
    tenant: str,
    queue: str,
    items: Sequence[Any],
    *,
    key: str,
    traceparent: str | None = None,
    tracestate: str | None = None,
) -> Any: ...


def enqueue_many_in(
    conn: Any,
    tenant: str,
    queue: str,
    items: Sequence[Any],
    *,
    key: str,
    traceparent: str | None = None,
    tracestate: str | None = None,
) -> Any:
    """Enqueue 1 to 500 items in `conn`'s open transaction, all or nothing against the
    backlog cap; their ids in the order given (or an awaitable of them). Each item is a
    mapping with `payload` and optionally `priority`, `delay` (seconds or a timedelta),
    `max_acquisitions` and the keys `enqueue_in` takes, or an SDK `NewItem`. An item whose
    unique key is held (by an earlier item of the call, too) is answered with the holder's id. `traceparent`/`tracestate`: one W3C trace
    context for every item (as `enqueue_in`'s, the current span's when neither is given)."""
    call = _Call(
        _ENQUEUE_MANY,
        _SA_ENQUEUE_MANY,
        {
            "tenant": tenant,
            "queue": queue,
            "items": [_item(i) for i in items],
            "key": key,
            **_trace(traceparent, tracestate),
        },
    )
    result = call.run(conn)
    if isinstance(result, Awaitable):
        return _as_strs(result)
    return [str(i) for i in result]
