-- The statements of queue_server/store/reads.py, run by name. Each `-- name:`
-- block is loaded at import (queue_server/store/sql/__init__.py); the text here is
-- the text sent.

-- name: get_item
SELECT * FROM work_items WHERE tenant_id = %s AND item_id = %s;

-- name: ledger
SELECT seq, at, kind, fence, actor, data FROM item_events
WHERE tenant_id = %s AND item_id = %s ORDER BY seq;

-- name: state_counts
-- Unfinished states from their partial indexes (a branch each: an IN list would be one scan
-- of the table); finished ones from the queue counters
-- (completed - purged, cancelled - purged): no read of finished history.
SELECT 'ready' AS state, count(*) AS n FROM work_items
WHERE tenant_id = %(tenant)s AND state = 'ready'
UNION ALL
SELECT 'leased', count(*) FROM work_items WHERE tenant_id = %(tenant)s AND state = 'leased'
UNION ALL
SELECT 'quarantined', count(*) FROM work_items
WHERE tenant_id = %(tenant)s AND state = 'quarantined'
UNION ALL
SELECT 'completed', coalesce(sum(completed - purged_completed), 0) FROM queue_counters
WHERE tenant_id = %(tenant)s
UNION ALL
SELECT 'cancelled', coalesce(sum(cancelled - purged_cancelled), 0) FROM queue_counters
WHERE tenant_id = %(tenant)s;

-- name: max_connections
SELECT current_setting('max_connections')::int AS n;

-- name: schema_revisions
SELECT version_num FROM alembic_version;

-- name: items_in_id_range
SELECT * FROM work_items WHERE tenant_id = %s AND item_id BETWEEN %s AND %s ORDER BY item_id
LIMIT %s;

-- name: count_items
-- How many items of one state match a filter: what a bulk action's button and its
-- confirmation say it covers. It reads the state's range of the tenant's items.
SELECT count(*) AS n FROM work_items w
WHERE w.tenant_id = %(tenant)s AND w.state = %(state)s::item_state
  AND (%(queue)s::text IS NULL OR w.queue = %(queue)s)
  AND w.created_at > %(created_after)s::timestamptz
  AND w.created_at < %(created_before)s::timestamptz
  AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb);

-- name: items_with_id_ending
-- The end of a UUIDv7 is its random part, the one that tells items apart: a person copies
-- it. No index has it; a scan of the tenant's items, for a lookup by hand.
SELECT * FROM work_items
WHERE tenant_id = %(tenant)s
  AND right(replace(item_id::text, '-', ''), length(%(digits)s)) = %(digits)s
ORDER BY item_id LIMIT %(limit)s;

-- name: leases
-- The leased rows come from ix_work_items_leased; each one's acquisition time is its
-- last `acquired` event (a heartbeat moves the expiry, not the start).
SELECT w.queue, w.item_id, w.lease_holder, w.fence, w.lease_expires_at,
       (SELECT e.at FROM item_events e
        WHERE e.tenant_id = w.tenant_id AND e.item_id = w.item_id AND e.kind = 'acquired'
        ORDER BY e.seq DESC LIMIT 1) AS acquired_at
FROM work_items w
WHERE w.tenant_id = %(tenant)s AND w.state = 'leased'
  AND (%(key_id)s::text IS NULL OR w.lease_key_id = %(key_id)s)
ORDER BY w.queue, acquired_at, w.item_id
LIMIT %(limit)s;

-- name: ledger_page
-- One statement, so each item and its events are read from the same snapshot:
-- a transition committing in between cannot make a consistent item look wrong.
WITH page AS (
    SELECT * FROM work_items
    WHERE (%(tenant)s::text IS NULL OR tenant_id = %(tenant)s)
      AND (tenant_id, item_id) > (%(after_tenant)s, %(after_item)s::uuid)
    ORDER BY tenant_id, item_id
    LIMIT %(limit)s
)
SELECT p.*,
       (SELECT coalesce(jsonb_agg(jsonb_build_object(
                   'seq', e.seq, 'kind', e.kind, 'fence', e.fence, 'data', e.data)
                   ORDER BY e.seq), '[]'::jsonb)
        FROM item_events e
        WHERE e.tenant_id = p.tenant_id AND e.item_id = p.item_id) AS events
FROM page p
ORDER BY tenant_id, item_id;

-- name: list_items_state_queue
-- Pages of items: keyset pagination in (created_at, item_id) order.
-- ix_work_items_list (tenant_id, state, queue, created_at, item_id) holds every state but
-- leased. Each branch reads one (state, queue) range of it from the cursor on, so a
-- page of ready items never reads finished history. Without a queue, the queues of the
-- state are found by a loose index scan (one probe per queue: the recursive q_<state>)
-- and each is read up to a page; without a state, each state is a branch of its own.
-- Leased items (the few the concurrency limit allows) come from ix_work_items_leased
-- and are sorted.
SELECT w.* FROM work_items w
    WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = %(state)s::item_state
      AND w.queue = %(queue)s
      AND w.created_at > %(created_after)s::timestamptz
      AND w.created_at < %(created_before)s::timestamptz
      AND (w.created_at, w.item_id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)
      AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb)
    ORDER BY w.created_at, w.item_id
    LIMIT %(limit)s;

-- name: list_items_state
WITH RECURSIVE q_state AS (
    (SELECT w.queue FROM work_items w
     WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = %(state)s::item_state
     ORDER BY w.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT w.queue FROM work_items w
            WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased'
              AND w.state = %(state)s::item_state
              AND w.queue > q.queue
            ORDER BY w.queue LIMIT 1)
    FROM q_state q WHERE q.queue IS NOT NULL
)
SELECT u.* FROM (
(SELECT p.* FROM q_state q CROSS JOIN LATERAL (
    SELECT w.* FROM work_items w
    WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = %(state)s::item_state
      AND w.queue = q.queue
      AND w.created_at > %(created_after)s::timestamptz
      AND w.created_at < %(created_before)s::timestamptz
      AND (w.created_at, w.item_id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)
      AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb)
    ORDER BY w.created_at, w.item_id
    LIMIT %(limit)s
) p)
) AS u
ORDER BY u.created_at, u.item_id LIMIT %(limit)s;

-- name: list_items_leased
SELECT w.* FROM work_items w
    WHERE w.tenant_id = %(tenant)s AND w.state = 'leased'
      AND (%(queue)s::text IS NULL OR w.queue = %(queue)s)
      AND w.created_at > %(created_after)s::timestamptz
      AND w.created_at < %(created_before)s::timestamptz
      AND (w.created_at, w.item_id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)
      AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb)
    ORDER BY w.created_at, w.item_id
    LIMIT %(limit)s;

-- name: list_items_all_queue
SELECT u.* FROM (
(SELECT w.* FROM work_items w
    WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = 'ready'
      AND w.queue = %(queue)s
      AND w.created_at > %(created_after)s::timestamptz
      AND w.created_at < %(created_before)s::timestamptz
      AND (w.created_at, w.item_id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)
      AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb)
    ORDER BY w.created_at, w.item_id
    LIMIT %(limit)s)
UNION ALL
(SELECT w.* FROM work_items w
    WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = 'quarantined'
      AND w.queue = %(queue)s
      AND w.created_at > %(created_after)s::timestamptz
      AND w.created_at < %(created_before)s::timestamptz
      AND (w.created_at, w.item_id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)
      AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb)
    ORDER BY w.created_at, w.item_id
    LIMIT %(limit)s)
UNION ALL
(SELECT w.* FROM work_items w
    WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = 'completed'
      AND w.queue = %(queue)s
      AND w.created_at > %(created_after)s::timestamptz
      AND w.created_at < %(created_before)s::timestamptz
      AND (w.created_at, w.item_id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)
      AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb)
    ORDER BY w.created_at, w.item_id
    LIMIT %(limit)s)
UNION ALL
(SELECT w.* FROM work_items w
    WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = 'cancelled'
      AND w.queue = %(queue)s
      AND w.created_at > %(created_after)s::timestamptz
      AND w.created_at < %(created_before)s::timestamptz
      AND (w.created_at, w.item_id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)
      AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb)
    ORDER BY w.created_at, w.item_id
    LIMIT %(limit)s)
UNION ALL
(SELECT w.* FROM work_items w
    WHERE w.tenant_id = %(tenant)s AND w.state = 'leased'
      AND (%(queue)s::text IS NULL OR w.queue = %(queue)s)
      AND w.created_at > %(created_after)s::timestamptz
      AND w.created_at < %(created_before)s::timestamptz
      AND (w.created_at, w.item_id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)
      AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb)
    ORDER BY w.created_at, w.item_id
    LIMIT %(limit)s)
) AS u
ORDER BY u.created_at, u.item_id LIMIT %(limit)s;

-- name: list_items_all
WITH RECURSIVE q_ready AS (
    (SELECT w.queue FROM work_items w
     WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = 'ready'
     ORDER BY w.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT w.queue FROM work_items w
            WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = 'ready'
              AND w.queue > q.queue
            ORDER BY w.queue LIMIT 1)
    FROM q_ready q WHERE q.queue IS NOT NULL
), q_quarantined AS (
    (SELECT w.queue FROM work_items w
     WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = 'quarantined'
     ORDER BY w.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT w.queue FROM work_items w
            WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = 'quarantined'
              AND w.queue > q.queue
            ORDER BY w.queue LIMIT 1)
    FROM q_quarantined q WHERE q.queue IS NOT NULL
), q_completed AS (
    (SELECT w.queue FROM work_items w
     WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = 'completed'
     ORDER BY w.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT w.queue FROM work_items w
            WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = 'completed'
              AND w.queue > q.queue
            ORDER BY w.queue LIMIT 1)
    FROM q_completed q WHERE q.queue IS NOT NULL
), q_cancelled AS (
    (SELECT w.queue FROM work_items w
     WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = 'cancelled'
     ORDER BY w.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT w.queue FROM work_items w
            WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = 'cancelled'
              AND w.queue > q.queue
            ORDER BY w.queue LIMIT 1)
    FROM q_cancelled q WHERE q.queue IS NOT NULL
)
SELECT u.* FROM (
(SELECT p.* FROM q_ready q CROSS JOIN LATERAL (
    SELECT w.* FROM work_items w
    WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = 'ready'
      AND w.queue = q.queue
      AND w.created_at > %(created_after)s::timestamptz
      AND w.created_at < %(created_before)s::timestamptz
      AND (w.created_at, w.item_id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)
      AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb)
    ORDER BY w.created_at, w.item_id
    LIMIT %(limit)s
) p)
UNION ALL
(SELECT p.* FROM q_quarantined q CROSS JOIN LATERAL (
    SELECT w.* FROM work_items w
    WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = 'quarantined'
      AND w.queue = q.queue
      AND w.created_at > %(created_after)s::timestamptz
      AND w.created_at < %(created_before)s::timestamptz
      AND (w.created_at, w.item_id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)
      AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb)
    ORDER BY w.created_at, w.item_id
    LIMIT %(limit)s
) p)
UNION ALL
(SELECT p.* FROM q_completed q CROSS JOIN LATERAL (
    SELECT w.* FROM work_items w
    WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = 'completed'
      AND w.queue = q.queue
      AND w.created_at > %(created_after)s::timestamptz
      AND w.created_at < %(created_before)s::timestamptz
      AND (w.created_at, w.item_id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)
      AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb)
    ORDER BY w.created_at, w.item_id
    LIMIT %(limit)s
) p)
UNION ALL
(SELECT p.* FROM q_cancelled q CROSS JOIN LATERAL (
    SELECT w.* FROM work_items w
    WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = 'cancelled'
      AND w.queue = q.queue
      AND w.created_at > %(created_after)s::timestamptz
      AND w.created_at < %(created_before)s::timestamptz
      AND (w.created_at, w.item_id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)
      AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb)
    ORDER BY w.created_at, w.item_id
    LIMIT %(limit)s
) p)
UNION ALL
(SELECT w.* FROM work_items w
    WHERE w.tenant_id = %(tenant)s AND w.state = 'leased'
      AND (%(queue)s::text IS NULL OR w.queue = %(queue)s)
      AND w.created_at > %(created_after)s::timestamptz
      AND w.created_at < %(created_before)s::timestamptz
      AND (w.created_at, w.item_id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)
      AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb)
    ORDER BY w.created_at, w.item_id
    LIMIT %(limit)s)
) AS u
ORDER BY u.created_at, u.item_id LIMIT %(limit)s;

-- name: list_items_open_queue
SELECT u.* FROM (
(SELECT w.* FROM work_items w
    WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = 'ready'
      AND w.queue = %(queue)s
      AND w.created_at > %(created_after)s::timestamptz
      AND w.created_at < %(created_before)s::timestamptz
      AND (w.created_at, w.item_id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)
      AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb)
    ORDER BY w.created_at, w.item_id
    LIMIT %(limit)s)
UNION ALL
(SELECT w.* FROM work_items w
    WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = 'quarantined'
      AND w.queue = %(queue)s
      AND w.created_at > %(created_after)s::timestamptz
      AND w.created_at < %(created_before)s::timestamptz
      AND (w.created_at, w.item_id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)
      AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb)
    ORDER BY w.created_at, w.item_id
    LIMIT %(limit)s)
UNION ALL
(SELECT w.* FROM work_items w
    WHERE w.tenant_id = %(tenant)s AND w.state = 'leased'
      AND (%(queue)s::text IS NULL OR w.queue = %(queue)s)
      AND w.created_at > %(created_after)s::timestamptz
      AND w.created_at < %(created_before)s::timestamptz
      AND (w.created_at, w.item_id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)
      AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb)
    ORDER BY w.created_at, w.item_id
    LIMIT %(limit)s)
) AS u
ORDER BY u.created_at, u.item_id LIMIT %(limit)s;

-- name: list_items_open
WITH RECURSIVE q_ready AS (
    (SELECT w.queue FROM work_items w
     WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = 'ready'
     ORDER BY w.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT w.queue FROM work_items w
            WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = 'ready'
              AND w.queue > q.queue
            ORDER BY w.queue LIMIT 1)
    FROM q_ready q WHERE q.queue IS NOT NULL
), q_quarantined AS (
    (SELECT w.queue FROM work_items w
     WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = 'quarantined'
     ORDER BY w.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT w.queue FROM work_items w
            WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = 'quarantined'
              AND w.queue > q.queue
            ORDER BY w.queue LIMIT 1)
    FROM q_quarantined q WHERE q.queue IS NOT NULL
)
SELECT u.* FROM (
(SELECT p.* FROM q_ready q CROSS JOIN LATERAL (
    SELECT w.* FROM work_items w
    WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = 'ready'
      AND w.queue = q.queue
      AND w.created_at > %(created_after)s::timestamptz
      AND w.created_at < %(created_before)s::timestamptz
      AND (w.created_at, w.item_id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)
      AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb)
    ORDER BY w.created_at, w.item_id
    LIMIT %(limit)s
) p)
UNION ALL
(SELECT p.* FROM q_quarantined q CROSS JOIN LATERAL (
    SELECT w.* FROM work_items w
    WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.state = 'quarantined'
      AND w.queue = q.queue
      AND w.created_at > %(created_after)s::timestamptz
      AND w.created_at < %(created_before)s::timestamptz
      AND (w.created_at, w.item_id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)
      AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb)
    ORDER BY w.created_at, w.item_id
    LIMIT %(limit)s
) p)
UNION ALL
(SELECT w.* FROM work_items w
    WHERE w.tenant_id = %(tenant)s AND w.state = 'leased'
      AND (%(queue)s::text IS NULL OR w.queue = %(queue)s)
      AND w.created_at > %(created_after)s::timestamptz
      AND w.created_at < %(created_before)s::timestamptz
      AND (w.created_at, w.item_id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)
      AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb)
    ORDER BY w.created_at, w.item_id
    LIMIT %(limit)s)
) AS u
ORDER BY u.created_at, u.item_id LIMIT %(limit)s;
