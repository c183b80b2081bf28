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
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from psycopg.types.json import Jsonb

from queue_server.store.sql import Statements, fetch_all, fetch_one
from queue_server.store.types import Conn, Row

_SQL = Statements(__name__)

EVENTS = (
    "item.enqueued",
    "item.completed",
    "item.requeued",
    "item.quarantined",
    "item.replayed",
    "item.cancelled",
)


def _ts(expr: str) -> str:
    """An RFC 3339 UTC rendering of a timestamptz, as the API renders times."""
    return f"""to_char({expr} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')"""


# The item exactly as `queue_server.views.item` shapes it, built from the transition's row.
_ITEM_JSON = f"""jsonb_build_object(
        'item_id', s.item_id::text, 'tenant', s.tenant_id, 'queue', s.queue,
        'state', s.state::text, 'payload', s.payload, 'priority', s.priority,
        'available_at', {_ts("s.available_at")}, 'fence', s.fence,
        'acquisition_count', s.acquisition_count, 'max_acquisitions', s.max_acquisitions,
        'lease_holder', s.lease_holder, 'lease_expires_at', {_ts("s.lease_expires_at")},
        'lease_deadline_at', CASE WHEN s.state = 'leased'
                                  THEN {_ts("s.lease_deadline_at")} END,
        'result', s.result, 'last_failure', s.last_failure,
        'created_at', {_ts("s.created_at")}, 'updated_at', {_ts("s.updated_at")})"""


def outbox_cte(event: str, source: str) -> str:
    """`outbox AS (...)`: one outbox row per active watcher of `event` for each row of `source`.

    Appended to a transition's WITH list, so the rows commit or roll back with the
    transition. The join reads the partial index ix_watchers_active: a tenant
    without watchers costs one index probe per statement.
    """
    if event not in EVENTS:
        raise ValueError(f"unknown event {event!r}")
    return f"""outbox AS (
    INSERT INTO outbox_deliveries (tenant_id, watcher_id, delivery_key, event, item_id, queue,
                                   body, state, next_attempt_at, due_at, created_at, updated_at)
    SELECT s.tenant_id, w.watcher_id, 'msg_' || replace(gen_random_uuid()::text, '-', ''),
           '{event}', s.item_id, s.queue,
           jsonb_build_object('event', '{event}', 'occurred_at', {_ts("statement_timestamp()")},
                              'item', {_ITEM_JSON}),
           'pending', statement_timestamp(), statement_timestamp(), statement_timestamp(),
           statement_timestamp()
    FROM {source} s
    JOIN watchers w ON w.tenant_id = s.tenant_id AND w.state = 'active'
     AND '{event}' = ANY(w.events) AND (w.queues IS NULL OR s.queue = ANY(w.queues))
    ORDER BY s.item_id, w.watcher_id
)"""


_DELIVERY_COUNTS = _SQL(
    "delivery_counts",
    """
SELECT watcher_id::text AS watcher_id, state, count(*) AS n FROM outbox_deliveries
WHERE tenant_id = %(tenant)s GROUP BY watcher_id, state
""",
)


async def delivery_counts(conn: Conn, *, tenant: str) -> dict[str, dict[str, int]]:
    """Per watcher: its outbox rows by state."""
    counts: dict[str, dict[str, int]] = {}
    for row in await fetch_all(conn, _DELIVERY_COUNTS, {"tenant": tenant}):
        counts.setdefault(row["watcher_id"], {})[row["state"]] = int(row["n"])
    return counts


_DELIVERY_COLUMNS = (
    "tenant_id, delivery_id, seq, watcher_id, delivery_key, event, item_id, queue, state,"
    " attempts, next_attempt_at, due_at, last_attempt_at, last_outcome, receipts,"
    " receipts_omitted, created_at, updated_at, delivered_at, deadline_from"
)


_LIST_DELIVERIES = _SQL(
    "list_deliveries",
    f"""
SELECT {_DELIVERY_COLUMNS} FROM outbox_deliveries
WHERE tenant_id = %(tenant)s AND watcher_id = %(watcher_id)s
  AND (%(state)s::text IS NULL OR state = %(state)s)
  AND (%(after)s::bigint IS NULL OR seq > %(after)s)
ORDER BY seq
LIMIT %(limit)s
""",
)


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
    return await fetch_all(conn, _LIST_DELIVERIES, params)


_GET_DELIVERY = _SQL(
    "get_delivery",
    f"""
SELECT {_DELIVERY_COLUMNS} FROM outbox_deliveries
WHERE tenant_id = %(tenant)s AND delivery_id = %(delivery_id)s
""",
)


async def get_delivery(conn: Conn, *, tenant: str, delivery_id: str) -> Row | None:
    return await fetch_one(conn, _GET_DELIVERY, {"tenant": tenant, "delivery_id": delivery_id})


# Claims are taken one deliverer at a time (this lock, held to the claim's commit), so
# the claim statement's count of the deliveries in flight includes every other claim.
_LOCK_CLAIMS = _SQL(
    "lock_claims",
    "SELECT pg_advisory_xact_lock(hashtext('queue-server-deliveries-in-flight'))",
)

# The attempt's number and the instant of the next one are committed before the
# request is sent: a deliverer that dies mid-attempt leaves the row due again at the
# persisted instant (or at its claim's expiry, whichever is later), never earlier.
# One watcher's claimed rows go out one at a time, and a watcher with a claimed row gets
# no other claim until it is recorded; so the requests in flight are the watchers with
# claimed rows (claim not expired), of every deliverer: a claim keeps them at most
# %(concurrency)s, taking the due rows of the first watchers in due order.
_CLAIM = _SQL(
    "claim",
    """
WITH in_flight AS MATERIALIZED (
    SELECT DISTINCT tenant_id, watcher_id FROM outbox_deliveries
    WHERE state = 'pending' AND claim_token IS NOT NULL
      AND claimed_until > statement_timestamp()
), candidates AS (
    SELECT o.tenant_id, o.delivery_id, o.watcher_id,
           row_number() OVER (ORDER BY o.due_at, o.seq) AS pos
    FROM outbox_deliveries o
    WHERE o.state = 'pending' AND o.due_at <= statement_timestamp()
      AND o.deadline_from > statement_timestamp() - make_interval(secs => %(deadline)s)
      AND EXISTS (SELECT 1 FROM watchers w
                  WHERE w.tenant_id = o.tenant_id AND w.watcher_id = o.watcher_id
                    AND w.state = 'active')
      AND NOT EXISTS (SELECT 1 FROM in_flight f
                      WHERE f.tenant_id = o.tenant_id AND f.watcher_id = o.watcher_id)
      AND o.delivery_id <> ALL(%(exclude)s::uuid[])
    ORDER BY o.due_at, o.seq
    LIMIT %(limit)s
), ranked AS (
    -- watcher_rank: the watcher's rank among the claim's watchers, in due order.
    SELECT r.tenant_id, r.delivery_id, dense_rank() OVER (ORDER BY r.first_pos) AS watcher_rank
    FROM (SELECT c.*, min(c.pos) OVER (PARTITION BY c.tenant_id, c.watcher_id) AS first_pos
          FROM candidates c) r
), due AS (
    -- SKIP LOCKED: a row being recorded or cancelled right now is not ours.
    SELECT o.tenant_id, o.delivery_id, o.next_attempt_at, o.due_at, o.last_attempt_at
    FROM outbox_deliveries o
    JOIN ranked r ON r.tenant_id = o.tenant_id AND r.delivery_id = o.delivery_id
    WHERE r.watcher_rank <= %(concurrency)s - (SELECT count(*) FROM in_flight)
      AND o.state = 'pending' AND o.due_at <= statement_timestamp()
    FOR UPDATE OF o SKIP LOCKED
), claimed AS (
    UPDATE outbox_deliveries o
    SET attempts = o.attempts + 1,
        -- A watcher's rows go out one after another: recording one renews the next ones'.
        claim_token = %(token)s, claimed_until = statement_timestamp() + %(lease)s,
        last_attempt_at = statement_timestamp(),
        next_attempt_at = statement_timestamp()
            + make_interval(secs => (%(delays)s::float8[])[o.attempts + 1]),
        due_at = greatest(statement_timestamp()
                              + make_interval(secs => (%(delays)s::float8[])[o.attempts + 1]),
                          statement_timestamp() + %(lease)s),
        updated_at = statement_timestamp()
    FROM due
    WHERE o.tenant_id = due.tenant_id AND o.delivery_id = due.delivery_id
    RETURNING o.*, due.next_attempt_at AS prev_next_attempt_at, due.due_at AS prev_due_at,
              due.last_attempt_at AS prev_last_attempt_at
)
SELECT c.*, w.url, w.secret,
       CASE WHEN w.previous_secret_expires_at > statement_timestamp()
            THEN w.previous_secret END AS previous_secret,
       statement_timestamp() AS claimed_at,
       -- The wall deadline of this attempt's broker run: what is left of the delivery's.
       extract(epoch FROM c.deadline_from + make_interval(secs => %(deadline)s)
                          - statement_timestamp())::float8 AS deadline_in
FROM claimed c
JOIN watchers w ON w.tenant_id = c.tenant_id AND w.watcher_id = c.watcher_id
ORDER BY c.seq
""",
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
    await conn.execute(_LOCK_CLAIMS)
    params = {
        "exclude": exclude or [],
        "limit": limit,
        "concurrency": concurrency,
        "token": token,
        "lease": lease,
        "delays": delays,
        "deadline": deadline,
    }
    return await fetch_all(conn, _CLAIM, params)


_RELEASE = _SQL(
    "release",
    """
UPDATE outbox_deliveries
SET attempts = attempts - 1, next_attempt_at = %(next_attempt_at)s, due_at = %(due_at)s,
    last_attempt_at = %(last_attempt_at)s, claim_token = NULL, claimed_until = NULL,
    updated_at = statement_timestamp()
WHERE tenant_id = %(tenant)s AND delivery_id = %(delivery_id)s AND claim_token = %(token)s
RETURNING delivery_id
""",
)


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
    return await fetch_one(conn, _RELEASE, params) is not None


_RETURN = _SQL(
    "return_to_outbox",
    """
UPDATE outbox_deliveries
SET last_outcome = %(outcome)s, receipts = %(receipts)s, receipts_omitted = %(omitted)s,
    claim_token = NULL, claimed_until = NULL, due_at = statement_timestamp(),
    updated_at = statement_timestamp()
WHERE tenant_id = %(tenant)s AND delivery_id = %(delivery_id)s AND claim_token = %(token)s
  AND state = 'pending'
RETURNING delivery_id
""",
)


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
    return await fetch_one(conn, _RETURN, params) is not None


_RECORD = _SQL(
    "record",
    """
WITH upd AS (
    UPDATE outbox_deliveries
    SET state = %(state)s, last_outcome = %(outcome)s, receipts = %(receipts)s,
        receipts_omitted = %(omitted)s, claim_token = NULL, claimed_until = NULL,
        delivered_at = CASE WHEN %(state)s = 'delivered' THEN statement_timestamp() END,
        next_attempt_at = CASE WHEN %(state)s = 'pending' THEN next_attempt_at END,
        due_at = CASE WHEN %(state)s = 'pending' THEN coalesce(next_attempt_at, due_at)
                      ELSE due_at END,
        updated_at = statement_timestamp()
    WHERE tenant_id = %(tenant)s AND delivery_id = %(delivery_id)s
      AND claim_token = %(token)s AND state = 'pending'
    RETURNING *
), dead AS (
    INSERT INTO dead_letters (tenant_id, kind, item_id, delivery_id, queue, reason,
                              last_failure, created_at)
    SELECT tenant_id, 'delivery', item_id, delivery_id, queue, %(reason)s, last_outcome,
           statement_timestamp()
    FROM upd WHERE state = 'dead'
), renewed AS (
    -- The watcher's next rows of this claim go out after this one: their claims run on.
    UPDATE outbox_deliveries o
    SET claimed_until = statement_timestamp() + %(lease)s,
        due_at = greatest(o.due_at, statement_timestamp() + %(lease)s)
    FROM upd
    WHERE o.tenant_id = upd.tenant_id AND o.watcher_id = upd.watcher_id
      AND o.claim_token = %(token)s AND o.state = 'pending'
      AND o.delivery_id <> upd.delivery_id
)
SELECT * FROM upd
""",
)


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
    return await fetch_one(conn, _RECORD, params)


_EXPIRE = _SQL(
    "expire",
    """
WITH overdue AS (
    -- Only an active watcher's deadlines run (a paused one's wait), and a row in flight
    -- ends by its own broker's wall deadline instead.
    SELECT o.tenant_id, o.delivery_id
    FROM outbox_deliveries o
    JOIN watchers w ON w.tenant_id = o.tenant_id AND w.watcher_id = o.watcher_id
     AND w.state = 'active'
    WHERE o.state = 'pending'
      AND o.deadline_from <= statement_timestamp() - make_interval(secs => %(deadline)s)
      AND (o.claim_token IS NULL OR o.claimed_until <= statement_timestamp())
    ORDER BY o.deadline_from
    LIMIT %(limit)s
    FOR UPDATE OF o SKIP LOCKED
), upd AS (
    UPDATE outbox_deliveries o
    SET state = 'dead', claim_token = NULL, claimed_until = NULL, next_attempt_at = NULL,
        last_outcome = jsonb_build_object(
            'attempt', o.attempts, 'outcome', 'deadline_exceeded', 'status', NULL,
            'detail', 'not delivered within ' || %(deadline)s || ' s of its event'),
        updated_at = statement_timestamp()
    FROM overdue d
    WHERE o.tenant_id = d.tenant_id AND o.delivery_id = d.delivery_id AND o.state = 'pending'
    RETURNING o.*
), dead AS (
    INSERT INTO dead_letters (tenant_id, kind, item_id, delivery_id, queue, reason,
                              last_failure, created_at)
    SELECT tenant_id, 'delivery', item_id, delivery_id, queue,
           'deadline-exceeded: not delivered within ' || %(deadline)s || ' s of its event',
           last_outcome, statement_timestamp()
    FROM upd
)
SELECT count(*) AS expired FROM upd
""",
)


async def expire(conn: Conn, *, deadline: float, limit: int) -> int:
    """pending past its deadline (watcher active, not in flight) -> dead + a dead letter."""
    row = await fetch_one(conn, _EXPIRE, {"deadline": deadline, "limit": limit})
    return int(row["expired"]) if row else 0


_REPLAY_DEAD = _SQL(
    "resolve_dead_letter",
    """
WITH dl AS (
    UPDATE dead_letters d SET closed_at = statement_timestamp(), resolution = %(resolution)s
    FROM outbox_deliveries o
    WHERE d.tenant_id = %(tenant)s AND d.dead_letter_id = %(dead_letter_id)s
      AND d.kind = 'delivery' AND d.closed_at IS NULL
      AND o.tenant_id = d.tenant_id AND o.delivery_id = d.delivery_id AND o.state = 'dead'
    RETURNING d.delivery_id
)
UPDATE outbox_deliveries o
SET state = %(state)s, attempts = CASE WHEN %(state)s = 'pending' THEN 0 ELSE o.attempts END,
    next_attempt_at = CASE WHEN %(state)s = 'pending' THEN statement_timestamp() END,
    deadline_from = CASE WHEN %(state)s = 'pending' THEN statement_timestamp()
                         ELSE o.deadline_from END,
    due_at = statement_timestamp(), updated_at = statement_timestamp()
FROM dl
WHERE o.tenant_id = %(tenant)s AND o.delivery_id = dl.delivery_id AND o.state = 'dead'
RETURNING o.*
""",
)


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
    return await fetch_one(conn, _REPLAY_DEAD, params)


_DELIVERY_WATCHER_STATE = _SQL(
    "delivery_watcher_state",
    """
SELECT o.state, w.state AS watcher_state, o.watcher_id::text AS watcher_id
FROM outbox_deliveries o
JOIN watchers w ON w.tenant_id = o.tenant_id AND w.watcher_id = o.watcher_id
WHERE o.tenant_id = %(tenant)s AND o.delivery_id = %(delivery_id)s
FOR UPDATE OF o, w
""",
)


async def delivery_watcher_state(conn: Conn, *, tenant: str, delivery_id: str) -> Row | None:
    """A delivery's state and its watcher's, both locked until the transaction ends."""
    return await fetch_one(
        conn, _DELIVERY_WATCHER_STATE, {"tenant": tenant, "delivery_id": delivery_id}
    )
