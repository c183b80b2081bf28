"""The webhook outbox: rows written by transitions, claimed and settled by deliverers.

    transition --(same statement: outbox CTE)--> pending
    pending --claim (attempt n; the next attempt's instant persisted first)--> pending, claimed
    claimed --2xx--> delivered
    claimed --retryable failure, attempts left--> pending, due at the persisted instant
    claimed --retryable failure on the last attempt, or any other failure--> dead
                                                  (+ a dead letter of kind 'delivery')
    claimed --410 Gone--> cancelled; the watcher is disabled and its pending rows cancelled
    claimed --budget refused before the socket--> pending, as it was (no attempt counted)
    claimed --deliverer stopped mid-dispatch--> pending, due now (the attempt counted)
    pending, past its deadline --expire--> dead (deadline-exceeded)
    dead --operator replay--> pending, attempts 0, same delivery key, its deadline anew
    watcher cancel: pending -> cancelled.  watcher paused: pending rows are not claimed,
    and their deadline does not run (resume moves `deadline_from` on by the pause).

A claim is fenced by a random token: an outcome is recorded only by the deliverer
that holds the claim, and a claim lost with its deliverer expires at `claimed_until`.
A delivery's deadline is `deadline_from` plus the class deadline the deliverer's
loaded policy gives (`%(deadline)s`, seconds).

The rows are written by the `outbox` CTE of each transition in `sql/transitions.sql`,
so they commit or roll back with it: one row per active watcher of the event for each
changed row, the body's item built by the `item_json` SQL function. Its join reads the
partial index ix_watchers_active: a tenant without watchers costs one index probe per
statement.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from psycopg.types.json import Jsonb

from queue_server.store.sql import fetch_all, fetch_one, load
from queue_server.store.types import Conn, Row

_SQL = load("outbox")

# The events a watcher can ask for; each is written by a transition (tests/test_sql_files.py).
EVENTS = (
    "item.enqueued",
    "item.completed",
    "item.requeued",
    "item.quarantined",
    "item.replayed",
    "item.cancelled",
)


async def delivery_counts(conn: Conn, *, tenant: str) -> dict[str, dict[str, int]]:
    """Per watcher: its outbox rows by state."""
    counts: dict[str, dict[str, int]] = {}
    for row in await fetch_all(conn, _SQL["delivery_counts"], {"tenant": tenant}):
        counts.setdefault(row["watcher_id"], {})[row["state"]] = int(row["n"])
    return counts


async def list_deliveries(
    conn: Conn,
    *,
    tenant: str,
    watcher_id: str,
    state: str | None,
    after_seq: int | None,
    limit: int,
) -> list[Row]:
    """A watcher's outbox rows in creation order."""
    params = {
        "tenant": tenant,
        "watcher_id": watcher_id,
        "state": state,
        "after": after_seq,
        "limit": limit,
    }
    return await fetch_all(conn, _SQL["list_deliveries"], params)


async def get_delivery(conn: Conn, *, tenant: str, delivery_id: str) -> Row | None:
    return await fetch_one(
        conn, _SQL["get_delivery"], {"tenant": tenant, "delivery_id": delivery_id}
    )


async def claim(
    conn: Conn,
    *,
    limit: int,
    concurrency: int,
    token: str,
    lease: timedelta,
    delays: list[float],
    deadline: float,
    exclude: list[str] | None = None,
) -> list[Row]:
    """pending, due and within its deadline, watcher active -> claimed as attempt n + 1,
    next instant persisted; each row carries `deadline_in`, the seconds its deadline leaves.

    At most `limit` rows, none of a watcher that has one in flight (claimed by any
    deliverer, not yet recorded, claim not expired), none in `exclude` (delivery ids),
    and of so many watchers that at most `concurrency` have rows in flight. Run inside a
    transaction: the claims of all deliverers are serialized by an advisory lock.
    """
    await conn.execute(_SQL["lock_claims"])
    params = {
        "exclude": exclude or [],
        "limit": limit,
        "concurrency": concurrency,
        "token": token,
        "lease": lease,
        "delays": delays,
        "deadline": deadline,
    }
    return await fetch_all(conn, _SQL["claim"], params)


async def release(conn: Conn, *, row: Row, token: str) -> bool:
    """claimed -> pending as before the claim: the attempt never reached a socket."""
    params = {
        "tenant": row["tenant_id"],
        "delivery_id": row["delivery_id"],
        "token": token,
        "next_attempt_at": row["prev_next_attempt_at"],
        "due_at": row["prev_due_at"],
        "last_attempt_at": row["prev_last_attempt_at"],
    }
    return await fetch_one(conn, _SQL["release"], params) is not None


async def return_to_outbox(
    conn: Conn,
    *,
    row: Row,
    token: str,
    outcome: dict[str, Any],
    receipts: list[dict[str, Any]],
    omitted: int,
) -> bool:
    """claimed -> pending, due now: the deliverer stopped mid-dispatch (the attempt counts,
    its cancelled receipt is kept); the next deliverer sends it again under the same key."""
    params = {
        "tenant": row["tenant_id"],
        "delivery_id": row["delivery_id"],
        "token": token,
        "outcome": Jsonb(outcome),
        "receipts": Jsonb(receipts),
        "omitted": omitted,
    }
    return await fetch_one(conn, _SQL["return_to_outbox"], params) is not None


async def record(
    conn: Conn,
    *,
    row: Row,
    token: str,
    state: str,
    outcome: dict[str, Any],
    receipts: list[dict[str, Any]],
    omitted: int,
    lease: timedelta,
    reason: str = "",
) -> Row | None:
    """claimed -> delivered, pending (due at the persisted instant) or dead (+ dead letter);
    the watcher's other rows of the claim, sent after it, keep their claims `lease` more."""
    params = {
        "lease": lease,
        "tenant": row["tenant_id"],
        "delivery_id": row["delivery_id"],
        "token": token,
        "state": state,
        "outcome": Jsonb(outcome),
        "receipts": Jsonb(receipts),
        "omitted": omitted,
        "reason": reason,
    }
    return await fetch_one(conn, _SQL["record"], params)


async def expire(conn: Conn, *, deadline: float, limit: int) -> int:
    """pending past its deadline (watcher active, not in flight) -> dead + a dead letter."""
    row = await fetch_one(conn, _SQL["expire"], {"deadline": deadline, "limit": limit})
    return int(row["expired"]) if row else 0


async def resolve_dead_letter(
    conn: Conn, *, tenant: str, dead_letter_id: str, replay: bool
) -> Row | None:
    """dead -> pending with a fresh budget and deadline (replay; same delivery key) or
    cancelled (discard)."""
    params = {
        "tenant": tenant,
        "dead_letter_id": dead_letter_id,
        "state": "pending" if replay else "cancelled",
        "resolution": "replayed" if replay else "discarded",
    }
    return await fetch_one(conn, _SQL["resolve_dead_letter"], params)


async def delivery_watcher_state(conn: Conn, *, tenant: str, delivery_id: str) -> Row | None:
    """A delivery's state and its watcher's, both locked until the transaction ends."""
    return await fetch_one(
        conn, _SQL["delivery_watcher_state"], {"tenant": tenant, "delivery_id": delivery_id}
    )


async def lock_backlogged(conn: Conn, *, limit: int) -> list[Row]:
    """Backlogged active watchers no one else is writing for, locked to the commit."""
    return await fetch_all(conn, _SQL["lock_backlogged"], {"limit": limit})


async def backfill(conn: Conn, *, watcher: Row, cap: int) -> Row:
    """A backlogged watcher's missed events -> pending rows from the ledger, in its order,
    at most up to `cap` pending; the mark cleared once none is left. The caller holds the
    watcher's lock (`lock_backlogged`, same transaction)."""
    params = {
        "tenant": watcher["tenant_id"],
        "watcher_id": watcher["watcher_id"],
        "from": watcher["backlog_from"],
        "cap": cap,
    }
    row = await fetch_one(conn, _SQL["backfill"], params)
    assert row is not None
    return row
