-- The statements of queue_server/store/queues.py, run by name. Each `-- name:`
-- block is loaded at import (queue_server/store/sql/__init__.py); the text here is
-- the text sent.

-- name: pause
-- Already paused: nothing changes and nothing is recorded (the row is returned by `get`).
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
), ev AS (
    INSERT INTO queue_events (tenant_id, queue, seq, at, kind, actor, data)
    SELECT tenant_id, queue, event_seq - 1, updated_at, 'paused', %(actor)s,
           jsonb_build_object('reason', %(reason)s::text)
    FROM q
)
SELECT * FROM q;

-- name: resume
-- Not paused: nothing changes. Resumed: long-polling acquires of the queue wake up.
WITH q AS (
    UPDATE queues
    SET paused_at = NULL, paused_by = NULL, pause_reason = NULL, event_seq = event_seq + 1,
        updated_at = statement_timestamp()
    WHERE tenant_id = %(tenant)s AND queue = %(queue)s AND paused_at IS NOT NULL
    RETURNING *
), ev AS (
    INSERT INTO queue_events (tenant_id, queue, seq, at, kind, actor, data)
    SELECT tenant_id, queue, event_seq - 1, updated_at, 'resumed', %(actor)s,
           jsonb_build_object('reason', %(reason)s::text)
    FROM q
)
SELECT q.* FROM q, (SELECT pg_notify('queue_server_ready', queue_server.ready_tag(%(tenant)s, %(queue)s))) AS n;

-- name: put_concurrency
-- The queue's own concurrency (NULL: the approved limit), ledgered with the value before
-- and after; raising it wakes the queue's long polls (they may lease more now).
WITH before AS (
    SELECT concurrency FROM queues WHERE tenant_id = %(tenant)s AND queue = %(queue)s
), q AS (
    INSERT INTO queues AS t (tenant_id, queue, concurrency, event_seq, updated_at)
    VALUES (%(tenant)s, %(queue)s, %(concurrency)s, 1, statement_timestamp())
    ON CONFLICT (tenant_id, queue) DO UPDATE
    SET concurrency = excluded.concurrency, event_seq = t.event_seq + 1,
        updated_at = excluded.updated_at
    RETURNING *
), ev AS (
    INSERT INTO queue_events (tenant_id, queue, seq, at, kind, actor, data)
    SELECT tenant_id, queue, event_seq - 1, updated_at, 'concurrency', %(actor)s,
           jsonb_build_object('before', (SELECT concurrency FROM before),
                              'after', concurrency, 'approved_limit', %(approved)s::int,
                              'reason', %(reason)s::text)
    FROM q
)
SELECT q.* FROM q, (SELECT pg_notify('queue_server_ready', queue_server.ready_tag(%(tenant)s, %(queue)s))) AS n;

-- name: live_approvals
-- Per queue (of `tenant`, or of every tenant when NULL), the live spend approval behind its
-- approved limit (the largest; the newest among equals): seconds until it expires, and
-- whether that is within `warn`. A probe of ix_spend_approvals_unledgered (a live one is not
-- ledgered yet).
SELECT DISTINCT ON (tenant_id, queue) tenant_id, queue, approval_id::text AS approval_id,
       max_concurrency, expires_at,
       extract(epoch FROM expires_at - statement_timestamp())::float8 AS expires_in,
       expires_at <= statement_timestamp() + %(warn)s::interval AS expiring
FROM spend_approvals
WHERE expiry_ledgered_at IS NULL AND expires_at > statement_timestamp() AND revoked_at IS NULL
  AND (%(tenant)s::text IS NULL OR tenant_id = %(tenant)s::text)
ORDER BY tenant_id, queue, max_concurrency DESC, created_at DESC;

-- name: ledger_expired_approvals
-- Each approval whose expiry has passed and is not in its queue's ledger yet (a probe of
-- ix_spend_approvals_unledgered: the approvals not ledgered, by expiry), at most `limit`:
-- marked ledgered, and an `approval-expired` event written in its queue's ledger with the
-- limit the queue falls to (the largest approval still live, else the policy's base, and
-- the queue's own concurrency below it). A revoked one was marked when revoked.
WITH due AS (
    SELECT a.tenant_id, a.approval_id
    FROM spend_approvals a
    WHERE a.expiry_ledgered_at IS NULL AND a.expires_at <= statement_timestamp()
    ORDER BY a.expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), marked AS (
    UPDATE spend_approvals a SET expiry_ledgered_at = statement_timestamp()
    FROM due WHERE a.tenant_id = due.tenant_id AND a.approval_id = due.approval_id
    RETURNING a.*
), ordered AS (
    SELECT m.*, row_number() OVER (PARTITION BY m.tenant_id, m.queue
                                   ORDER BY m.expires_at, m.approval_id) AS nth,
           count(*) OVER (PARTITION BY m.tenant_id, m.queue) AS n
    FROM marked m
), q AS (
    INSERT INTO queues AS t (tenant_id, queue, event_seq, updated_at)
    SELECT DISTINCT tenant_id, queue, n, statement_timestamp() FROM ordered
    ON CONFLICT (tenant_id, queue) DO UPDATE
    SET event_seq = t.event_seq + excluded.event_seq, updated_at = excluded.updated_at
    RETURNING t.tenant_id, t.queue, t.event_seq, t.concurrency
), ev AS (
    INSERT INTO queue_events (tenant_id, queue, seq, at, kind, actor, data)
    SELECT o.tenant_id, o.queue, q.event_seq - o.n + o.nth - 1, statement_timestamp(),
           'approval-expired', 'server',
           jsonb_build_object(
               'approval_id', o.approval_id, 'max_concurrency', o.max_concurrency,
               'expires_at', o.expires_at, 'approved_by', o.approved_by, 'reason', o.reason,
               'limit', least(coalesce(
                   (SELECT max(least(l.max_concurrency, %(max_approved)s))
                    FROM spend_approvals l
                    WHERE l.tenant_id = o.tenant_id AND l.queue = o.queue
                      AND l.expires_at > statement_timestamp() AND l.revoked_at IS NULL),
                   %(base_limit)s), q.concurrency))
    FROM ordered o JOIN q ON q.tenant_id = o.tenant_id AND q.queue = o.queue
    RETURNING tenant_id, queue, data
)
SELECT tenant_id, queue, data->>'approval_id' AS approval_id,
       (data->>'limit')::int AS limit FROM ev;

-- name: events
SELECT e.seq, e.at, e.kind, e.actor, k.name AS actor_name, e.data FROM queue_events e
LEFT JOIN api_keys k ON left(e.actor, 4) = 'key:' AND k.key_id = substr(e.actor, 5)
 AND (k.tenant_id = e.tenant_id OR k.tenant_id IS NULL)
WHERE e.tenant_id = %(tenant)s AND e.queue = %(queue)s ORDER BY e.seq DESC LIMIT %(limit)s;

-- name: open_figures
-- One queue's unfinished items, read from the connection's cursor on it (the acquire's:
-- queue_server/store/cursors.py) instead of the ready and leased indexes from their start,
-- which an old snapshot fills with every row taken since it began. In this statement's
-- snapshot every ready row lies at or past its priority's first row in the cursor, or was
-- made ready since the cursor's snapshot (`placed_xid`); every leased one was active then
-- (`active_ids`, probed by key), or expired at or after `expired_from`, or was leased or
-- extended since. With no cursor: the whole ranges, once. A lease is active while it has
-- not expired; its age counts from its acquisition (`leased_at`).
WITH lanes AS (
    SELECT * FROM unnest(%(lane_priority)s::int[], %(lane_key)s::text[],
                         %(lane_at)s::timestamptz[], %(lane_id)s::uuid[])
                  AS l(priority, key, at, id)
), ready AS (
    -- A fair queue's cursor has a lane per priority and partition key (`key`, 0040).
    SELECT r.item_id, r.available_at FROM lanes l CROSS JOIN LATERAL (
        SELECT item_id, available_at FROM work_items
        WHERE l.key IS NULL
          AND tenant_id = %(tenant)s AND queue = %(queue)s AND state = 'ready'
          AND priority = l.priority AND (available_at, item_id) >= (l.at, l.id)
        UNION ALL
        SELECT item_id, available_at FROM work_items
        WHERE l.key IS NOT NULL
          AND tenant_id = %(tenant)s AND queue = %(queue)s AND state = 'ready'
          AND coalesce(partition_key, '') = l.key AND priority = l.priority
          AND (available_at, item_id) >= (l.at, l.id)
        OFFSET 0  -- read per lane from its place: joined, the whole range would be
    ) AS r
    UNION
    SELECT item_id, available_at FROM (
        SELECT item_id, tenant_id, queue, available_at FROM work_items
        WHERE placed_xid >= %(since_xid)s::xid8 AND placed_xid < %(until_xid)s::xid8
          AND state = 'ready'
        OFFSET 0
    ) AS placed
    WHERE tenant_id = %(tenant)s AND queue = %(queue)s
    UNION
    SELECT item_id, available_at FROM work_items
    WHERE %(since_xid)s::xid8 IS NULL
      AND tenant_id = %(tenant)s AND queue = %(queue)s AND state = 'ready'
), leased AS (
    SELECT item_id, lease_expires_at, leased_at FROM (
        -- By key alone (`OFFSET 0` keeps the checks outside).
        SELECT item_id, queue, state, lease_expires_at, leased_at FROM work_items
        WHERE tenant_id = %(tenant)s AND item_id = ANY(%(active_ids)s::uuid[])
        OFFSET 0
    ) AS seen
    WHERE queue = %(queue)s AND state = 'leased'
    UNION
    SELECT item_id, lease_expires_at, leased_at FROM work_items
    WHERE tenant_id = %(tenant)s AND queue = %(queue)s AND state = 'leased'
      AND lease_expires_at >= coalesce(%(expired_from)s::timestamptz, '-infinity')
      AND lease_expires_at <= statement_timestamp()
    UNION
    SELECT item_id, lease_expires_at, leased_at FROM (
        SELECT item_id, tenant_id, queue, lease_expires_at, leased_at FROM work_items
        WHERE placed_xid >= %(since_xid)s::xid8 AND placed_xid < %(until_xid)s::xid8
          AND state = 'leased'
        OFFSET 0
    ) AS placed
    WHERE tenant_id = %(tenant)s AND queue = %(queue)s
    UNION
    SELECT item_id, lease_expires_at, leased_at FROM work_items
    WHERE %(since_xid)s::xid8 IS NULL
      AND tenant_id = %(tenant)s AND queue = %(queue)s AND state = 'leased'
)
SELECT %(tenant)s::text AS tenant_id, %(queue)s::text AS queue, r.ready, r.due, l.leased,
       l.active_leases,
       (SELECT count(*) FROM work_items
        WHERE tenant_id = %(tenant)s AND queue = %(queue)s AND state = 'quarantined')
           AS quarantined,
       r.oldest_due_at AS oldest_ready_at,
       extract(epoch FROM statement_timestamp() - r.oldest_due_at) AS oldest_ready_age,
       extract(epoch FROM statement_timestamp() - l.oldest_active_at) AS oldest_lease_age
FROM (SELECT count(*) AS ready,
             count(*) FILTER (WHERE available_at <= statement_timestamp()) AS due,
             min(available_at) FILTER (WHERE available_at <= statement_timestamp())
                 AS oldest_due_at
      FROM ready) AS r,
     (SELECT count(*) AS leased,
             count(*) FILTER (WHERE lease_expires_at > statement_timestamp()) AS active_leases,
             min(leased_at) FILTER (WHERE lease_expires_at > statement_timestamp())
                 AS oldest_active_at
      FROM leased) AS l;

-- name: finished_counts
-- Completed and cancelled items now, and the totals that rates are taken from; with the
-- totals as sampled a minute and an hour ago (the latest sample at or before then).
WITH totals AS (
    SELECT tenant_id, queue,
           sum(completed)::bigint AS completions, sum(failed)::bigint AS failures,
           sum(quarantined)::bigint AS quarantines, sum(cancelled)::bigint AS cancellations,
           sum(completed - purged_completed)::bigint AS completed,
           sum(cancelled - purged_cancelled)::bigint AS cancelled
    FROM counter_totals
    WHERE tenant_id = %(tenant)s
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
) h ON true;

-- name: all_finished_counts
-- Completed and cancelled items now, and the totals that rates are taken from; with the
-- totals as sampled a minute and an hour ago (the latest sample at or before then).
WITH totals AS (
    SELECT tenant_id, queue,
           sum(completed)::bigint AS completions, sum(failed)::bigint AS failures,
           sum(quarantined)::bigint AS quarantines, sum(cancelled)::bigint AS cancellations,
           sum(completed - purged_completed)::bigint AS completed,
           sum(cancelled - purged_cancelled)::bigint AS cancelled
    FROM counter_totals

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
) h ON true;

-- name: all_settings
SELECT * FROM queues ORDER BY tenant_id, queue;

-- name: all_open_dead_letters
SELECT tenant_id, queue, count(*) AS n FROM dead_letters
WHERE closed_at IS NULL AND kind = 'item'
GROUP BY tenant_id, queue;

-- name: all_watcher_deliveries
-- Per watcher: deliveries waiting (the deliverer's partial index of pending rows), the
-- oldest one's age, and dead ones (each has its open dead letter until an operator replays or discards it).
SELECT tenant_id, watcher_id::text AS watcher_id, 'pending' AS state, count(*) AS n
FROM outbox_deliveries WHERE state = 'pending'
GROUP BY tenant_id, watcher_id
UNION ALL
-- The oldest pending delivery's age, whole seconds since its event was written.
SELECT tenant_id, watcher_id::text, 'lag',
       ceil(extract(epoch FROM statement_timestamp() - min(created_at)))::bigint
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
UNION ALL
-- Past the outbox cap (migration 0014): one while the mark stands.
SELECT tenant_id, watcher_id::text, 'backlogged', 1 FROM watchers
WHERE state IN ('active', 'paused') AND backlogged_at IS NOT NULL;

-- name: settings
SELECT * FROM queues WHERE tenant_id = %(tenant)s ORDER BY queue;

-- name: get
SELECT * FROM queues WHERE tenant_id = %(tenant)s AND queue = %(queue)s;

-- name: open_dead_letters
SELECT queue, count(*) AS n FROM dead_letters
WHERE tenant_id = %(tenant)s AND closed_at IS NULL AND kind = 'item'
GROUP BY queue;

-- name: counted_queues
-- Every queue that ever admitted an item (each has counters).
SELECT DISTINCT tenant_id, queue FROM counter_totals ORDER BY tenant_id, queue;

-- name: sample
-- Each queue's counters' totals, its ready items and the oldest due one's `available_at`
-- (read by the caller from each queue's cursor: `open_figures`), a row for each queue where
-- any of them changed since its last sample; finished history is not read.
WITH totals AS (
    SELECT tenant_id, queue, sum(completed)::bigint AS completed, sum(failed)::bigint AS failed,
           sum(timed_completions)::bigint AS timed_completions,
           sum(completion_ms)::bigint AS completion_ms
    FROM counter_totals GROUP BY tenant_id, queue
), waiting AS (
    SELECT * FROM unnest(%(tenants)s::text[], %(queues)s::text[], %(ready)s::bigint[],
                         %(oldest_ready_at)s::timestamptz[])
        AS w(tenant_id, queue, ready, oldest_ready_at)
), current AS (
    SELECT t.tenant_id, t.queue, t.completed, t.failed, t.timed_completions, t.completion_ms,
           coalesce(w.ready, 0) AS ready, w.oldest_ready_at
    FROM totals t
    LEFT JOIN waiting w ON w.tenant_id = t.tenant_id AND w.queue = t.queue
)
INSERT INTO queue_samples (tenant_id, queue, sampled_at, completed, failed, timed_completions,
                           completion_ms, ready, oldest_ready_at)
SELECT c.tenant_id, c.queue, statement_timestamp(), c.completed, c.failed, c.timed_completions,
       c.completion_ms, c.ready, c.oldest_ready_at
FROM current c
LEFT JOIN LATERAL (
    SELECT completed, failed, timed_completions, completion_ms, ready, oldest_ready_at
    FROM queue_samples s
    WHERE s.tenant_id = c.tenant_id AND s.queue = c.queue
    ORDER BY s.sampled_at DESC LIMIT 1
) last ON true
WHERE (last.completed, last.failed, last.timed_completions, last.completion_ms, last.ready,
       last.oldest_ready_at)
      IS DISTINCT FROM
      (c.completed, c.failed, c.timed_completions, c.completion_ms, c.ready, c.oldest_ready_at)
  -- Another process sampled a moment ago: once per interval is enough.
  AND NOT EXISTS (SELECT 1 FROM queue_samples
                  WHERE sampled_at > statement_timestamp() - %(min_gap)s);

-- name: prune_samples
-- Samples past the hour go, except each queue's latest one of them: the total an hour
-- ago is that one's while nothing changed since.
DELETE FROM queue_samples d
USING (
    SELECT s.tenant_id, s.queue, s.sampled_at FROM queue_samples s
    WHERE s.sampled_at < statement_timestamp() - interval '65 minutes'
      AND EXISTS (SELECT 1 FROM queue_samples n
                  WHERE n.tenant_id = s.tenant_id AND n.queue = s.queue
                    AND n.sampled_at > s.sampled_at
                    AND n.sampled_at < statement_timestamp() - interval '65 minutes')
    ORDER BY s.sampled_at
    LIMIT %(limit)s
) old
WHERE d.tenant_id = old.tenant_id AND d.queue = old.queue AND d.sampled_at = old.sampled_at;

-- name: put_settings
-- The queue's own settings, all of them at once (NULL: the tenant's default, else the
-- policy's; `ordering_dead_letters` has its own default, release, and `fairness` its own,
-- arrival), ledgered on the queue with the values before and after.
WITH before AS (
    SELECT lease_ttl, deadline, max_acquisitions, retry_base, retry_cap, retry_jitter,
           ordering_dead_letters, rate_limit, extract(epoch FROM rate_interval) AS rate_per,
           rate_partitioned, fairness
    FROM queues WHERE tenant_id = %(tenant)s AND queue = %(queue)s
), q AS (
    INSERT INTO queues AS t (tenant_id, queue, lease_ttl, deadline, max_acquisitions,
                             retry_base, retry_cap, retry_jitter, ordering_dead_letters,
                             rate_limit, rate_interval, rate_partitioned, fairness,
                             settings_updated_at, settings_updated_by, event_seq, updated_at)
    VALUES (%(tenant)s, %(queue)s, %(lease_ttl)s, %(deadline)s, %(max_acquisitions)s,
            %(retry_base)s, %(retry_cap)s, %(retry_jitter)s, %(ordering_dead_letters)s,
            %(rate_limit)s, %(rate_interval)s, %(rate_partitioned)s, %(fairness)s,
            statement_timestamp(), %(actor)s, 1, statement_timestamp())
    ON CONFLICT (tenant_id, queue) DO UPDATE
    SET lease_ttl = excluded.lease_ttl, deadline = excluded.deadline,
        max_acquisitions = excluded.max_acquisitions, retry_base = excluded.retry_base,
        retry_cap = excluded.retry_cap, retry_jitter = excluded.retry_jitter,
        ordering_dead_letters = excluded.ordering_dead_letters,
        rate_limit = excluded.rate_limit, rate_interval = excluded.rate_interval,
        rate_partitioned = excluded.rate_partitioned, fairness = excluded.fairness,
        settings_updated_at = excluded.settings_updated_at,
        settings_updated_by = excluded.settings_updated_by, event_seq = t.event_seq + 1,
        updated_at = excluded.updated_at
    RETURNING *
), ev AS (
    INSERT INTO queue_events (tenant_id, queue, seq, at, kind, actor, data)
    SELECT q.tenant_id, q.queue, q.event_seq - 1, q.updated_at, 'settings', %(actor)s,
           jsonb_build_object(
               'before', (SELECT to_jsonb(b) FROM before b),
               'after', jsonb_build_object(
                   'lease_ttl', extract(epoch FROM q.lease_ttl),
                   'deadline', extract(epoch FROM q.deadline),
                   'max_acquisitions', q.max_acquisitions, 'retry_base', q.retry_base,
                   'retry_cap', q.retry_cap, 'retry_jitter', q.retry_jitter,
                   'ordering_dead_letters', q.ordering_dead_letters,
                   'rate_limit', q.rate_limit, 'rate_per', extract(epoch FROM q.rate_interval),
                   'rate_partitioned', q.rate_partitioned, 'fairness', q.fairness))
    FROM q
)
SELECT * FROM q;

-- name: queue_terms
-- What a queue's settings resolve from: its own row (if any) and its tenant's defaults.
SELECT t.default_lease_ttl, t.default_max_acquisitions,
       q.lease_ttl, q.deadline, q.max_acquisitions, q.retry_base, q.retry_cap, q.retry_jitter,
       q.ordering_dead_letters, q.rate_limit, q.rate_interval,
       coalesce(q.rate_partitioned, false) AS rate_partitioned, q.fairness,
       q.settings_updated_at, q.settings_updated_by
FROM tenants t
LEFT JOIN queues q ON q.tenant_id = t.tenant_id AND q.queue = %(queue)s
WHERE t.tenant_id = %(tenant)s;

-- name: minute_totals
-- Each queue's completion and failure totals at the end of each of the last 60 minutes
-- (the last sample at or before it) and now (the counters): a minute's count is the rise
-- between two of them. One probe of the samples' key per queue and minute.
WITH totals AS (
    SELECT queue, sum(completed)::bigint AS completed, sum(failed)::bigint AS failed
    FROM counter_totals WHERE tenant_id = %(tenant)s
    GROUP BY queue
)
SELECT t.queue, k.ago,
       CASE WHEN k.ago = 0 THEN t.completed ELSE coalesce(s.completed, 0) END AS completed,
       CASE WHEN k.ago = 0 THEN t.failed ELSE coalesce(s.failed, 0) END AS failed
FROM totals t
CROSS JOIN generate_series(0, 60) AS k(ago)
LEFT JOIN LATERAL (
    SELECT completed, failed FROM queue_samples s
    WHERE s.tenant_id = %(tenant)s AND s.queue = t.queue
      AND s.sampled_at <= statement_timestamp() - make_interval(mins => k.ago)
    ORDER BY s.sampled_at DESC LIMIT 1
) s ON k.ago > 0
ORDER BY t.queue, k.ago DESC;

-- name: roll_up
-- The day's samples: each queue's last sample of each 15-minute bucket that has ended (a
-- minute ago, so that no sample of it is still to commit). The buckets of the last 45
-- minutes are read again each round, all of their samples still kept (65 minutes), so a
-- round missed now and then loses nothing; a bucket copied before is left as it is.
INSERT INTO queue_day_samples (tenant_id, queue, sampled_at, completed, failed,
                               timed_completions, completion_ms, ready, oldest_ready_at)
SELECT DISTINCT ON (tenant_id, queue,
                    date_bin('15 minutes', sampled_at, timestamptz '2000-01-01 00:00:00+00'))
       tenant_id, queue, sampled_at, completed, failed, timed_completions, completion_ms,
       ready, oldest_ready_at
FROM queue_samples
WHERE sampled_at >= date_bin('15 minutes', statement_timestamp() - interval '45 minutes',
                             timestamptz '2000-01-01 00:00:00+00')
  AND sampled_at < date_bin('15 minutes', statement_timestamp() - interval '1 minute',
                            timestamptz '2000-01-01 00:00:00+00')
ORDER BY tenant_id, queue,
         date_bin('15 minutes', sampled_at, timestamptz '2000-01-01 00:00:00+00'),
         sampled_at DESC
ON CONFLICT (tenant_id, queue, sampled_at) DO NOTHING;

-- name: prune_day_samples
-- Day samples past 25 hours go, except each queue's latest one of them: the totals at the
-- day's start are that one's while nothing changed since.
DELETE FROM queue_day_samples d
USING (
    SELECT s.tenant_id, s.queue, s.sampled_at FROM queue_day_samples s
    WHERE s.sampled_at < statement_timestamp() - interval '25 hours'
      AND EXISTS (SELECT 1 FROM queue_day_samples n
                  WHERE n.tenant_id = s.tenant_id AND n.queue = s.queue
                    AND n.sampled_at > s.sampled_at
                    AND n.sampled_at < statement_timestamp() - interval '25 hours')
    ORDER BY s.sampled_at
    LIMIT %(limit)s
) old
WHERE d.tenant_id = old.tenant_id AND d.queue = old.queue AND d.sampled_at = old.sampled_at;

-- name: queue_series
-- One queue at `points` marks a `step` apart and now (i = 0), oldest first: the totals,
-- ready items and oldest due item as last sampled before each mark (from the samples, or
-- the day's samples past their hour: a day sample is the last sample of its 15-minute
-- bucket, so it is the last one before a mark on that grid), and now from the counters
-- and the ready items' index. `aligned`: the marks fall on the `step` grid. Two probes of
-- the samples' keys per mark.
WITH marks AS (
    SELECT k.i,
           CASE WHEN k.i = 0 THEN statement_timestamp()
                WHEN %(aligned)s THEN date_bin(%(step)s::interval, statement_timestamp(),
                                               timestamptz '2000-01-01 00:00:00+00')
                                      - (k.i - 1) * %(step)s::interval
                ELSE statement_timestamp() - k.i * %(step)s::interval
           END AS at
    FROM generate_series(0, %(points)s) AS k(i)
), totals AS (
    SELECT coalesce(sum(completed), 0)::bigint AS completed,
           coalesce(sum(failed), 0)::bigint AS failed,
           coalesce(sum(timed_completions), 0)::bigint AS timed_completions,
           coalesce(sum(completion_ms), 0)::bigint AS completion_ms
    FROM counter_totals WHERE tenant_id = %(tenant)s AND queue = %(queue)s
), waiting AS (
    SELECT count(*) AS ready,
           min(available_at) FILTER (WHERE available_at <= statement_timestamp())
               AS oldest_ready_at
    FROM work_items WHERE tenant_id = %(tenant)s AND queue = %(queue)s AND state = 'ready'
)
SELECT m.i, m.at,
       CASE WHEN m.i = 0 THEN t.completed ELSE coalesce(s.completed, 0) END AS completed,
       CASE WHEN m.i = 0 THEN t.failed ELSE coalesce(s.failed, 0) END AS failed,
       CASE WHEN m.i = 0 THEN t.timed_completions ELSE coalesce(s.timed_completions, 0) END
           AS timed_completions,
       CASE WHEN m.i = 0 THEN t.completion_ms ELSE coalesce(s.completion_ms, 0) END
           AS completion_ms,
       CASE WHEN m.i = 0 THEN w.ready ELSE coalesce(s.ready, 0) END AS ready,
       extract(epoch FROM m.at - CASE WHEN m.i = 0 THEN w.oldest_ready_at
                                      ELSE s.oldest_ready_at END) AS oldest_ready_age
FROM marks m
CROSS JOIN totals t
CROSS JOIN waiting w
LEFT JOIN LATERAL (
    SELECT * FROM (
        (SELECT sampled_at, completed, failed, timed_completions, completion_ms, ready,
                oldest_ready_at
         FROM queue_samples s
         WHERE s.tenant_id = %(tenant)s AND s.queue = %(queue)s AND s.sampled_at < m.at
         ORDER BY s.sampled_at DESC LIMIT 1)
        UNION ALL
        (SELECT sampled_at, completed, failed, timed_completions, completion_ms, ready,
                oldest_ready_at
         FROM queue_day_samples d
         WHERE d.tenant_id = %(tenant)s AND d.queue = %(queue)s AND d.sampled_at < m.at
         ORDER BY d.sampled_at DESC LIMIT 1)
    ) AS latest
    ORDER BY sampled_at DESC LIMIT 1
) s ON m.i > 0
ORDER BY m.i DESC;

-- name: purge_rate_grants
-- The rate grants older than their queue's interval (at most a batch): no window reads
-- them again. A queue no longer rate-limited keeps none.
DELETE FROM rate_grants g
WHERE g.ctid = ANY(ARRAY(
    SELECT o.ctid FROM rate_grants o
    LEFT JOIN queues q ON q.tenant_id = o.tenant_id AND q.queue = o.queue
    WHERE o.granted_at < statement_timestamp() - coalesce(q.rate_interval, interval '0')
    ORDER BY o.granted_at
    LIMIT %(limit)s))
RETURNING 1;
