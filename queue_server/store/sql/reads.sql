-- The statements of queue_server/store/reads.py, run by name. Each `-- name:`
-- block is loaded at import (queue_server/store/sql/__init__.py); the text here is
-- the text sent.

-- name: get_item
SELECT * FROM work_items WHERE tenant_id = %s AND item_id = %s;

-- name: ledger
-- With the name of the key that acted, if it has one (a key of this tenant or an admin's).
SELECT e.seq, e.at, e.kind, e.fence, e.actor, k.name AS actor_name, e.data FROM item_events e
LEFT JOIN api_keys k ON left(e.actor, 4) = 'key:' AND k.key_id = substr(e.actor, 5)
 AND (k.tenant_id = e.tenant_id OR k.tenant_id IS NULL)
WHERE e.tenant_id = %s AND e.item_id = %s ORDER BY e.seq;

-- name: dependencies
-- The items an item depends on (migration 0035), as they are now, in id order after `after`:
-- a range of the dependent's own rows of item_dependencies, each item probed by its key.
SELECT w.* FROM item_dependencies x
JOIN work_items w ON w.tenant_id = x.tenant_id AND w.item_id = x.depends_on
WHERE x.tenant_id = %(tenant)s AND x.item_id = %(item_id)s::uuid
  AND x.depends_on > %(after)s::uuid
ORDER BY x.depends_on
LIMIT %(limit)s;

-- name: dependency_count
-- How many items an item depends on, and, while it is `waiting`, how many of them it still
-- waits for (migration 0038: its newest tally, else the count made at its enqueue or retry).
SELECT (SELECT count(*) FROM item_dependencies x
        WHERE x.tenant_id = w.tenant_id AND x.item_id = w.item_id) AS total,
       CASE WHEN w.state = 'waiting' AND w.dependencies_pending IS NOT NULL
            THEN coalesce((SELECT t.pending FROM dependency_tallies t
                           WHERE t.tenant_id = w.tenant_id AND t.item_id = w.item_id
                           ORDER BY t.seq DESC LIMIT 1), w.dependencies_pending)
            ELSE 0 END AS waiting_for
FROM work_items w
WHERE w.tenant_id = %(tenant)s AND w.item_id = %(item_id)s::uuid;

-- name: descendants
-- Every item that depends, directly or not, on one item (migration 0035): a walk down the
-- graph by the index of item_dependencies by dependency, its cost the graph's size.
WITH RECURSIVE below(item_id) AS (
    SELECT x.item_id FROM item_dependencies x
    WHERE x.tenant_id = %(tenant)s AND x.depends_on = %(item_id)s::uuid
    UNION
    SELECT x.item_id FROM item_dependencies x JOIN below b ON x.depends_on = b.item_id
    WHERE x.tenant_id = %(tenant)s
)
SELECT item_id::text AS item_id FROM below;

-- name: workflow
-- The graph an item is part of (migration 0035): its ancestors and its descendants, walked
-- by item_dependencies' two indexes (each item once: the walk ends on a graph of any shape),
-- at most `limit` of them, each with its state and the dependencies among them.
WITH RECURSIVE up(item_id) AS (
    SELECT %(item_id)s::uuid
    UNION
    SELECT x.depends_on FROM item_dependencies x JOIN up u ON x.item_id = u.item_id
    WHERE x.tenant_id = %(tenant)s
), down(item_id) AS (
    SELECT %(item_id)s::uuid
    UNION
    SELECT x.item_id FROM item_dependencies x JOIN down d ON x.depends_on = d.item_id
    WHERE x.tenant_id = %(tenant)s
), nodes AS (
    SELECT item_id FROM (SELECT item_id FROM up UNION SELECT item_id FROM down) AS a
    ORDER BY item_id <> %(item_id)s::uuid, item_id  -- the item itself first: never cut
    LIMIT %(limit)s
)
SELECT w.item_id::text AS item_id, w.queue, w.state::text AS state,
       ARRAY(SELECT x.depends_on::text FROM item_dependencies x
             WHERE x.tenant_id = w.tenant_id AND x.item_id = w.item_id
               AND x.depends_on IN (SELECT item_id FROM nodes)
             ORDER BY x.depends_on) AS depends_on
FROM nodes n JOIN work_items w ON w.tenant_id = %(tenant)s AND w.item_id = n.item_id
ORDER BY w.item_id;

-- name: cancelled_by_dependency
-- Of the given items, those cancelled because a dependency failed for good (their last event,
-- a `cancelled` the trigger of migration 0035 wrote, names the dependency): a probe each.
SELECT w.item_id::text AS item_id FROM work_items w
WHERE w.tenant_id = %(tenant)s AND w.item_id = ANY(%(item_ids)s::uuid[]) AND w.state = 'cancelled'
  AND EXISTS (SELECT 1 FROM item_events e
              WHERE e.tenant_id = w.tenant_id AND e.item_id = w.item_id
                AND e.seq = w.event_seq - 1 AND e.kind = 'cancelled' AND e.data ? 'dependency')
ORDER BY w.item_id;

-- name: state_counts
-- Per queue that ever admitted an item: its finished items, from the queue counters
-- (completed - purged, cancelled - purged); no read of finished history.
SELECT queue, coalesce(sum(completed - purged_completed), 0) AS completed,
       coalesce(sum(cancelled - purged_cancelled), 0) AS cancelled
FROM counter_totals WHERE tenant_id = %(tenant)s
GROUP BY queue;

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

-- name: items_with_ids
-- A bulk action's selection: the named items of one state that match the rest of the
-- filter, in (created_at, item_id) order from the cursor on. A primary key probe per id.
SELECT w.* FROM work_items w
WHERE w.tenant_id = %(tenant)s AND w.item_id = ANY(%(item_ids)s::uuid[])
  AND w.state = %(state)s::item_state
  AND (%(queue)s::text IS NULL OR w.queue = %(queue)s)
  AND w.created_at > %(created_after)s::timestamptz
  AND w.created_at < %(created_before)s::timestamptz
  AND (w.created_at, w.item_id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)
  AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb)
ORDER BY w.created_at, w.item_id
LIMIT %(limit)s;

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

-- name: list_items_created
-- Pages of items: keyset pagination in one of six orders, a statement each: created,
-- priority or attempts (acquisition_count), ascending or descending, ties by (created_at,
-- item_id) in the same direction. Each reads an index range per (state, queue) from the
-- cursor on: ix_work_items_list (tenant_id, state, queue, created_at, item_id) for the
-- created order, ix_work_items_list_priority and ix_work_items_list_attempts (the sort key
-- before created_at) for the others, forward or backward; a page of ready items never
-- reads finished history. The (state, queue) pairs: with a queue, the wanted states of it;
-- without one, a loose index scan (`walked`: one probe per pair, any of these indexes)
-- keeps the wanted states. Every state but leased is in these indexes: leased items (the
-- few the concurrency limit allows) come from ix_work_items_leased and are sorted. Each
-- branch reads up to a page; the union is merged and cut to a page.
-- `w.fence >= 0`, true of every row, is named by these indexes' predicate so that only the
-- scans which say it can take them: never the acquire's lane scan of ready rows (0026).
WITH RECURSIVE walked AS (
    (SELECT w.state, w.queue FROM work_items w
     WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.fence >= 0
     ORDER BY w.state, w.queue LIMIT 1)
    UNION ALL
    SELECT n.state, n.queue FROM walked p CROSS JOIN LATERAL (
        SELECT w.state, w.queue FROM work_items w
        WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.fence >= 0
          AND (w.state, w.queue) > (p.state, p.queue)
        ORDER BY w.state, w.queue LIMIT 1
    ) n
), pairs AS (
    SELECT s.state, %(queue)s::text AS queue
    FROM unnest(%(states)s::item_state[]) AS s(state)
    WHERE %(queue)s::text IS NOT NULL
    UNION ALL
    SELECT p.state, p.queue FROM walked p
    WHERE %(queue)s::text IS NULL AND p.state = ANY(%(states)s::item_state[])
)
SELECT u.* FROM (
(SELECT i.* FROM pairs p CROSS JOIN LATERAL (
    SELECT w.* FROM work_items w
    WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.fence >= 0 AND w.state = p.state
      AND w.queue = p.queue
      AND w.created_at > %(created_after)s::timestamptz
      AND w.created_at < %(created_before)s::timestamptz
      AND (w.created_at, w.item_id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)
      AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb)
    ORDER BY w.created_at, w.item_id
    LIMIT %(limit)s
) i)
UNION ALL
(SELECT w.* FROM work_items w
    WHERE %(leased)s::boolean AND w.tenant_id = %(tenant)s AND w.state = 'leased'
      AND (%(queue)s::text IS NULL OR w.queue = %(queue)s)
      AND w.created_at > %(created_after)s::timestamptz
      AND w.created_at < %(created_before)s::timestamptz
      AND (w.created_at, w.item_id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)
      AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb)
    ORDER BY w.created_at, w.item_id
    LIMIT %(limit)s)
) AS u
ORDER BY u.created_at, u.item_id LIMIT %(limit)s;

-- name: list_items_created_desc
WITH RECURSIVE walked AS (
    (SELECT w.state, w.queue FROM work_items w
     WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.fence >= 0
     ORDER BY w.state, w.queue LIMIT 1)
    UNION ALL
    SELECT n.state, n.queue FROM walked p CROSS JOIN LATERAL (
        SELECT w.state, w.queue FROM work_items w
        WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.fence >= 0
          AND (w.state, w.queue) > (p.state, p.queue)
        ORDER BY w.state, w.queue LIMIT 1
    ) n
), pairs AS (
    SELECT s.state, %(queue)s::text AS queue
    FROM unnest(%(states)s::item_state[]) AS s(state)
    WHERE %(queue)s::text IS NOT NULL
    UNION ALL
    SELECT p.state, p.queue FROM walked p
    WHERE %(queue)s::text IS NULL AND p.state = ANY(%(states)s::item_state[])
)
SELECT u.* FROM (
(SELECT i.* FROM pairs p CROSS JOIN LATERAL (
    SELECT w.* FROM work_items w
    WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.fence >= 0 AND w.state = p.state
      AND w.queue = p.queue
      AND w.created_at > %(created_after)s::timestamptz
      AND w.created_at < %(created_before)s::timestamptz
      AND (w.created_at, w.item_id) < (%(after_at)s::timestamptz, %(after_id)s::uuid)
      AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb)
    ORDER BY w.created_at DESC, w.item_id DESC
    LIMIT %(limit)s
) i)
UNION ALL
(SELECT w.* FROM work_items w
    WHERE %(leased)s::boolean AND w.tenant_id = %(tenant)s AND w.state = 'leased'
      AND (%(queue)s::text IS NULL OR w.queue = %(queue)s)
      AND w.created_at > %(created_after)s::timestamptz
      AND w.created_at < %(created_before)s::timestamptz
      AND (w.created_at, w.item_id) < (%(after_at)s::timestamptz, %(after_id)s::uuid)
      AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb)
    ORDER BY w.created_at DESC, w.item_id DESC
    LIMIT %(limit)s)
) AS u
ORDER BY u.created_at DESC, u.item_id DESC LIMIT %(limit)s;

-- name: list_items_priority
-- The filter is one opaque condition (coalesce: never null anyway): a generic plan then
-- estimates it at a share of the rows, not the sliver of a creation range, and reads the
-- sort key's index in order up to a page instead of sorting ix_work_items_list's slice.
WITH RECURSIVE walked AS (
    (SELECT w.state, w.queue FROM work_items w
     WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.fence >= 0
     ORDER BY w.state, w.queue LIMIT 1)
    UNION ALL
    SELECT n.state, n.queue FROM walked p CROSS JOIN LATERAL (
        SELECT w.state, w.queue FROM work_items w
        WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.fence >= 0
          AND (w.state, w.queue) > (p.state, p.queue)
        ORDER BY w.state, w.queue LIMIT 1
    ) n
), pairs AS (
    SELECT s.state, %(queue)s::text AS queue
    FROM unnest(%(states)s::item_state[]) AS s(state)
    WHERE %(queue)s::text IS NOT NULL
    UNION ALL
    SELECT p.state, p.queue FROM walked p
    WHERE %(queue)s::text IS NULL AND p.state = ANY(%(states)s::item_state[])
)
SELECT u.* FROM (
(SELECT i.* FROM pairs p CROSS JOIN LATERAL (
    SELECT w.* FROM work_items w
    WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.fence >= 0 AND w.state = p.state
      AND w.queue = p.queue
      AND (w.priority, w.created_at, w.item_id)
          > (%(after_key)s::integer, %(after_at)s::timestamptz, %(after_id)s::uuid)
      AND coalesce(w.created_at > %(created_after)s::timestamptz
                   AND w.created_at < %(created_before)s::timestamptz
                   AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb), false)
    ORDER BY w.priority, w.created_at, w.item_id
    LIMIT %(limit)s
) i)
UNION ALL
(SELECT w.* FROM work_items w
    WHERE %(leased)s::boolean AND w.tenant_id = %(tenant)s AND w.state = 'leased'
      AND (%(queue)s::text IS NULL OR w.queue = %(queue)s)
      AND (w.priority, w.created_at, w.item_id)
          > (%(after_key)s::integer, %(after_at)s::timestamptz, %(after_id)s::uuid)
      AND coalesce(w.created_at > %(created_after)s::timestamptz
                   AND w.created_at < %(created_before)s::timestamptz
                   AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb), false)
    ORDER BY w.priority, w.created_at, w.item_id
    LIMIT %(limit)s)
) AS u
ORDER BY u.priority, u.created_at, u.item_id LIMIT %(limit)s;

-- name: list_items_priority_desc
WITH RECURSIVE walked AS (
    (SELECT w.state, w.queue FROM work_items w
     WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.fence >= 0
     ORDER BY w.state, w.queue LIMIT 1)
    UNION ALL
    SELECT n.state, n.queue FROM walked p CROSS JOIN LATERAL (
        SELECT w.state, w.queue FROM work_items w
        WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.fence >= 0
          AND (w.state, w.queue) > (p.state, p.queue)
        ORDER BY w.state, w.queue LIMIT 1
    ) n
), pairs AS (
    SELECT s.state, %(queue)s::text AS queue
    FROM unnest(%(states)s::item_state[]) AS s(state)
    WHERE %(queue)s::text IS NOT NULL
    UNION ALL
    SELECT p.state, p.queue FROM walked p
    WHERE %(queue)s::text IS NULL AND p.state = ANY(%(states)s::item_state[])
)
SELECT u.* FROM (
(SELECT i.* FROM pairs p CROSS JOIN LATERAL (
    SELECT w.* FROM work_items w
    WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.fence >= 0 AND w.state = p.state
      AND w.queue = p.queue
      AND (w.priority, w.created_at, w.item_id)
          < (%(after_key)s::integer, %(after_at)s::timestamptz, %(after_id)s::uuid)
      AND coalesce(w.created_at > %(created_after)s::timestamptz
                   AND w.created_at < %(created_before)s::timestamptz
                   AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb), false)
    ORDER BY w.priority DESC, w.created_at DESC, w.item_id DESC
    LIMIT %(limit)s
) i)
UNION ALL
(SELECT w.* FROM work_items w
    WHERE %(leased)s::boolean AND w.tenant_id = %(tenant)s AND w.state = 'leased'
      AND (%(queue)s::text IS NULL OR w.queue = %(queue)s)
      AND (w.priority, w.created_at, w.item_id)
          < (%(after_key)s::integer, %(after_at)s::timestamptz, %(after_id)s::uuid)
      AND coalesce(w.created_at > %(created_after)s::timestamptz
                   AND w.created_at < %(created_before)s::timestamptz
                   AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb), false)
    ORDER BY w.priority DESC, w.created_at DESC, w.item_id DESC
    LIMIT %(limit)s)
) AS u
ORDER BY u.priority DESC, u.created_at DESC, u.item_id DESC LIMIT %(limit)s;

-- name: list_items_attempts
WITH RECURSIVE walked AS (
    (SELECT w.state, w.queue FROM work_items w
     WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.fence >= 0
     ORDER BY w.state, w.queue LIMIT 1)
    UNION ALL
    SELECT n.state, n.queue FROM walked p CROSS JOIN LATERAL (
        SELECT w.state, w.queue FROM work_items w
        WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.fence >= 0
          AND (w.state, w.queue) > (p.state, p.queue)
        ORDER BY w.state, w.queue LIMIT 1
    ) n
), pairs AS (
    SELECT s.state, %(queue)s::text AS queue
    FROM unnest(%(states)s::item_state[]) AS s(state)
    WHERE %(queue)s::text IS NOT NULL
    UNION ALL
    SELECT p.state, p.queue FROM walked p
    WHERE %(queue)s::text IS NULL AND p.state = ANY(%(states)s::item_state[])
)
SELECT u.* FROM (
(SELECT i.* FROM pairs p CROSS JOIN LATERAL (
    SELECT w.* FROM work_items w
    WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.fence >= 0 AND w.state = p.state
      AND w.queue = p.queue
      AND (w.acquisition_count, w.created_at, w.item_id)
          > (%(after_key)s::integer, %(after_at)s::timestamptz, %(after_id)s::uuid)
      AND coalesce(w.created_at > %(created_after)s::timestamptz
                   AND w.created_at < %(created_before)s::timestamptz
                   AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb), false)
    ORDER BY w.acquisition_count, w.created_at, w.item_id
    LIMIT %(limit)s
) i)
UNION ALL
(SELECT w.* FROM work_items w
    WHERE %(leased)s::boolean AND w.tenant_id = %(tenant)s AND w.state = 'leased'
      AND (%(queue)s::text IS NULL OR w.queue = %(queue)s)
      AND (w.acquisition_count, w.created_at, w.item_id)
          > (%(after_key)s::integer, %(after_at)s::timestamptz, %(after_id)s::uuid)
      AND coalesce(w.created_at > %(created_after)s::timestamptz
                   AND w.created_at < %(created_before)s::timestamptz
                   AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb), false)
    ORDER BY w.acquisition_count, w.created_at, w.item_id
    LIMIT %(limit)s)
) AS u
ORDER BY u.acquisition_count, u.created_at, u.item_id LIMIT %(limit)s;

-- name: list_items_attempts_desc
WITH RECURSIVE walked AS (
    (SELECT w.state, w.queue FROM work_items w
     WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.fence >= 0
     ORDER BY w.state, w.queue LIMIT 1)
    UNION ALL
    SELECT n.state, n.queue FROM walked p CROSS JOIN LATERAL (
        SELECT w.state, w.queue FROM work_items w
        WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.fence >= 0
          AND (w.state, w.queue) > (p.state, p.queue)
        ORDER BY w.state, w.queue LIMIT 1
    ) n
), pairs AS (
    SELECT s.state, %(queue)s::text AS queue
    FROM unnest(%(states)s::item_state[]) AS s(state)
    WHERE %(queue)s::text IS NOT NULL
    UNION ALL
    SELECT p.state, p.queue FROM walked p
    WHERE %(queue)s::text IS NULL AND p.state = ANY(%(states)s::item_state[])
)
SELECT u.* FROM (
(SELECT i.* FROM pairs p CROSS JOIN LATERAL (
    SELECT w.* FROM work_items w
    WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.fence >= 0 AND w.state = p.state
      AND w.queue = p.queue
      AND (w.acquisition_count, w.created_at, w.item_id)
          < (%(after_key)s::integer, %(after_at)s::timestamptz, %(after_id)s::uuid)
      AND coalesce(w.created_at > %(created_after)s::timestamptz
                   AND w.created_at < %(created_before)s::timestamptz
                   AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb), false)
    ORDER BY w.acquisition_count DESC, w.created_at DESC, w.item_id DESC
    LIMIT %(limit)s
) i)
UNION ALL
(SELECT w.* FROM work_items w
    WHERE %(leased)s::boolean AND w.tenant_id = %(tenant)s AND w.state = 'leased'
      AND (%(queue)s::text IS NULL OR w.queue = %(queue)s)
      AND (w.acquisition_count, w.created_at, w.item_id)
          < (%(after_key)s::integer, %(after_at)s::timestamptz, %(after_id)s::uuid)
      AND coalesce(w.created_at > %(created_after)s::timestamptz
                   AND w.created_at < %(created_before)s::timestamptz
                   AND (%(payload)s::jsonb IS NULL OR w.payload @> %(payload)s::jsonb), false)
    ORDER BY w.acquisition_count DESC, w.created_at DESC, w.item_id DESC
    LIMIT %(limit)s)
) AS u
ORDER BY u.acquisition_count DESC, u.created_at DESC, u.item_id DESC LIMIT %(limit)s;
