-- The statements of queue_server/store/cursors.py, run by name. Each `-- name:`
-- block is loaded at import (queue_server/store/sql/__init__.py); the text here is
-- the text sent.

-- name: advance_cursor
-- The connection's next cursor on the queue, read before its acquire (whose leases it must
-- not count as gone: a lease that rolls back is ready again where it was). The active
-- leases (`active_ids`); for leases, the first to expire (`expired_from`, below); for ready
-- rows, per priority:
-- the first ready row visible now, found from the current cursor, among rows made ready
-- since its snapshot (`since_xid`: that snapshot's xmin), or, with no cursor, in the whole
-- ready index; with this statement's xmin, below which every transaction has ended. A row
-- not visible now is made ready by a transaction at or past that xmin: the next acquire
-- finds it by its `placed_xid` wherever it lies.
-- A cursor of a fair queue (`fair`: migration 0040) has a lane per priority and partition
-- key (`key`; '' for items without one), read from the keyed ready index; one of any other
-- queue has a lane per priority (its `key` NULL). `fairness` is the queue's setting now:
-- a cursor made for the other one starts again from the indexes' start (store/cursors.py).
WITH lanes AS (
    SELECT * FROM unnest(%(lane_priority)s::int[], %(lane_key)s::text[],
                         %(lane_at)s::timestamptz[], %(lane_id)s::uuid[])
                  AS l(priority, key, at, id)
), seen AS (
    SELECT f.priority, f.key, f.available_at, f.item_id
    FROM lanes l CROSS JOIN LATERAL (
        (SELECT priority, NULL::text AS key, available_at, item_id FROM work_items
         WHERE l.key IS NULL
           AND tenant_id = %(tenant)s AND queue = %(queue)s AND state = 'ready'
           AND priority = l.priority AND (available_at, item_id) >= (l.at, l.id)
         ORDER BY available_at, item_id
         LIMIT 1)
        UNION ALL
        (SELECT priority, l.key, available_at, item_id FROM work_items
         WHERE l.key IS NOT NULL
           AND tenant_id = %(tenant)s AND queue = %(queue)s AND state = 'ready'
           AND coalesce(partition_key, '') = l.key AND priority = l.priority
           AND (available_at, item_id) >= (l.at, l.id)
         ORDER BY available_at, item_id
         LIMIT 1)
    ) AS f
    UNION ALL
    SELECT priority, CASE WHEN %(fair)s THEN coalesce(partition_key, '') END, available_at,
           item_id
    FROM (
        SELECT tenant_id, queue, priority, partition_key, available_at, item_id
        FROM work_items
        WHERE placed_xid >= %(since_xid)s::xid8 AND placed_xid < %(until_xid)s::xid8
          AND state = 'ready'
        OFFSET 0
    ) AS placed
    WHERE tenant_id = %(tenant)s AND queue = %(queue)s
    UNION ALL
    SELECT priority, NULL, available_at, item_id FROM work_items
    WHERE %(since_xid)s::xid8 IS NULL AND NOT %(fair)s
      AND tenant_id = %(tenant)s AND queue = %(queue)s AND state = 'ready'
    UNION ALL
    -- From the keyed index (its predicate named, so that it may be read), which holds the key.
    SELECT priority, coalesce(partition_key, ''), available_at, item_id FROM work_items
    WHERE %(since_xid)s::xid8 IS NULL AND %(fair)s
      AND tenant_id = %(tenant)s AND queue = %(queue)s AND state = 'ready'
      AND coalesce(partition_key, '') IS NOT NULL
), firsts AS (
    SELECT DISTINCT ON (priority, key) priority, key, available_at, item_id FROM seen
    ORDER BY priority, key, available_at, item_id
), leases AS (
    -- The leases: the first to expire by now from the current cursor, and every lease made
    -- or extended since its snapshot; the cursor is now when none has expired.
    (SELECT lease_expires_at FROM work_items
     WHERE tenant_id = %(tenant)s AND queue = %(queue)s AND state = 'leased'
       AND lease_expires_at >= coalesce(%(expired_from)s::timestamptz, '-infinity')
       AND lease_expires_at <= statement_timestamp()
     ORDER BY lease_expires_at
     LIMIT 1)
    UNION ALL
    SELECT lease_expires_at FROM (
        SELECT tenant_id, queue, lease_expires_at FROM work_items
        WHERE placed_xid >= %(since_xid)s::xid8 AND placed_xid < %(until_xid)s::xid8
          AND state = 'leased'
        OFFSET 0
    ) AS placed
    WHERE tenant_id = %(tenant)s AND queue = %(queue)s
), active AS (
    -- The active leases now, found as the acquire's count finds them.
    SELECT item_id FROM (
        SELECT item_id, queue, state, lease_expires_at FROM work_items
        WHERE tenant_id = %(tenant)s AND item_id = ANY(%(active_ids)s::uuid[])
        OFFSET 0
    ) AS seen
    WHERE queue = %(queue)s AND state = 'leased' AND lease_expires_at > statement_timestamp()
    UNION
    SELECT item_id FROM (
        SELECT item_id, tenant_id, queue, lease_expires_at FROM work_items
        WHERE placed_xid >= %(since_xid)s::xid8 AND placed_xid < %(until_xid)s::xid8
          AND state = 'leased'
        OFFSET 0
    ) AS placed
    WHERE tenant_id = %(tenant)s AND queue = %(queue)s
      AND lease_expires_at > statement_timestamp()
    UNION
    SELECT item_id FROM work_items
    WHERE %(since_xid)s::xid8 IS NULL
      AND tenant_id = %(tenant)s AND queue = %(queue)s AND state = 'leased'
      AND lease_expires_at > statement_timestamp()
)
SELECT pg_snapshot_xmin(pg_current_snapshot())::text AS xmin,
       -- The running server (store/cursors.py shares a cursor among connections to it).
       pg_postmaster_start_time()::text AS server,
       coalesce(array_agg(priority ORDER BY priority, key), '{}') AS priorities,
       coalesce(array_agg(key ORDER BY priority, key), '{}') AS keys,
       coalesce(array_agg(available_at ORDER BY priority, key), '{}') AS ats,
       coalesce(array_agg(item_id ORDER BY priority, key), '{}') AS ids,
       least(statement_timestamp(), (SELECT min(lease_expires_at) FROM leases)) AS expired_from,
       ARRAY(SELECT item_id FROM active) AS active_ids,
       coalesce((SELECT fairness FROM queues WHERE tenant_id = %(tenant)s AND queue = %(queue)s),
                'arrival') AS fairness
FROM firsts;

-- name: server_started
-- The running server a connection reached: its cursors are shared with the others to it.
SELECT pg_postmaster_start_time()::text;
