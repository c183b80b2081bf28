"""Every statement that changes a work item's state, lease or fence.

    ready --acquire--> leased --complete--> completed
      ^                  |--requeue / triage(requeue)--> ready
      |                  '--triage(quarantine)--> quarantined
      '--(expired lease: the next acquire takes it over, fence + 1)
    acquire past the budget -> quarantined (+ dead letter)
    operator replay: quarantined -> ready;  discard: any but completed -> cancelled
    operator cancel: ready, leased or quarantined -> cancelled (the holder's next
    heartbeat or complete is refused with item-cancelled)
    retention: completed or cancelled longer than the tenant's retention -> deleted,
    with its ledger
    a paused queue (`queues.paused_at`): acquire hands out nothing

Each acquire increments `fence`. A holder presents the fence it was given, and
every holder operation checks state, holder, fence and expiry in the same
statement that changes the row (`_HOLDER_GUARD`, written once). Each function
takes the caller's connection and appends its ledger events in the same statement
(`_ledger`: the one INSERT into item_events), and counts finished work on the queue's
counters (`_count_cte`). Every function but `acquire` runs in
the caller's transaction and never commits; `acquire` owns its transactions (see
there). Time is `statement_timestamp()`: the database clock, fixed for one statement.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from psycopg.types.json import Jsonb

from queue_server import errors
from queue_server.models import ItemState
from queue_server.store.channels import READY_CHANNEL
from queue_server.store.outbox import outbox_cte
from queue_server.store.reads import FIRST_ITEM, queues_of
from queue_server.store.sql import Statements, fetch_all, fetch_one
from queue_server.store.types import Conn, Row

# Releases from the backlog are spread over this many rows per tenant.
RELEASE_SHARDS = 32

_SQL = Statements(__name__)


def _event(
    source: str,
    kind: str,
    actor: str,
    data: str,
    *,
    seq: str = "event_seq - 1",
    at: str = "updated_at",
) -> str:
    """One ledger row of `kind` per changed row of `source`, at the item's next seq."""
    return (
        f"SELECT tenant_id, item_id, {seq}, {at}, '{kind}', fence, {actor},\n"
        f"           {data}\n"
        f"    FROM {source}"
    )


def _ledger_insert(*events: str) -> str:
    """The INSERT of ledger rows, written once: every transition appends its events with it."""
    rows = "\n    UNION ALL\n    ".join(events)
    return f"INSERT INTO item_events (tenant_id, item_id, seq, at, kind, fence, actor, data)\n    {rows}"


def _ledger(*events: str) -> str:
    """`ev AS (...)`: the ledger rows, written by the statement whose change they record."""
    return f"ev AS (\n    {_ledger_insert(*events)}\n)"


def _dead_letter(source: str, reason: str) -> str:
    """`dead AS (...)`: an open item dead letter for every row of `source`."""
    return f"""dead AS (
    INSERT INTO dead_letters (tenant_id, kind, item_id, queue, reason, last_failure, created_at)
    SELECT tenant_id, 'item', item_id, queue, '{reason}', last_failure,
           statement_timestamp()
    FROM {source}
)"""


def _notify(source: str) -> str:
    """A FROM item that wakes the acquires waiting on the queue of `source`'s rows."""
    return f"(SELECT pg_notify('{READY_CHANNEL}', %(tenant)s || '/' || queue) FROM {source}) AS n"


# The holder's authority, checked by the statement that acts on it: the item is leased,
# to this worker, under the fence it presents, and the lease has not expired.
def _holder_guard(alias: str = "", fence: str = "%(fence)s") -> str:
    a = f"{alias}." if alias else ""
    return (
        f"{a}state = 'leased' AND {a}fence = {fence} AND {a}lease_holder = %(worker)s\n"
        f"      AND {a}lease_expires_at > statement_timestamp()"
    )


_HOLDER_GUARD = _holder_guard()


def _release_cte(source: str) -> str:
    """Rows of `source` left the backlog: count them on one shard of the tenant's releases."""
    return f"""release AS (
    INSERT INTO backlog_releases (tenant_id, shard, released)
    SELECT %(tenant)s, %(shard)s, count(*) FROM {source} HAVING count(*) > 0
    ON CONFLICT (tenant_id, shard)
    DO UPDATE SET released = backlog_releases.released + excluded.released
)"""


def _count_cte(source: str, **columns: str) -> str:
    """`counted AS (...)`: adds to the queue counters of `source`'s rows, on this statement's
    shard. Written after `release` in every statement, so the two row locks are always
    taken in one order, and in queue order (ORDER BY) when one statement counts several."""
    names = ", ".join(columns)
    updates = ",\n        ".join(f"{c} = queue_counters.{c} + excluded.{c}" for c in columns)
    return f"""counted AS (
    INSERT INTO queue_counters (tenant_id, queue, shard, {names})
    SELECT tenant_id, queue, %(shard)s, {", ".join(columns.values())}
    FROM {source} GROUP BY tenant_id, queue ORDER BY tenant_id, queue
    ON CONFLICT (tenant_id, queue, shard) DO UPDATE
    SET {updates}
)"""


def _shard() -> int:
    return random.randrange(RELEASE_SHARDS)


_ENQUEUED = _ledger(
    _event(
        "ins",
        "enqueued",
        "%(actor)s",
        "jsonb_build_object('queue', queue, 'payload', payload, 'priority', priority,\n"
        "                              'available_at', available_at,\n"
        "                              'max_acquisitions', max_acquisitions)",
        seq="0",
        at="created_at",
    )
)
_ENQUEUE = _SQL(
    "enqueue",
    f"""
WITH input AS (
    SELECT * FROM jsonb_to_recordset(%(items)s::jsonb)
        AS x(item_id uuid, payload jsonb, priority int, delay double precision,
             max_acquisitions int)
), ins AS (
    INSERT INTO work_items (tenant_id, item_id, queue, payload, priority, state,
                            available_at, max_acquisitions, event_seq,
                            created_at, updated_at)
    SELECT %(tenant)s, item_id, %(queue)s, coalesce(payload, 'null'::jsonb), priority, 'ready',
           statement_timestamp() + make_interval(secs => delay), max_acquisitions, 1,
           statement_timestamp(), statement_timestamp()
    FROM input
    RETURNING *
), {_ENQUEUED}, admitted AS (
    -- The caller holds this row's lock (the admission lock) already.
    UPDATE tenants SET admitted = admitted + (SELECT count(*) FROM ins)
    WHERE tenant_id = %(tenant)s
), {outbox_cte("item.enqueued", "ins")}
SELECT ins.* FROM ins, (SELECT pg_notify('{READY_CHANNEL}', %(tenant)s || '/' || %(queue)s)) AS n
""",
)


async def enqueue(
    conn: Conn, *, tenant: str, queue: str, items: list[dict[str, Any]], actor: str
) -> list[Row]:
    """(nothing) -> ready, one row per item; the caller holds the tenant's admission lock."""
    cur = await conn.execute(
        _ENQUEUE, {"items": Jsonb(items), "tenant": tenant, "queue": queue, "actor": actor}
    )
    rows = await cur.fetchall()
    order = {item["item_id"]: i for i, item in enumerate(items)}
    rows.sort(key=lambda row: order[str(row["item_id"])])
    return rows


# The queue's concurrency limit (the policy's local concurrency, one, unless a live spend
# approval raises it: %(base_limit)s) is enforced under an advisory lock on the queue.
# Exclusive: the acquire counts active leases exactly, with every earlier acquire
# committed. Shared (many acquires at once): only while the room left is at least
# `slack`, the most leases that acquires still in flight can hold (one per database
# connection, each at most 100 items); an exclusive acquire waits for them all.
_LOCK_QUEUE = _SQL(
    "lock_queue",
    "SELECT pg_advisory_xact_lock(hashtextextended(%(tenant)s || '/' || %(queue)s, 7))",
)
_LOCK_QUEUE_SHARED = _SQL(
    "lock_queue_shared",
    "SELECT pg_advisory_xact_lock_shared(hashtextextended(%(tenant)s || '/' || %(queue)s, 7))",
)
MAX_ITEMS_PER_ACQUIRE = 100


async def lock_queue(conn: Conn, *, tenant: str, queue: str) -> None:
    """The queue's lock, exclusively, until the transaction ends: every acquire in flight
    has committed, and every later one reads what this transaction commits (a pause)."""
    await conn.execute(_LOCK_QUEUE, {"tenant": tenant, "queue": queue})


_ACQUIRED = _ledger(
    # A lease that ran to its deadline is recorded before its takeover (or quarantine).
    "SELECT o.tenant_id, o.item_id, o.event_seq - 2, o.updated_at, 'deadline_exceeded',\n"
    "           o.overdue_fence, 'server',\n"
    "           jsonb_build_object('lease_holder', o.holder, 'lease_deadline_at', o.deadline_at)\n"
    "    FROM (SELECT l.*, l.fence - 1 AS overdue_fence, d.holder, d.deadline_at\n"
    "          FROM leased l JOIN overdue d USING (item_id)\n"
    "          UNION ALL\n"
    "          SELECT q.*, q.fence AS overdue_fence, d.holder, d.deadline_at\n"
    "          FROM quarantined q JOIN overdue d USING (item_id)) AS o",
    _event(
        "leased",
        "acquired",
        "%(worker)s",
        "jsonb_build_object('lease_holder', lease_holder,\n"
        "                              'lease_expires_at', lease_expires_at,\n"
        "                              'lease_deadline_at', lease_deadline_at,\n"
        "                              'acquisition_count', acquisition_count)",
    ),
    _event(
        "quarantined",
        "quarantined",
        "'server'",
        "jsonb_build_object('reason', 'acquisition budget exhausted')",
    ),
)

# Runs after the lock in its own statement, so its snapshot sees every lease
# committed by the acquires that held the lock exclusively before us.
# A lease lives at most %(deadline)s from this acquisition (`lease_deadline_at`);
# its expiry never passes that instant (a CHECK constraint holds it).
_ACQUIRE = _SQL(
    "acquire",
    f"""
WITH counts AS (
    SELECT coalesce((SELECT max(max_concurrency) FROM spend_approvals
                     WHERE tenant_id = %(tenant)s AND queue = %(queue)s
                       AND expires_at > statement_timestamp()), %(base_limit)s)
           - (SELECT count(*) FROM work_items
              WHERE tenant_id = %(tenant)s AND queue = %(queue)s AND state = 'leased'
                AND lease_expires_at > statement_timestamp()) AS free,
           -- A paused queue hands out nothing; pause takes this queue's lock exclusively.
           EXISTS (SELECT 1 FROM queues WHERE tenant_id = %(tenant)s AND queue = %(queue)s
                   AND paused_at IS NOT NULL) AS paused
), room AS (
    SELECT CASE WHEN contended OR paused THEN 0
                ELSE greatest(0, least(%(max_items)s, free)) END AS n,
           contended
    FROM (SELECT free, paused,
                 NOT paused AND %(shared)s AND free < %(slack)s + %(max_items)s AS contended
          FROM counts) AS c
), expired AS (
    -- SKIP LOCKED: a row locked by a holder operation in flight is not ours to take.
    SELECT item_id, 0 AS src, 0 AS priority, lease_expires_at AS since,
           lease_expires_at >= lease_deadline_at AS at_deadline, lease_holder AS holder,
           lease_deadline_at AS deadline_at
    FROM work_items
    WHERE tenant_id = %(tenant)s AND queue = %(queue)s AND state = 'leased'
      AND lease_expires_at <= statement_timestamp()
    ORDER BY lease_expires_at
    LIMIT (SELECT n FROM room)
    FOR UPDATE SKIP LOCKED
), due AS (
    SELECT item_id, 1 AS src, priority, available_at AS since
    FROM work_items
    WHERE tenant_id = %(tenant)s AND queue = %(queue)s AND state = 'ready'
      AND available_at <= statement_timestamp()
    ORDER BY priority DESC, available_at, item_id
    LIMIT (SELECT n FROM room)
    FOR UPDATE SKIP LOCKED
), picked AS (
    SELECT item_id FROM (SELECT item_id, src, priority, since FROM expired
                         UNION ALL SELECT * FROM due) AS c
    ORDER BY src, priority DESC, since, item_id
    LIMIT (SELECT n FROM room)
), overdue AS (
    -- Picked leases that ran to their deadline: each gets a deadline_exceeded event.
    SELECT item_id, holder, deadline_at FROM expired
    WHERE at_deadline AND item_id = ANY(ARRAY(SELECT item_id FROM picked))
), leased AS (
    UPDATE work_items w
    SET state = 'leased', fence = w.fence + 1, acquisition_count = w.acquisition_count + 1,
        lease_holder = %(worker)s,
        lease_expires_at = statement_timestamp() + least(%(ttl)s, %(deadline)s),
        lease_deadline_at = statement_timestamp() + %(deadline)s,
        leased_at = statement_timestamp(), updated_at = statement_timestamp(),
        event_seq = w.event_seq + 1 + (w.item_id = ANY(ARRAY(SELECT item_id FROM overdue)))::int
    -- An array, not a join: the planner cannot tell how few rows `picked` has, and a
    -- join would hash the whole table; `= ANY(array)` probes the primary key per item.
    WHERE w.tenant_id = %(tenant)s AND w.item_id = ANY(ARRAY(SELECT item_id FROM picked))
      AND w.acquisition_count < w.max_acquisitions
    RETURNING w.*
), quarantined AS (
    UPDATE work_items w
    SET state = 'quarantined', lease_holder = NULL, lease_expires_at = NULL,
        updated_at = statement_timestamp(),
        event_seq = w.event_seq + 1 + (w.item_id = ANY(ARRAY(SELECT item_id FROM overdue)))::int
    -- An array, not a join: the planner cannot tell how few rows `picked` has, and a
    -- join would hash the whole table; `= ANY(array)` probes the primary key per item.
    WHERE w.tenant_id = %(tenant)s AND w.item_id = ANY(ARRAY(SELECT item_id FROM picked))
      AND w.acquisition_count >= w.max_acquisitions
    RETURNING w.*
), {_dead_letter("quarantined", "acquisition budget exhausted")}, {_ACQUIRED}, {_release_cte("quarantined")},
{_count_cte("quarantined", quarantined="count(*)")}, {outbox_cte("item.quarantined", "quarantined")}
SELECT true AS leased, * FROM leased
UNION ALL
SELECT false AS leased, * FROM quarantined
UNION ALL
-- Under the shared lock with little room left: nothing leased, retry exclusively.
SELECT NULL AS leased, w.* FROM (SELECT 1) AS one LEFT JOIN work_items w ON false
WHERE (SELECT contended FROM room)
""",
)


@dataclass(frozen=True, slots=True)
class Acquired:
    leased: list[Row]  # in acquire order
    quarantined: list[Row]
    # The shared lock was tried and the room was too small for it: near the limit.
    contended: bool


async def acquire(
    conn: Conn,
    *,
    tenant: str,
    queue: str,
    worker: str,
    ttl: timedelta,
    deadline: timedelta,
    max_items: int,
    base_limit: int = 1,
    slack: int | None = None,
) -> Acquired:
    """ready (due) or leased (expired) -> leased, fence + 1; past the budget -> quarantined.

    The lease expires after `ttl` and lives at most `deadline` from now: no
    heartbeat extends it past that instant. A taken-over lease that ran to its
    deadline is ledgered `deadline_exceeded` before its `acquired` (or `quarantined`).

    The spend-gated concurrency limit holds when many acquires race: see the queue
    lock above. With `slack` (the most leases in-flight acquires can hold), the
    acquire first tries the shared lock; without it, or when the room is smaller
    than the slack, it takes the lock exclusively. This transition owns its
    transactions: the lock, the acquire and the COMMIT are sent together in
    pipeline mode, so the lock is held only while PostgreSQL works, never while the
    event loop is busy with other requests. `conn` must not be in a transaction.
    """
    contended = False
    for shared in (True, False) if slack is not None else (False,):
        params = {
            "tenant": tenant,
            "queue": queue,
            "worker": worker,
            "ttl": ttl,
            "deadline": deadline,
            "base_limit": base_limit,
            "max_items": max_items,
            "shard": _shard(),
            "shared": shared,
            "slack": slack or 0,
        }
        async with conn.pipeline(), conn.transaction():
            await conn.execute(_LOCK_QUEUE_SHARED if shared else _LOCK_QUEUE, params)
            cur = await conn.execute(_ACQUIRE, params)
        rows = await cur.fetchall()
        if not any(row["leased"] is None for row in rows):
            break
        # The shared attempt found too little room; the exclusive one follows.
        contended = True
    leased: list[Row] = []
    quarantined: list[Row] = []
    for row in rows:
        (leased if row.pop("leased") else quarantined).append(row)
    leased.sort(key=lambda row: (-row["priority"], row["available_at"], str(row["item_id"])))
    return Acquired(leased=leased, quarantined=quarantined, contended=contended)


_RELEASED = _ledger(
    _event(
        "upd",
        "released",
        "'server'",
        "jsonb_build_object('reason', 'the client left before the lease was sent',\n"
        "                              'acquisition_count', acquisition_count,\n"
        "                              'available_at', available_at)",
    )
)
_RELEASE_UNSENT = _SQL(
    "release_unsent",
    f"""
WITH input AS (
    SELECT * FROM jsonb_to_recordset(%(leases)s::jsonb) AS x(item_id uuid, fence bigint)
), upd AS (
    UPDATE work_items w
    SET state = 'ready', available_at = statement_timestamp(), lease_holder = NULL,
        lease_expires_at = NULL, acquisition_count = w.acquisition_count - 1,
        updated_at = statement_timestamp(), event_seq = w.event_seq + 1
    FROM input i
    WHERE w.tenant_id = %(tenant)s AND w.item_id = ANY(%(ids)s::uuid[]) AND w.item_id = i.item_id
      AND w.state = 'leased' AND w.fence = i.fence AND w.lease_holder = %(worker)s
    RETURNING w.*
), {_RELEASED}
SELECT upd.item_id FROM upd, (SELECT pg_notify('{READY_CHANNEL}', %(tenant)s || '/' || queue)
                               FROM upd LIMIT 1) AS n
""",
)


async def release_unsent(conn: Conn, *, tenant: str, worker: str, leases: list[Row]) -> int:
    """leased -> ready: leases whose client left before they were sent never count.

    The fence keeps its new value (the next acquire raises it again); the
    acquisition is not charged to the budget. Returns how many were released.
    """
    entries = [{"item_id": str(row["item_id"]), "fence": row["fence"]} for row in leases]
    cur = await conn.execute(
        _RELEASE_UNSENT,
        {
            "leases": Jsonb(entries),
            "ids": [entry["item_id"] for entry in entries],
            "tenant": tenant,
            "worker": worker,
        },
    )
    return len(await cur.fetchall())


def _holder_update(
    name: str,
    assignments: str,
    kind: str,
    data_sql: str,
    *,
    notify: bool = False,
    event: str | None = None,
    release: bool = False,
    dead_letter: str | None = None,
    counts: dict[str, str] | None = None,
) -> str:
    """A holder operation, registered as `name`: one guarded UPDATE plus its ledger row (and
    a dead letter with `dead_letter`, outbox rows of `event`; with `release`, the item
    leaves the backlog; `counts` adds to the queue's counters), all in one statement."""
    extra = f", {_dead_letter('upd', dead_letter)}" if dead_letter else ""
    extra += f", {outbox_cte(event, 'upd')}" if event else ""
    extra += f", {_release_cte('upd')}" if release else ""
    extra += f", {_count_cte('upd', **counts)}" if counts else ""
    tail = f", {_notify('upd')}" if notify else ""
    ledger = _ledger(_event("upd", kind, "%(worker)s", data_sql))
    return _SQL(
        name,
        f"""
WITH upd AS (
    UPDATE work_items
    SET {assignments}, updated_at = statement_timestamp(), event_seq = event_seq + 1
    WHERE tenant_id = %(tenant)s AND item_id = %(item_id)s
      AND {_HOLDER_GUARD}
    RETURNING *
), {ledger}{extra}
SELECT upd.* FROM upd{tail}
""",
    )


# Never past the lease's deadline: once there, the lease has expired for good and the
# holder guard refuses every holder operation (explain_rejection: lease-deadline-exceeded).
_HEARTBEAT = _holder_update(
    "heartbeat",
    "lease_expires_at = least(statement_timestamp() + %(ttl)s, lease_deadline_at)",
    "heartbeat",
    "jsonb_build_object('lease_expires_at', lease_expires_at)",
)
_COMPLETE = _holder_update(
    "complete",
    "state = 'completed', result = %(result)s, lease_holder = NULL, lease_expires_at = NULL",
    "completed",
    "jsonb_build_object('result', result)",
    event="item.completed",
    release=True,
    counts={"completed": "count(*)"},
)
_REQUEUE = _holder_update(
    "requeue",
    "state = 'ready', available_at = statement_timestamp() + make_interval(secs => %(delay)s),"
    " lease_holder = NULL, lease_expires_at = NULL",
    "requeued",
    "jsonb_build_object('reason', %(reason)s::text, 'available_at', available_at)",
    notify=True,
    event="item.requeued",
)
_TRIAGE_REQUEUE = _holder_update(
    "triage_requeue",
    "state = 'ready', available_at = statement_timestamp() + make_interval(secs => %(delay)s),"
    " last_failure = %(failure)s, lease_holder = NULL, lease_expires_at = NULL",
    "triaged",
    "jsonb_build_object('decision', 'requeue', 'failure', last_failure,"
    " 'available_at', available_at)",
    notify=True,
    event="item.requeued",
    counts={"failed": "count(*)"},
)
_TRIAGE_QUARANTINE = _holder_update(
    "triage_quarantine",
    "state = 'quarantined', last_failure = %(failure)s, lease_holder = NULL,"
    " lease_expires_at = NULL",
    "triaged",
    "jsonb_build_object('decision', 'quarantine', 'failure', last_failure)",
    event="item.quarantined",
    release=True,
    dead_letter="quarantined by triage",
    counts={"failed": "count(*)", "quarantined": "count(*)"},
)


def _holder_params(tenant: str, item_id: str, worker: str, fence: int) -> dict[str, Any]:
    return {
        "tenant": tenant,
        "item_id": item_id,
        "worker": worker,
        "fence": fence,
        "shard": _shard(),
    }


async def heartbeat(
    conn: Conn, *, tenant: str, item_id: str, worker: str, fence: int, ttl: timedelta
) -> Row | None:
    """leased -> leased: the holder, with its fence, extends a lease that has not expired,
    up to the lease's deadline and never past it."""
    return await fetch_one(
        conn, _HEARTBEAT, {**_holder_params(tenant, item_id, worker, fence), "ttl": ttl}
    )


async def complete(
    conn: Conn, *, tenant: str, item_id: str, worker: str, fence: int, result: Any
) -> Row | None:
    """leased -> completed: the holder, with its fence, on an unexpired lease."""
    params = {**_holder_params(tenant, item_id, worker, fence), "result": Jsonb(result)}
    return await fetch_one(conn, _COMPLETE, params)


async def requeue(
    conn: Conn,
    *,
    tenant: str,
    item_id: str,
    worker: str,
    fence: int,
    reason: str,
    delay: float = 0.0,
) -> Row | None:
    """leased -> ready, due after `delay` seconds: the holder gives the item back; the next
    acquire raises the fence."""
    params = {**_holder_params(tenant, item_id, worker, fence), "reason": reason, "delay": delay}
    return await fetch_one(conn, _REQUEUE, params)


async def triage(
    conn: Conn,
    *,
    tenant: str,
    item_id: str,
    worker: str,
    fence: int,
    failure: dict[str, Any],
    quarantine: bool,
    delay: float = 0.0,
) -> Row | None:
    """leased -> ready after `delay` (decision requeue) or quarantined (+ dead letter),
    failure recorded."""
    params = {
        **_holder_params(tenant, item_id, worker, fence),
        "failure": Jsonb(failure),
        "delay": delay,
    }
    return await fetch_one(conn, _TRIAGE_QUARANTINE if quarantine else _TRIAGE_REQUEUE, params)


_TRIAGE_REJECTED_EVENT = _ledger_insert(
    _event(
        "upd",
        "triage_rejected",
        "%(worker)s",
        "jsonb_build_object('failure', %(failure)s::jsonb, 'presented_fence', %(fence)s::bigint,\n"
        "                          'reason', %(reason)s::text)",
        at="statement_timestamp()",
    )
)
_TRIAGE_REJECTED = _SQL(
    "record_triage_rejected",
    f"""
WITH upd AS (
    UPDATE work_items SET event_seq = event_seq + 1
    WHERE tenant_id = %(tenant)s AND item_id = %(item_id)s
    RETURNING tenant_id, item_id, event_seq, fence
)
{_TRIAGE_REJECTED_EVENT}
""",
)


async def record_triage_rejected(
    conn: Conn,
    *,
    tenant: str,
    item_id: str,
    worker: str,
    fence: int,
    failure: dict[str, Any],
    reason: str,
) -> None:
    """No state change: a refused triage still leaves the reported failure in the ledger."""
    params = {
        **_holder_params(tenant, item_id, worker, fence),
        "failure": Jsonb(failure),
        "reason": reason,
    }
    await conn.execute(_TRIAGE_REJECTED, params)


_SCHEDULED_EVENT = _ledger_insert(
    _event(
        "upd",
        "scheduled",
        "%(actor)s",
        "jsonb_build_object('schedule', %(schedule)s::text, 'schedule_id', %(schedule_id)s::text,\n"
        "                          'tick_at', %(tick_at)s::timestamptz,\n"
        "                          'trigger', %(trigger)s::boolean)",
        at="statement_timestamp()",
    )
)
_SCHEDULED = _SQL(
    "record_scheduled",
    f"""
WITH upd AS (
    UPDATE work_items SET event_seq = event_seq + 1
    WHERE tenant_id = %(tenant)s AND item_id = %(item_id)s
    RETURNING tenant_id, item_id, event_seq, fence
)
{_SCHEDULED_EVENT}
""",
)


async def record_scheduled(
    conn: Conn,
    *,
    tenant: str,
    item_id: str,
    actor: str,
    schedule: str,
    schedule_id: str,
    tick_at: Any,
    trigger: bool,
) -> None:
    """No state change: the item just enqueued is a schedule's fire of the tick `tick_at`
    (or its manual trigger); the ledger says which."""
    params = {
        "tenant": tenant,
        "item_id": item_id,
        "actor": actor,
        "schedule": schedule,
        "schedule_id": schedule_id,
        "tick_at": tick_at,
        "trigger": trigger,
    }
    await conn.execute(_SCHEDULED, params)


_EXPLAIN = _SQL(
    "explain_rejections",
    """
SELECT item_id::text AS item_id, state, fence, lease_holder, lease_expires_at,
       lease_deadline_at, lease_expires_at <= statement_timestamp() AS expired,
       -- Who cancelled a cancelled item, when, and whose lease it ended.
       CASE WHEN state = 'cancelled' THEN
           (SELECT jsonb_build_object('actor', e.actor, 'at', e.at, 'data', e.data)
            FROM item_events e
            WHERE e.tenant_id = w.tenant_id AND e.item_id = w.item_id AND e.kind = 'cancelled'
            ORDER BY e.seq DESC LIMIT 1)
       END AS cancellation
FROM work_items w WHERE tenant_id = %(tenant)s AND item_id = ANY(%(item_ids)s::uuid[])
""",
)


def _refusal(row: Row | None, *, item_id: str, worker: str, fence: int) -> errors.QueueServerError:
    if row is None:
        return errors.ItemNotFoundError(item_id=item_id)
    cancelled = row["cancellation"] or {}
    if cancelled.get("data", {}).get("lease_holder") == worker and fence == row["fence"]:
        # This holder's own lease was ended by an operator's cancel.
        return errors.ItemCancelledError(
            item_id=item_id,
            cancelled_by=cancelled["actor"],
            cancelled_at=cancelled["at"],
            reason=cancelled["data"].get("reason", ""),
        )
    if row["state"] != ItemState.LEASED:
        return errors.ItemNotLeasedError(
            f"The item is {row['state']}, not leased.", item_id=item_id, state=row["state"]
        )
    if fence < row["fence"]:
        return errors.StaleFenceError(item_id=item_id, current_fence=row["fence"])
    if fence > row["fence"]:
        # stale-fence is a lower fence (a newer lease superseded it); a higher one was never
        # handed out (README.md, the refusal codes after the guarantees).
        return errors.FenceAheadError(item_id=item_id, current_fence=row["fence"])
    if row["lease_holder"] != worker:
        return errors.NotLeaseHolderError(item_id=item_id)
    if row["expired"] and row["lease_expires_at"] >= row["lease_deadline_at"]:
        return errors.LeaseDeadlineExceededError(
            item_id=item_id, lease_deadline_at=row["lease_deadline_at"].isoformat()
        )
    if row["expired"]:
        return errors.LeaseExpiredError(
            item_id=item_id, expired_at=row["lease_expires_at"].isoformat()
        )
    # The row changed between the guarded update and this read.
    return errors.StaleFenceError(item_id=item_id, current_fence=row["fence"])


async def explain_rejections(
    conn: Conn, *, tenant: str, worker: str, fences: dict[str, int]
) -> dict[str, errors.QueueServerError]:
    """Why guarded holder operations changed nothing: the precise refusal of each item."""
    cur = await conn.execute(_EXPLAIN, {"tenant": tenant, "item_ids": list(fences)})
    rows = {row["item_id"]: row for row in await cur.fetchall()}
    return {
        item_id: _refusal(rows.get(item_id), item_id=item_id, worker=worker, fence=fence)
        for item_id, fence in fences.items()
    }


async def explain_rejection(
    conn: Conn, *, tenant: str, item_id: str, worker: str, fence: int
) -> errors.QueueServerError:
    """Why a guarded holder operation changed nothing: the precise refusal."""
    refusals = await explain_rejections(conn, tenant=tenant, worker=worker, fences={item_id: fence})
    return refusals[item_id]


_HEARTBEAT_MANY = _SQL(
    "heartbeat_many",
    f"""
WITH input AS (
    SELECT * FROM jsonb_to_recordset(%(leases)s::jsonb) AS x(item_id uuid, fence bigint)
), upd AS (
    UPDATE work_items w
    SET lease_expires_at = least(statement_timestamp() + %(ttl)s, w.lease_deadline_at),
        updated_at = statement_timestamp(), event_seq = w.event_seq + 1
    FROM input i
    WHERE w.tenant_id = %(tenant)s AND w.item_id = ANY(%(ids)s::uuid[]) AND w.item_id = i.item_id
      AND {_holder_guard("w", fence="i.fence")}
    RETURNING w.*
), {_ledger(_event("upd", "heartbeat", "%(worker)s", "jsonb_build_object('lease_expires_at', lease_expires_at)"))}
SELECT item_id::text AS item_id, lease_expires_at, lease_deadline_at FROM upd
""",
)


async def heartbeat_many(
    conn: Conn, *, tenant: str, worker: str, leases: list[dict[str, Any]], ttl: timedelta
) -> dict[str, Row]:
    """leased -> leased for each lease whose own fence, holder and expiry pass the guard,
    each up to its lease's deadline and never past it (as `heartbeat`).

    Returns the extended leases by item id; the others changed nothing.
    """
    cur = await conn.execute(
        _HEARTBEAT_MANY,
        {
            "leases": Jsonb(leases),
            "ids": [entry["item_id"] for entry in leases],
            "tenant": tenant,
            "worker": worker,
            "ttl": ttl,
        },
    )
    return {row["item_id"]: row for row in await cur.fetchall()}


_COMPLETE_MANY = _SQL(
    "complete_many",
    f"""
WITH input AS (
    SELECT * FROM jsonb_to_recordset(%(items)s::jsonb) AS x(item_id uuid, fence bigint, result jsonb)
), upd AS (
    UPDATE work_items w
    SET state = 'completed', result = coalesce(i.result, 'null'::jsonb), lease_holder = NULL,
        lease_expires_at = NULL, updated_at = statement_timestamp(), event_seq = w.event_seq + 1
    FROM input i
    WHERE w.tenant_id = %(tenant)s AND w.item_id = ANY(%(ids)s::uuid[]) AND w.item_id = i.item_id
      AND {_holder_guard("w", fence="i.fence")}
    RETURNING w.*
), {_ledger(_event("upd", "completed", "%(worker)s", "jsonb_build_object('result', result)"))},
{_release_cte("upd")}, {_count_cte("upd", completed="count(*)")}, {outbox_cte("item.completed", "upd")}
SELECT upd.* FROM upd
""",
)


async def complete_many(
    conn: Conn, *, tenant: str, worker: str, completions: list[dict[str, Any]]
) -> dict[str, Row]:
    """leased -> completed for each item whose own fence, holder and expiry pass the guard.

    Returns the completed rows by item id; the others changed nothing.
    """
    cur = await conn.execute(
        _COMPLETE_MANY,
        {
            "items": Jsonb(completions),
            "ids": [entry["item_id"] for entry in completions],
            "tenant": tenant,
            "worker": worker,
            "shard": _shard(),
        },
    )
    return {str(row["item_id"]): row for row in await cur.fetchall()}


_REPLAYED = _ledger(
    _event(
        "upd",
        "replayed",
        "%(actor)s",
        "jsonb_build_object('dead_letter_id', %(dead_letter_id)s::text,\n"
        "                              'max_acquisitions', max_acquisitions,\n"
        "                              'available_at', available_at)",
    )
)
_REPLAY = _SQL(
    "replay",
    f"""
WITH dl AS (
    -- The item's state is part of the guard: a refused replay must not close the letter.
    UPDATE dead_letters d SET closed_at = statement_timestamp(), resolution = 'replayed'
    FROM work_items i
    WHERE d.tenant_id = %(tenant)s AND d.dead_letter_id = %(dead_letter_id)s
      AND d.kind = 'item' AND d.closed_at IS NULL
      AND i.tenant_id = d.tenant_id AND i.item_id = d.item_id AND i.state = 'quarantined'
    RETURNING d.item_id
), upd AS (
    UPDATE work_items w
    SET state = 'ready', available_at = statement_timestamp(), acquisition_count = 0,
        max_acquisitions = coalesce(%(max_acquisitions)s, w.max_acquisitions),
        updated_at = statement_timestamp(), event_seq = w.event_seq + 1
    FROM dl
    WHERE w.tenant_id = %(tenant)s AND w.item_id = dl.item_id AND w.state = 'quarantined'
    RETURNING w.*
), {_REPLAYED}, admitted AS (
    -- Back in the backlog: the caller holds the admission lock and checked the cap.
    UPDATE tenants SET admitted = admitted + (SELECT count(*) FROM upd)
    WHERE tenant_id = %(tenant)s AND EXISTS (SELECT 1 FROM upd)
), {outbox_cte("item.replayed", "upd")}
SELECT upd.* FROM upd, {_notify("upd")}
""",
)


async def replay(
    conn: Conn, *, tenant: str, dead_letter_id: str, max_acquisitions: int | None, actor: str
) -> Row | None:
    """quarantined -> ready with a renewed budget; the dead letter is closed. Fence unchanged.

    The item re-enters the backlog: the caller holds the tenant's admission lock
    (`tenants.admit`) and has checked the cap, as for an enqueue.
    """
    params = {
        "tenant": tenant,
        "dead_letter_id": dead_letter_id,
        "max_acquisitions": max_acquisitions,
        "actor": actor,
    }
    return await fetch_one(conn, _REPLAY, params)


_CANCELLED = _ledger(
    _event(
        "upd",
        "cancelled",
        "%(actor)s",
        "jsonb_build_object('dead_letter_id', %(dead_letter_id)s::text,\n"
        "                              'reason', %(reason)s::text)",
    )
)
_DISCARD = _SQL(
    "discard",
    f"""
WITH dl AS (
    UPDATE dead_letters d SET closed_at = statement_timestamp(), resolution = 'discarded'
    FROM work_items i
    WHERE d.tenant_id = %(tenant)s AND d.dead_letter_id = %(dead_letter_id)s
      AND d.kind = 'item' AND d.closed_at IS NULL
      AND i.tenant_id = d.tenant_id AND i.item_id = d.item_id AND i.state <> 'completed'
    RETURNING d.item_id
), upd AS (
    UPDATE work_items w
    SET state = 'cancelled', lease_holder = NULL, lease_expires_at = NULL,
        updated_at = statement_timestamp(), event_seq = w.event_seq + 1
    FROM dl
    WHERE w.tenant_id = %(tenant)s AND w.item_id = dl.item_id AND w.state <> 'completed'
    RETURNING w.*
), {_CANCELLED}, {_count_cte("upd", cancelled="count(*)")}, {outbox_cte("item.cancelled", "upd")}
SELECT upd.* FROM upd
""",
)


async def discard(
    conn: Conn, *, tenant: str, dead_letter_id: str, reason: str, actor: str
) -> Row | None:
    """quarantined (any state but completed) -> cancelled; the dead letter is closed."""
    params = {
        "tenant": tenant,
        "dead_letter_id": dead_letter_id,
        "reason": reason,
        "actor": actor,
        "shard": _shard(),
    }
    return await fetch_one(conn, _DISCARD, params)


_CANCELLED_BY_OPERATOR = _ledger(
    _event(
        "upd",
        "cancelled",
        "%(actor)s",
        "jsonb_build_object('reason', %(reason)s::text, 'previous_state', previous_state,\n"
        "                              'lease_holder', previous_holder)",
    )
)
_CANCEL = _SQL(
    "cancel",
    f"""
WITH prev AS (
    -- Locked in id order (two bulk cancels never wait on each other in a cycle); a row
    -- that a holder changed meanwhile is read again after its commit, and left out
    -- when it is no longer ready, leased or quarantined.
    SELECT item_id, state AS previous_state, lease_holder AS previous_holder
    FROM work_items
    WHERE tenant_id = %(tenant)s AND item_id = ANY(%(item_ids)s::uuid[])
      AND state IN ('ready', 'leased', 'quarantined')
      AND (%(state)s::item_state IS NULL OR state = %(state)s::item_state)
    ORDER BY item_id
    FOR UPDATE
), upd AS (
    UPDATE work_items w
    SET state = 'cancelled', lease_holder = NULL, lease_expires_at = NULL,
        updated_at = statement_timestamp(), event_seq = w.event_seq + 1
    FROM prev
    WHERE w.tenant_id = %(tenant)s AND w.item_id = ANY(%(item_ids)s::uuid[])
      AND w.item_id = prev.item_id
    RETURNING w.*, prev.previous_state, prev.previous_holder
), {_CANCELLED_BY_OPERATOR}, dl AS (
    -- A quarantined item's open dead letter is resolved with it.
    UPDATE dead_letters d SET closed_at = statement_timestamp(), resolution = 'cancelled'
    WHERE d.tenant_id = %(tenant)s AND d.kind = 'item' AND d.closed_at IS NULL
      AND d.item_id IN (SELECT item_id FROM upd WHERE previous_state = 'quarantined')
), {_release_cte("upd WHERE previous_state <> 'quarantined'")},
{_count_cte("upd", cancelled="count(*)")}, {outbox_cte("item.cancelled", "upd")}
SELECT upd.* FROM upd ORDER BY upd.item_id
""",
)


async def cancel(
    conn: Conn,
    *,
    tenant: str,
    item_ids: list[str],
    reason: str,
    actor: str,
    state: str | None = None,
) -> list[Row]:
    """ready, leased or quarantined (and `state`, when given) -> cancelled, by an operator.

    A leased item's lease ends here: its holder's next heartbeat or complete is refused
    with item-cancelled. Ready and leased items leave the backlog; a quarantined item's
    dead letter is closed. Returns the cancelled rows (the others changed nothing).
    """
    params = {
        "tenant": tenant,
        "item_ids": item_ids,
        "state": state,
        "reason": reason,
        "actor": actor,
        "shard": _shard(),
    }
    cur = await conn.execute(_CANCEL, params)
    return await cur.fetchall()


# -- retention: finished items leave with their ledgers ----------------------------------

_FINISHED_QUEUES = _SQL(
    "finished_queues",
    f"""
WITH RECURSIVE {queues_of("q_completed", "'completed'")}, {queues_of("q_cancelled", "'cancelled'")}
SELECT 'completed' AS state, queue FROM q_completed WHERE queue IS NOT NULL
UNION ALL
SELECT 'cancelled' AS state, queue FROM q_cancelled WHERE queue IS NOT NULL
""",
)


async def finished_queues(conn: Conn, *, tenant: str) -> list[tuple[str, str]]:
    """The (state, queue) pairs of the tenant that hold completed or cancelled items."""
    rows = await fetch_all(conn, _FINISHED_QUEUES, {"tenant": tenant})
    return [(row["state"], row["queue"]) for row in rows]


# One (state, queue) range of the list index, from a position on, at most a batch: items
# created before the cutoff are candidates; those that also finished before it go.
_PURGE_FINISHED = _SQL(
    "purge_finished",
    f"""
WITH cutoff AS (
    SELECT statement_timestamp() - retention AS before FROM tenants WHERE tenant_id = %(tenant)s
), scanned AS (
    SELECT w.item_id, w.created_at, w.updated_at FROM work_items w
    WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = %(state)s::item_state
      AND w.queue = %(queue)s
      AND (w.created_at, w.item_id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)
      AND w.created_at < (SELECT before FROM cutoff)
    ORDER BY w.created_at, w.item_id
    LIMIT %(limit)s
), gone AS (
    DELETE FROM work_items w
    WHERE w.tenant_id = %(tenant)s
      AND w.item_id = ANY(ARRAY(SELECT item_id FROM scanned
                                WHERE updated_at < (SELECT before FROM cutoff)))
      AND w.state IN ('completed', 'cancelled') AND w.updated_at < (SELECT before FROM cutoff)
    RETURNING w.tenant_id, w.item_id, w.queue, w.state
), ledger AS (
    DELETE FROM item_events e
    WHERE e.tenant_id = %(tenant)s AND e.item_id = ANY(ARRAY(SELECT item_id FROM gone))
), {
        _count_cte(
            "gone",
            purged_completed="count(*) FILTER (WHERE state = 'completed')",
            purged_cancelled="count(*) FILTER (WHERE state = 'cancelled')",
        )
    }
SELECT (SELECT count(*) FROM scanned) AS scanned, (SELECT count(*) FROM gone) AS deleted,
       last.created_at AS last_at, last.item_id::text AS last_id
FROM (SELECT 1) AS one
LEFT JOIN (SELECT created_at, item_id FROM scanned
           ORDER BY created_at DESC, item_id DESC LIMIT 1) AS last ON true
""",
)


@dataclass(frozen=True, slots=True)
class Purged:
    scanned: int
    deleted: int
    # Where the next batch of the same (state, queue) starts; None when none was scanned.
    last: tuple[str, str] | None


async def purge_finished(
    conn: Conn,
    *,
    tenant: str,
    state: str,
    queue: str,
    after: tuple[str, str] | None,
    limit: int,
) -> Purged:
    """completed or cancelled, finished longer than the tenant's retention ago -> deleted,
    with every ledger event of the item; counted as purged on the queue's counters.

    Reads at most `limit` entries of the list index after `after`; items created before
    the cutoff but finished after it are passed over (a later round takes them).
    """
    params = {
        "tenant": tenant,
        "state": state,
        "queue": queue,
        "after_at": after[0] if after else "-infinity",
        "after_id": after[1] if after else FIRST_ITEM,
        "limit": limit,
        "shard": _shard(),
    }
    row = await fetch_one(conn, _PURGE_FINISHED, params)
    assert row is not None
    last = (row["last_at"].isoformat(), row["last_id"]) if row["last_id"] else None
    return Purged(scanned=int(row["scanned"]), deleted=int(row["deleted"]), last=last)
