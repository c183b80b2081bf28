"""The statements about sessions themselves: the role's defaults behind a transaction
pooler, a commit that waits for the synchronous standby, and a transaction sent in one
pipeline."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from psycopg.pq import TransactionStatus

from queue_server.store.sql import load
from queue_server.store.types import Conn

_SQL = load("sessions")

WANT_ROLE_DEFAULTS = _SQL["want_role_defaults"]

APPLY_ROLE_DEFAULTS = _SQL["apply_role_defaults"]

WAIT_FOR_STANDBY = _SQL["wait_for_standby"]

_OPEN = (TransactionStatus.INTRANS, TransactionStatus.INERROR)


@contextlib.asynccontextmanager
async def pipelined_transaction(conn: Conn) -> AsyncIterator[None]:
    """BEGIN, the block's statements and COMMIT in one pipeline on an idle connection in
    autocommit mode; the statements are sent as the block runs, and a read of a result
    costs one round trip (a flush, not a Sync: the transaction goes on).

    Not psycopg's `transaction()` inside `pipeline()`: that nests two more pipelines,
    and leaving each sends a Sync and waits for it, so a transaction costs three round
    trips more than its reads (profiled: about a third of a holder operation's CPU in
    this process). Any exception in the block, the database's included, rolls the
    transaction back; a COMMIT that fails has ended it.
    """
    if conn.info.transaction_status != TransactionStatus.IDLE:
        raise RuntimeError("a pipelined transaction needs an idle connection")
    try:
        async with conn.pipeline():
            await conn.execute(_SQL["begin"], prepare=False)
            yield
            await conn.execute(_SQL["commit"], prepare=False)
    except BaseException:
        if conn.info.transaction_status in _OPEN:
            await conn.execute(_SQL["rollback"], prepare=False)
        raise
