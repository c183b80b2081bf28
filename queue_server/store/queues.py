"""Queues: pause and resume (with the queue's own ledger), and each queue's figures.

    (no row) or resumed --pause--> paused --resume--> resumed
    a paused queue: acquire hands out nothing (store/transitions.py reads `paused_at`)

The figures of a tenant's queues come from bounded reads only: the unfinished items
through their partial indexes, finished work from `queue_counters` (written by each
transition's own statement), and rates from `queue_samples` (two index probes per
queue). Nothing here scans finished history.
"""

from __future__ import annotations

from datetime import timedelta

from queue_server.store.channels import READY_CHANNEL
from queue_server.store.sql import Statements, fetch_all, fetch_one
from queue_server.store.types import Conn, Row

_SQL = Statements(__name__)


def _queue_event(kind: str) -> str:
    """`ev AS (...)`: the queue ledger row of the change in `q`."""
    return f"""ev AS (
    INSERT INTO queue_events (tenant_id, queue, seq, at, kind, actor, data)
    SELECT tenant_id, queue, event_seq - 1, updated_at, '{kind}', %(actor)s,
           jsonb_build_object('reason', %(reason)s::text)
    FROM q
)"""


# Already paused: nothing changes and nothing is recorded (the row is returned by `get`).
_PAUSE = _SQL(
    "pause",
    f"""
WITH q AS (
    INSERT INTO queues AS t (tenant_id, queue, paused_at, paused_by, pause_reason, event_seq,
                             updated_at)
    VALUES (%(tenant)s, %(queue)s, statement_timestamp(), %(actor)s, %(reason)s, 1,
            statement_timestamp())
    ON CONFLICT (tenant_id, queue) DO UPDATE
    SET paused_at = excluded.paused_at, paused_by = excluded.paused_by,
        pause_reason = excluded.pause_reason, event_seq = t.event_seq + 1,
        updated_at = excluded.updated_at
    WHERE t.paused_at IS NULL
    RETURNING *
), {_queue_event("paused")}
SELECT * FROM q
""",
)

# Not paused: nothing changes. Resumed: long-polling acquires of the queue wake up.
_RESUME = _SQL(
    "resume",
    f"""
WITH q AS (
    UPDATE queues
    SET paused_at = NULL, paused_by = NULL, pause_reason = NULL, event_seq = event_seq + 1,
        updated_at = statement_timestamp()
    WHERE tenant_id = %(tenant)s AND queue = %(queue)s AND paused_at IS NOT NULL
    RETURNING *
), {_queue_event("resumed")}
SELECT q.* FROM q, (SELECT pg_notify('{READY_CHANNEL}', %(tenant)s || '/' || %(queue)s)) AS n
""",
)


async def pause(conn: Conn, *, tenant: str, queue: str, actor: str, reason: str) -> Row | None:
    """resumed -> paused, ledgered; None when the queue was paused already.

    The caller holds the queue's lock (`transitions.lock_queue`), so no acquire that
    commits after this transaction hands anything out.
    """
    params = {"tenant": tenant, "queue": queue, "actor": actor, "reason": reason}
    return await fetch_one(conn, _PAUSE, params)


async def resume(conn: Conn, *, tenant: str, queue: str, actor: str, reason: str) -> Row | None:
    """paused -> resumed, ledgered, waking the queue's long polls; None when not paused."""
    params = {"tenant": tenant, "queue": queue, "actor": actor, "reason": reason}
    return await fetch_one(conn, _RESUME, params)


_EVENTS = _SQL(
    "events",
    """
SELECT seq, at, kind, actor, data FROM queue_events
WHERE tenant_id = %(tenant)s AND queue = %(queue)s ORDER BY seq DESC LIMIT %(limit)s
""",
)


async def events(conn: Conn, *, tenant: str, queue: str, limit: int) -> list[Row]:
    """The queue's latest ledger events (pause, resume), newest first."""
    return await fetch_all(conn, _EVENTS, {"tenant": tenant, "queue": queue, "limit": limit})


# Each state reads its own partial index (a branch per state: an IN list would be one
# scan of the table); finished history is not read. A lease is active while it has not
# expired; its age counts from its acquisition (`leased_at`).
_UNFINISHED = "\n    UNION ALL\n".join(
    f"""    SELECT tenant_id, queue, state, available_at, lease_expires_at, leased_at
    FROM work_items WHERE {{tenant}}state = '{state}'"""
    for state in ("ready", "leased", "quarantined")
)
_OPEN = f"""
SELECT tenant_id, queue,
       count(*) FILTER (WHERE state = 'ready') AS ready,
       count(*) FILTER (WHERE state = 'ready' AND available_at <= statement_timestamp()) AS due,
       count(*) FILTER (WHERE state = 'leased') AS leased,
       count(*) FILTER (WHERE state = 'leased' AND lease_expires_at > statement_timestamp())
           AS active_leases,
       count(*) FILTER (WHERE state = 'quarantined') AS quarantined,
       extract(epoch FROM statement_timestamp()
               - min(available_at) FILTER (WHERE state = 'ready'
                                           AND available_at <= statement_timestamp()))
           AS oldest_ready_age,
       extract(epoch FROM statement_timestamp()
               - min(leased_at) FILTER (WHERE state = 'leased'
                                        AND lease_expires_at > statement_timestamp()))
           AS oldest_lease_age
FROM (
{_UNFINISHED}
) AS w
GROUP BY tenant_id, queue
"""

# Completed and cancelled items now, and the totals that rates are taken from; with the
# totals as sampled a minute and an hour ago (the latest sample at or before then).
_FINISHED = """
WITH totals AS (
    SELECT tenant_id, queue,
           sum(completed)::bigint AS completions, sum(failed)::bigint AS failures,
           sum(quarantined)::bigint AS quarantines, sum(cancelled)::bigint AS cancellations,
           sum(completed - purged_completed)::bigint AS completed,
           sum(cancelled - purged_cancelled)::bigint AS cancelled
    FROM queue_counters
    {where}
    GROUP BY tenant_id, queue
)
SELECT t.*,
       t.completions - coalesce(m.completed, 0) AS completions_last_minute,
       t.failures - coalesce(m.failed, 0) AS failures_last_minute,
       t.completions - coalesce(h.completed, 0) AS completions_last_hour,
       t.failures - coalesce(h.failed, 0) AS failures_last_hour
FROM totals t
LEFT JOIN LATERAL (
    SELECT completed, failed FROM queue_samples s
    WHERE s.tenant_id = t.tenant_id AND s.queue = t.queue
      AND s.sampled_at <= statement_timestamp() - interval '1 minute'
    ORDER BY s.sampled_at DESC LIMIT 1
) m ON true
LEFT JOIN LATERAL (
    SELECT completed, failed FROM queue_samples s
    WHERE s.tenant_id = t.tenant_id AND s.queue = t.queue
      AND s.sampled_at <= statement_timestamp() - interval '1 hour'
    ORDER BY s.sampled_at DESC LIMIT 1
) h ON true
"""

_OPEN_COUNTS = _SQL("open_counts", _OPEN.format(tenant="tenant_id = %(tenant)s AND "))
_FINISHED_COUNTS = _SQL("finished_counts", _FINISHED.format(where="WHERE tenant_id = %(tenant)s"))
# The same over every tenant (the scrape of an admin or of the metrics listener).
_ALL_OPEN_COUNTS = _SQL("all_open_counts", _OPEN.format(tenant=""))
_ALL_FINISHED_COUNTS = _SQL("all_finished_counts", _FINISHED.format(where=""))
_ALL_SETTINGS = _SQL("all_settings", "SELECT * FROM queues ORDER BY tenant_id, queue")
_ALL_OPEN_DEAD_LETTERS = _SQL(
    "all_open_dead_letters",
    """
SELECT tenant_id, queue, count(*) AS n FROM dead_letters
WHERE closed_at IS NULL AND kind = 'item'
GROUP BY tenant_id, queue
""",
)
# Per watcher: deliveries waiting (the deliverer's partial index of pending rows) and dead
# ones (each has its open dead letter until an operator replays or discards it).
_ALL_WATCHER_DELIVERIES = _SQL(
    "all_watcher_deliveries",
    """
SELECT tenant_id, watcher_id::text AS watcher_id, 'pending' AS state, count(*) AS n
FROM outbox_deliveries WHERE state = 'pending'
GROUP BY tenant_id, watcher_id
UNION ALL
SELECT o.tenant_id, o.watcher_id::text, 'dead', count(*)
FROM dead_letters d
JOIN outbox_deliveries o ON o.tenant_id = d.tenant_id AND o.delivery_id = d.delivery_id
WHERE d.closed_at IS NULL AND d.kind = 'delivery' AND o.state = 'dead'
GROUP BY o.tenant_id, o.watcher_id
UNION ALL
SELECT tenant_id, watcher_id::text, 'watching', 0 FROM watchers
WHERE state IN ('active', 'paused')
""",
)
_SETTINGS = _SQL(
    "settings",
    "SELECT * FROM queues WHERE tenant_id = %(tenant)s ORDER BY queue",
)
_GET = _SQL("get", "SELECT * FROM queues WHERE tenant_id = %(tenant)s AND queue = %(queue)s")
_OPEN_DEAD_LETTERS = _SQL(
    "open_dead_letters",
    """
SELECT queue, count(*) AS n FROM dead_letters
WHERE tenant_id = %(tenant)s AND closed_at IS NULL AND kind = 'item'
GROUP BY queue
""",
)


async def open_counts(conn: Conn, *, tenant: str) -> list[Row]:
    """Per queue with unfinished items: ready, due, leased, active leases, quarantined, ages."""
    return await fetch_all(conn, _OPEN_COUNTS, {"tenant": tenant})


async def finished_counts(conn: Conn, *, tenant: str) -> list[Row]:
    """Per queue that ever finished work: completed and cancelled now, totals and rates."""
    return await fetch_all(conn, _FINISHED_COUNTS, {"tenant": tenant})


async def settings(conn: Conn, *, tenant: str) -> list[Row]:
    """Every queue of the tenant that has a settings row (paused or once paused)."""
    return await fetch_all(conn, _SETTINGS, {"tenant": tenant})


async def get(conn: Conn, *, tenant: str, queue: str) -> Row | None:
    return await fetch_one(conn, _GET, {"tenant": tenant, "queue": queue})


async def open_dead_letters(conn: Conn, *, tenant: str) -> dict[str, int]:
    """Open item dead letters per queue (the partial index of open letters)."""
    rows = await fetch_all(conn, _OPEN_DEAD_LETTERS, {"tenant": tenant})
    return {row["queue"]: int(row["n"]) for row in rows}


# -- samples of the counters: taken by the sweeper, a row when the totals changed -------

SAMPLE_KEEP = "65 minutes"

_SAMPLE = _SQL(
    "sample",
    """
WITH totals AS (
    SELECT tenant_id, queue, sum(completed)::bigint AS completed, sum(failed)::bigint AS failed
    FROM queue_counters GROUP BY tenant_id, queue
)
INSERT INTO queue_samples (tenant_id, queue, sampled_at, completed, failed)
SELECT t.tenant_id, t.queue, statement_timestamp(), t.completed, t.failed
FROM totals t
LEFT JOIN LATERAL (
    SELECT completed, failed FROM queue_samples s
    WHERE s.tenant_id = t.tenant_id AND s.queue = t.queue
    ORDER BY s.sampled_at DESC LIMIT 1
) last ON true
WHERE (last.completed IS DISTINCT FROM t.completed OR last.failed IS DISTINCT FROM t.failed)
  -- Another process sampled a moment ago: once per interval is enough.
  AND NOT EXISTS (SELECT 1 FROM queue_samples
                  WHERE sampled_at > statement_timestamp() - %(min_gap)s)
""",
)

# Samples past the hour go, except each queue's latest one of them: the total an hour
# ago is that one's while nothing changed since.
_PRUNE_SAMPLES = _SQL(
    "prune_samples",
    f"""
DELETE FROM queue_samples d
USING (
    SELECT s.tenant_id, s.queue, s.sampled_at FROM queue_samples s
    WHERE s.sampled_at < statement_timestamp() - interval '{SAMPLE_KEEP}'
      AND EXISTS (SELECT 1 FROM queue_samples n
                  WHERE n.tenant_id = s.tenant_id AND n.queue = s.queue
                    AND n.sampled_at > s.sampled_at
                    AND n.sampled_at < statement_timestamp() - interval '{SAMPLE_KEEP}')
    ORDER BY s.sampled_at
    LIMIT %(limit)s
) old
WHERE d.tenant_id = old.tenant_id AND d.queue = old.queue AND d.sampled_at = old.sampled_at
""",
)


async def sample(conn: Conn, *, min_gap: timedelta) -> int:
    """Record the counters' totals of every queue whose totals changed (unless a sample was
    taken less than `min_gap` ago); returns how many."""
    cur = await conn.execute(_SAMPLE, {"min_gap": min_gap})
    return cur.rowcount


async def prune_samples(conn: Conn, *, limit: int) -> int:
    """Drop up to `limit` samples no longer needed for the last hour's rates."""
    cur = await conn.execute(_PRUNE_SAMPLES, {"limit": limit})
    return cur.rowcount


async def all_open_counts(conn: Conn) -> list[Row]:
    """`open_counts` of every tenant's queues (tenant_id in each row)."""
    return await fetch_all(conn, _ALL_OPEN_COUNTS, {})


async def all_finished_counts(conn: Conn) -> list[Row]:
    """`finished_counts` of every tenant's queues (without the rates' samples)."""
    return await fetch_all(conn, _ALL_FINISHED_COUNTS, {})


async def all_settings(conn: Conn) -> list[Row]:
    """Every queue's settings row, of every tenant."""
    return await fetch_all(conn, _ALL_SETTINGS, {})


async def all_open_dead_letters(conn: Conn) -> list[Row]:
    return await fetch_all(conn, _ALL_OPEN_DEAD_LETTERS, {})


async def all_watcher_deliveries(conn: Conn) -> list[Row]:
    """(tenant_id, watcher_id, state, n): pending and dead deliveries of every watcher, and a
    `watching` row of 0 for each active or paused watcher (so zero reads as zero)."""
    return await fetch_all(conn, _ALL_WATCHER_DELIVERIES, {})
