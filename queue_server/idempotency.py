"""The receipt protocol: an effecting request runs once per (tenant, caller, Idempotency-Key).

    claim the key --new--> run the operation in the same transaction --> fill the receipt
        |--finished receipt, same fingerprint--> replay its answer (Idempotent-Replayed)
        |--finished receipt, other fingerprint--> 422 idempotency-key-reuse
        '--receipt of a request still running (lock wait timed out)--> 409 in flight

A key is its caller's (the API key that sent it): another key of the tenant that sends the
same Idempotency-Key (a predictable one, `done-<item>`) makes a receipt of its own and can
neither replay nor block the first caller's. Stored as `<key id> <Idempotency-Key>`: an
Idempotency-Key has no space, so no key of one caller is another's (nor a database role's,
whose queue_server.enqueue keys are stored as given).

The receipt is claimed before any authority check, in the operation's transaction:
a concurrent request with the same key waits on the uncommitted receipt and then
replays. 2xx answers and 409/422 refusals are kept; anything else rolls back, so
a retry after a 5xx runs the operation again.

`Effects.run_pipelined` (the holder operations) sends BEGIN, the claim and the
operation's statements in one round trip, and the fill with the COMMIT in a
second, instead of five. The claim's answer is read before anything is
committed: when the key was not claimed the whole transaction, the operation's
statements included, rolls back, and the first answer is replayed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import orjson
import psycopg.errors

from queue_server import errors, views
from queue_server.db import Database
from queue_server.store import idempotency_receipts
from queue_server.store.sessions import WAIT_FOR_STANDBY, pipelined_transaction
from queue_server.store.types import Conn

# The refusals a receipt keeps: the same request would be refused the same way again.
KEPT_REFUSALS = (409, 422)


@dataclass(frozen=True, slots=True)
class Answer:
    """A finished answer: what the client gets now, and what a replay of its key gets later."""

    status: int
    body: bytes
    replayed: bool = False
    problem: bool = False
    # What the receipt keeps for a replay when it is not `body`: the answer without what is
    # shown once (a signing secret is never stored a second time).
    retained: bytes | None = None

    @classmethod
    def of(cls, status: int, body: Any, *, replayed: bool = False, retained: Any = None) -> Answer:
        """A JSON answer rendered as the API renders every body; `retained`, the body a
        replay of its key gets instead."""
        kept = None if retained is None else views.dumps(retained)
        return cls(status=status, body=views.dumps(body), replayed=replayed, retained=kept)


@dataclass(frozen=True, slots=True)
class Idempotency:
    """An effecting request's key and the fingerprint of what it asked for."""

    key: str
    fingerprint: str
    # The key id of the API key that sent it: the receipt is that caller's.
    caller: str

    @classmethod
    def of(cls, key: str | None, *, caller: str, method: str, path: str, body: Any) -> Idempotency:
        if key is None or not 1 <= len(key) <= 255 or not all(33 <= ord(c) <= 126 for c in key):
            raise errors.IdempotencyKeyRequiredError()
        canonical = orjson.dumps([method, path, body], option=orjson.OPT_SORT_KEYS)
        return cls(key=key, fingerprint=hashlib.sha256(canonical).hexdigest(), caller=caller)

    @property
    def receipt_key(self) -> str:
        """The receipt's key: the caller's, then the Idempotency-Key (which has no space)."""
        return f"{self.caller} {self.key}"


# What runs under a receipt: called with the transaction's connection, then the arguments
# `run` was given for it (the holder operations pass a store function and its arguments
# this way, instead of a closure built per request).
Operation = Callable[..., Awaitable[Answer]]


class _NotClaimed(Exception):  # noqa: N818 - control flow: roll back, then replay
    """The key has a finished receipt: undo whatever the operation did, then replay."""


async def claim(conn: Conn, *, tenant: str, idem: Idempotency, retention: timedelta) -> bool:
    """True when this transaction now owns the key; False when a finished receipt exists."""
    try:
        return await idempotency_receipts.claim(
            conn,
            tenant=tenant,
            key=idem.receipt_key,
            fingerprint=idem.fingerprint,
            retention=retention,
        )
    except psycopg.errors.LockNotAvailable as exc:
        raise errors.IdempotencyKeyInFlightError() from exc


async def replay(conn: Conn, *, tenant: str, idem: Idempotency) -> Answer:
    """The finished receipt's answer, or the refusal of a key reused for another request."""
    receipt = await idempotency_receipts.get(conn, tenant=tenant, key=idem.receipt_key)
    if receipt is None:
        raise errors.IdempotencyKeyInFlightError()
    if receipt["fingerprint"] != idem.fingerprint:
        raise errors.IdempotencyKeyReuseError(idempotency_key=idem.key)
    # A replay acknowledges the first request's effect: this transaction's COMMIT waits
    # for the synchronous standby to have everything up to it, the receipt included (a
    # first COMMIT whose wait was cancelled is visible on the primary before the standby
    # has it).
    await conn.execute(WAIT_FOR_STANDBY)
    status = receipt["response_status"]
    return Answer(
        status=status,
        body=receipt["response_body"].encode(),
        replayed=True,
        problem=status >= 400,
    )


async def fill(conn: Conn, *, tenant: str, idem: Idempotency, answer: Answer) -> None:
    """Keep the answer on the claimed receipt, for every repeat of the key."""
    await idempotency_receipts.fill(
        conn,
        tenant=tenant,
        key=idem.receipt_key,
        status=answer.status,
        body=(answer.retained or answer.body).decode(),
    )


class Effects:
    """Runs effecting operations once per (tenant, key), on the database's transactions."""

    def __init__(self, db: Database, *, retention: timedelta, problem_base_uri: str) -> None:
        self.db = db
        self.retention = retention
        self.problem_base_uri = problem_base_uri

    async def run(
        self,
        tenant: str,
        idem: Idempotency,
        instance: str,
        operation: Operation,
        *args: Any,
    ) -> Answer:
        """Run `operation(conn, *args)` once per (tenant, key); a repeat gets the first answer
        back."""
        async with self.db.tx() as conn:
            if not await claim(conn, tenant=tenant, idem=idem, retention=self.retention):
                return await replay(conn, tenant=tenant, idem=idem)
            try:
                answer = await operation(conn, *args)
            except errors.QueueServerError as exc:
                if exc.status not in KEPT_REFUSALS:
                    raise
                body = errors.problem(exc, base_uri=self.problem_base_uri, instance=instance)
                answer = Answer(status=exc.status, body=views.dumps(body), problem=True)
            await fill(conn, tenant=tenant, idem=idem, answer=answer)
            return answer

    async def run_pipelined(
        self, tenant: str, idem: Idempotency, instance: str, operation: Operation, *args: Any
    ) -> Answer:
        """`run`, in two round trips: (BEGIN, claim, operation) then (fill, COMMIT)."""
        try:
            async with self.db.conn() as conn:
                try:
                    async with pipelined_transaction(conn):
                        claimed = await idempotency_receipts.start_claim(
                            conn,
                            tenant=tenant,
                            key=idem.receipt_key,
                            fingerprint=idem.fingerprint,
                            retention=self.retention,
                        )
                        try:
                            answer = await operation(conn, *args)
                        except errors.QueueServerError as exc:
                            if not await idempotency_receipts.was_claimed(claimed):
                                raise _NotClaimed() from exc
                            if exc.status not in KEPT_REFUSALS:
                                raise
                            body = errors.problem(
                                exc, base_uri=self.problem_base_uri, instance=instance
                            )
                            answer = Answer(status=exc.status, body=views.dumps(body), problem=True)
                        else:
                            if not await idempotency_receipts.was_claimed(claimed):
                                raise _NotClaimed()
                        await fill(conn, tenant=tenant, idem=idem, answer=answer)
                    return answer
                except _NotClaimed:
                    # Rolled back: the operation changed nothing. The receipt is finished.
                    return await replay(conn, tenant=tenant, idem=idem)
        except errors.TimeoutExceededError:
            # A lock wait ran out: the claim's (the key is in flight) or the operation's.
            # The step-by-step path tells them apart.
            return await self.run(tenant, idem, instance, operation, *args)
