-- The statements of queue_server/store/transitions.py, run by name. Each `-- name:`
-- block is loaded at import (queue_server/store/sql/__init__.py); the text here is
-- the text sent.

-- name: enqueue
-- (nothing) -> ready: the one admission (queue_server.admit, migrations 0017 and 0028),
-- shared with queue_server.enqueue (an application's own transaction): the tenant's
-- admission shards (locked until the transaction ends, passing over those another holds),
-- the backlog cap, the items, their `enqueued` ledger rows, the outbox rows, the admitted
-- counters and the NOTIFY. Refusals are SQL errors (QS429 at the cap, QS404 no tenant).
SELECT * FROM queue_server.admit(%(tenant)s, %(queue)s, %(items)s::jsonb, %(actor)s,
                                 %(attempt_cap)s, %(backlog_ceiling)s);

-- name: enqueue_rows
-- The same admission (queue_server.admit_rows), telling only what the answer cannot know
-- before: each item's budget (a default is the queue's or the tenant's) and instants;
-- after them, the items holding the unique keys it did not admit (migration 0030); and
-- each item's state (an item behind others of its ordering key waits: migration 0031).
SELECT item_id::text AS item_id, max_acquisitions, available_at, created_at, unique_key,
       state::text AS state
FROM queue_server.admit_rows(%(tenant)s, %(queue)s, %(items)s::jsonb, %(actor)s,
                             %(attempt_cap)s, %(backlog_ceiling)s);

-- name: lock_queue
-- The queue's concurrency limit (the policy's local concurrency, one, unless a live spend
-- approval raises it: the base_limit parameter; the queue's own concurrency below that) is
-- enforced under an advisory lock on the queue.
-- Exclusive: the acquire counts active leases exactly, with every earlier acquire
-- committed. Shared (many acquires at once): each also holds, until it commits, a shared
-- lock keyed (queue, max_items) that announces how many leases it may add; it leases
-- only while the room left is at least what every acquire in flight announced, its own
-- included (`in_flight`). An exclusive acquire waits for them all.
SELECT pg_advisory_xact_lock(hashtextextended(%(tenant)s || '/' || %(queue)s, 7));

-- name: lock_queue_shared
SELECT pg_advisory_xact_lock_shared(hashtextextended(%(tenant)s || '/' || %(queue)s, 7)),
       pg_advisory_xact_lock_shared(hashtext(%(tenant)s || '/' || %(queue)s), %(max_items)s);

-- name: in_flight
-- What the shared acquires in flight on the queue announced (each holder's max_items),
-- kept for the acquire statement that follows in this transaction. Read in a statement of
-- its own, before that statement's snapshot: an acquire that commits between the two is
-- counted twice (announced here, its leases visible there), never missed. A hash shared
-- with another queue only counts more.
SELECT set_config('queue_server.in_flight', (
    SELECT coalesce(sum(objid::int), 0) FROM pg_locks
    WHERE locktype = 'advisory' AND objsubid = 2 AND mode = 'ShareLock' AND granted
      AND classid = hashtext(%(tenant)s || '/' || %(queue)s)::oid
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
)::text, true);

-- name: acquire
-- A line that ends in `--@acquire_rated` is the rate-limited queue's statement's alone, one
-- that ends in `--@acquire` this one's (store/sql/__init__.py: a block's variants).
-- The acquire of a rate-limited queue: `acquire`, with the queue's rate limit (migration  --@acquire_rated
-- 0032). Kept apart so that every other queue's acquire pays nothing for it.  --@acquire_rated
-- Runs after the lock in its own statement, so its snapshot sees every lease
-- committed by the acquires that held the lock exclusively before us.
-- A lease lives at most its deadline from this acquisition (`lease_deadline_at`);
-- its expiry never passes that instant (a CHECK constraint holds it).
WITH terms AS (
    -- The lease's TTL: the request's, else the queue's, else the tenant's default; its
    -- deadline: the queue's, else the policy's. Neither above the loaded policy's (a value
    -- stored under a looser one is held to it).
    SELECT least(coalesce(%(ttl)s::interval, q.lease_ttl, t.default_lease_ttl),
                 %(max_ttl)s::interval) AS ttl,
           least(coalesce(q.deadline, %(deadline)s::interval), %(deadline)s::interval)
               AS deadline
    FROM tenants t LEFT JOIN queues q ON q.tenant_id = t.tenant_id AND q.queue = %(queue)s
    WHERE t.tenant_id = %(tenant)s
), rate AS (  --@acquire_rated
    -- The queue's rate limit (migration 0032): at most `lim` leases in any `per`, over the  --@acquire_rated
    -- whole queue, or per partition key (`by_key`). No row: none.  --@acquire_rated
    SELECT rate_limit AS lim, rate_interval AS per, rate_partitioned AS by_key  --@acquire_rated
    FROM queues  --@acquire_rated
    WHERE tenant_id = %(tenant)s AND queue = %(queue)s AND rate_limit IS NOT NULL  --@acquire_rated
), counts AS MATERIALIZED (
    -- The limit: the queue's concurrency (an operator's setting; NULL: none) held to the
    -- approved limit, a live approval's (neither expired nor revoked; one stored under a
    -- looser policy is held to the loaded one's max-approved), else the policy's base.
    -- least() ignores a NULL: no setting, or no ceiling given.
    SELECT least(coalesce((SELECT max(least(max_concurrency, %(max_approved)s))
                           FROM spend_approvals
                           WHERE tenant_id = %(tenant)s AND queue = %(queue)s
                             AND expires_at > statement_timestamp()
                             AND revoked_at IS NULL), %(base_limit)s),
                 (SELECT concurrency FROM queues
                  WHERE tenant_id = %(tenant)s AND queue = %(queue)s))
           -- The active leases: those the cursor's snapshot saw active, each probed by its
           -- key, and those made or extended since (`placed_xid`); with no cursor, every
           -- lease. A scan of the leased index would also walk every lease ended within a
           -- TTL, which an old snapshot keeps there. Rows placed since are read from the
           -- `placed_xid` index alone (`OFFSET 0` keeps the tenant and queue outside: the
           -- planner could otherwise walk the leased or ready index for them).
           - (SELECT count(DISTINCT item_id) FROM (
                  SELECT item_id FROM (
                      -- By key alone (`OFFSET 0` keeps the checks outside): with the
                      -- queue and state beside it, the planner may walk the leased index.
                      SELECT item_id, queue, state, lease_expires_at FROM work_items
                      WHERE tenant_id = %(tenant)s AND item_id = ANY(%(active_ids)s::uuid[])
                      OFFSET 0
                  ) AS seen
                  WHERE queue = %(queue)s AND state = 'leased'
                    AND lease_expires_at > statement_timestamp()
                  UNION ALL
                  SELECT item_id FROM (
                      SELECT item_id, tenant_id, queue, lease_expires_at FROM work_items
                      WHERE placed_xid >= %(since_xid)s::xid8 AND placed_xid < %(until_xid)s::xid8
                        AND state = 'leased'
                      OFFSET 0
                  ) AS since
                  WHERE tenant_id = %(tenant)s AND queue = %(queue)s
                    AND lease_expires_at > statement_timestamp()
                  UNION ALL
                  SELECT item_id FROM work_items
                  WHERE %(since_xid)s::xid8 IS NULL
                    AND tenant_id = %(tenant)s AND queue = %(queue)s AND state = 'leased'
                    AND lease_expires_at > statement_timestamp()
              ) AS active) AS free,
           -- A paused queue hands out nothing; pause takes this queue's lock exclusively.
           EXISTS (SELECT 1 FROM queues WHERE tenant_id = %(tenant)s AND queue = %(queue)s
                   AND paused_at IS NOT NULL) AS paused,  --@acquire
           -- A rate-limited queue (migration 0032), or a fair one (0040), is acquired by  --@acquire
           -- `acquire_rated`.  --@acquire
           EXISTS (SELECT 1 FROM queues WHERE tenant_id = %(tenant)s AND queue = %(queue)s  --@acquire
                   AND (rate_limit IS NOT NULL OR fairness <> 'arrival')) AS rated  --@acquire
                   AND paused_at IS NOT NULL) AS paused  --@acquire_rated
), room AS (
    SELECT CASE WHEN contended OR paused THEN 0  --@acquire
                ELSE greatest(0, least(%(max_items)s, free)) END AS n,  --@acquire
           contended  --@acquire
    FROM (SELECT free, paused,  --@acquire
                 NOT paused  --@acquire
                 AND (rated  --@acquire
                      OR %(shared)s  --@acquire
                      -- Unread (not shared, or no in_flight): as if no room, never as if all.  --@acquire
                      AND free < coalesce(nullif(current_setting('queue_server.in_flight',  --@acquire
                                                                 true), '')::int,  --@acquire
                                          2147483647)) AS contended  --@acquire
          FROM counts) AS c  --@acquire
    -- `n` leases at most; `m` candidates read for them: more under a rate limit per  --@acquire_rated
    -- partition key, whose keys at their limit are passed over (ten times, at most 1,000).  --@acquire_rated
    SELECT n, CASE WHEN keyed THEN least(n * 10, 1000) ELSE n END AS m, contended, keyed  --@acquire_rated
    FROM (  --@acquire_rated
        SELECT CASE WHEN contended OR paused THEN 0  --@acquire_rated
                    ELSE greatest(0, least(%(max_items)s, free, whole)) END AS n,  --@acquire_rated
               contended, keyed  --@acquire_rated
        FROM (SELECT free, paused,  --@acquire_rated
                     -- The room the whole queue's rate limit leaves (NULL: none): the  --@acquire_rated
                     -- limit less the grants of the last interval, a range of their index.  --@acquire_rated
                     (SELECT r.lim - coalesce((SELECT sum(g.n) FROM rate_grants g  --@acquire_rated
                                               WHERE g.tenant_id = %(tenant)s  --@acquire_rated
                                                 AND g.queue = %(queue)s  --@acquire_rated
                                                 AND g.partition_key = ''  --@acquire_rated
                                                 AND g.granted_at > statement_timestamp() - r.per),  --@acquire_rated
                                              0)  --@acquire_rated
                      FROM rate r WHERE NOT r.by_key) AS whole,  --@acquire_rated
                     EXISTS (SELECT 1 FROM rate WHERE by_key) AS keyed,  --@acquire_rated
                     -- Run under the exclusive lock alone, so that no two acquires count the  --@acquire_rated
                     -- same room: under the shared one it leases nothing and says so.  --@acquire_rated
                     NOT paused AND %(shared)s AS contended  --@acquire_rated
              FROM counts) AS c  --@acquire_rated
    ) AS r  --@acquire_rated
), expired AS (
    -- SKIP LOCKED: a row locked by a holder operation in flight is not ours to take.
    -- From the connection's cursor (no lease it could see expired before it; with no
    -- cursor, the leased index from its start), and the leases made or extended by a
    -- transaction its snapshot did not see, by their `placed_xid`: as for ready rows below.
    SELECT * FROM (
        SELECT item_id, 0 AS src, 0 AS priority, lease_expires_at AS since,  --@acquire
        SELECT item_id, 0 AS src, 0 AS priority, lease_expires_at AS since, partition_key AS pkey,  --@acquire_rated
               lease_expires_at >= lease_deadline_at AS at_deadline, lease_holder AS holder,
               lease_deadline_at AS deadline_at
        FROM work_items
        WHERE tenant_id = %(tenant)s AND queue = %(queue)s AND state = 'leased'
          AND lease_expires_at >= coalesce(%(expired_from)s::timestamptz, '-infinity')
          AND lease_expires_at <= statement_timestamp()
        ORDER BY lease_expires_at
        LIMIT (SELECT n FROM room)  --@acquire
        LIMIT (SELECT m FROM room)  --@acquire_rated
        FOR UPDATE SKIP LOCKED
    ) AS resumed
    UNION
    -- The leases placed since the cursor's snapshot that have expired by now (few), locked
    -- by their keys alone, then checked.
    SELECT * FROM (
        SELECT item_id, 0 AS src, 0 AS priority, lease_expires_at AS since,  --@acquire
        SELECT item_id, 0 AS src, 0 AS priority, lease_expires_at AS since, partition_key AS pkey,  --@acquire_rated
               lease_expires_at >= lease_deadline_at AS at_deadline, lease_holder AS holder,
               lease_deadline_at AS deadline_at
        FROM (
            SELECT * FROM work_items
            WHERE tenant_id = %(tenant)s
              AND item_id = ANY(ARRAY(
                  SELECT item_id FROM (
                      SELECT item_id, tenant_id, queue, lease_expires_at FROM work_items
                      WHERE placed_xid >= %(since_xid)s::xid8 AND placed_xid < %(until_xid)s::xid8
                        AND state = 'leased'
                      OFFSET 0
                  ) AS placed
                  WHERE tenant_id = %(tenant)s AND queue = %(queue)s
                    AND lease_expires_at <= statement_timestamp()))
            FOR UPDATE SKIP LOCKED
            OFFSET 0  -- keeps the checks below out of this scan
        ) AS w
        WHERE queue = %(queue)s AND state = 'leased' AND lease_expires_at <= statement_timestamp()
        ORDER BY lease_expires_at
        LIMIT (SELECT n FROM room)  --@acquire
        LIMIT (SELECT m FROM room)  --@acquire_rated
    ) AS late
), lanes AS (
    -- The connection's cursor on this queue (queue_server/store/cursors.py): per priority,
    -- the first ready row it saw; no ready row it could see lay before it. A fair queue's
    -- (0040) has a lane per priority and partition key (`key`; '' for none), in the order
    -- its keys take their turns (`ord`: the one served longest ago first); the first of
    -- them only, and with each its priority's number of keys (`width`).
    SELECT * FROM unnest(%(lane_priority)s::int[], %(lane_key)s::text[],
                         %(lane_at)s::timestamptz[], %(lane_id)s::uuid[],
                         %(lane_width)s::int[])
                  WITH ORDINALITY AS l(priority, key, at, id, width, ord)
), fair AS (  --@acquire_rated
    -- Round-robin between partition keys (0040): each key's first due item, in the keys'  --@acquire_rated
    -- turns, then each key's second, ...  --@acquire_rated
    SELECT EXISTS (SELECT 1 FROM queues WHERE tenant_id = %(tenant)s AND queue = %(queue)s  --@acquire_rated
                   AND fairness = 'partition_key') AS by_key  --@acquire_rated
), due AS (
    -- With no cursor yet: the ready index from its start (what the cursor spares: under an
    -- old snapshot, every row taken since it began left an entry there to walk past).
    SELECT * FROM (
        SELECT item_id, 1 AS src, priority, available_at AS since  --@acquire
        SELECT item_id, 1 AS src, priority, available_at AS since, partition_key AS pkey  --@acquire_rated
        FROM work_items
        WHERE %(since_xid)s::xid8 IS NULL
          AND tenant_id = %(tenant)s AND queue = %(queue)s AND state = 'ready'
          AND available_at <= statement_timestamp()
        ORDER BY priority DESC, available_at, item_id
        LIMIT (SELECT n FROM room)  --@acquire
        LIMIT (SELECT m FROM room)  --@acquire_rated
        FOR UPDATE SKIP LOCKED
    ) AS cold
    UNION ALL
    -- Each priority the cursor knows, from its place: the highest first, and no lower one
    -- read once `n` rows are found.
    SELECT * FROM (  --@acquire
        SELECT d.* FROM (SELECT * FROM lanes ORDER BY priority DESC) AS l  --@acquire
        CROSS JOIN LATERAL (  --@acquire
            SELECT item_id, 1 AS src, priority, available_at AS since  --@acquire
            FROM work_items  --@acquire
            WHERE tenant_id = %(tenant)s AND queue = %(queue)s AND state = 'ready'  --@acquire
              AND priority = l.priority AND (available_at, item_id) >= (l.at, l.id)  --@acquire
              AND available_at <= statement_timestamp()  --@acquire
            ORDER BY available_at, item_id  --@acquire
            LIMIT (SELECT n FROM room)  --@acquire
            FOR UPDATE SKIP LOCKED  --@acquire
        ) AS d  --@acquire
        LIMIT (SELECT n FROM room)  --@acquire
    ) AS resumed  --@acquire
    -- A fair queue's lanes are per key: each of a priority's keys gives its share of the  --@acquire_rated
    -- room (over `width`, the priority's keys), in their turns; then, as far as the room  --@acquire_rated
    -- is not filled, the keys in turn give more (`filled`: a key with few items leaves  --@acquire_rated
    -- its share to the others). No lane is read once enough rows are found.  --@acquire_rated
    SELECT * FROM (  --@acquire_rated
        SELECT d.* FROM (SELECT * FROM lanes ORDER BY priority DESC, ord) AS l  --@acquire_rated
        CROSS JOIN LATERAL (  --@acquire_rated
            SELECT * FROM (  --@acquire_rated
                SELECT item_id, 1 AS src, priority, available_at AS since, partition_key AS pkey  --@acquire_rated
                FROM work_items  --@acquire_rated
                WHERE l.key IS NULL  --@acquire_rated
                  AND tenant_id = %(tenant)s AND queue = %(queue)s AND state = 'ready'  --@acquire_rated
                  AND priority = l.priority AND (available_at, item_id) >= (l.at, l.id)  --@acquire_rated
                  AND available_at <= statement_timestamp()  --@acquire_rated
                ORDER BY available_at, item_id  --@acquire_rated
                LIMIT (SELECT m FROM room)  --@acquire_rated
                FOR UPDATE SKIP LOCKED  --@acquire_rated
            ) AS whole  --@acquire_rated
            UNION ALL  --@acquire_rated
            SELECT * FROM (  --@acquire_rated
                SELECT item_id, 1 AS src, priority, available_at AS since, partition_key AS pkey  --@acquire_rated
                FROM work_items  --@acquire_rated
                WHERE l.key IS NOT NULL  --@acquire_rated
                  AND tenant_id = %(tenant)s AND queue = %(queue)s AND state = 'ready'  --@acquire_rated
                  AND coalesce(partition_key, '') = l.key AND priority = l.priority  --@acquire_rated
                  AND (available_at, item_id) >= (l.at, l.id)  --@acquire_rated
                  AND available_at <= statement_timestamp()  --@acquire_rated
                ORDER BY available_at, item_id  --@acquire_rated
                LIMIT ceil((SELECT m FROM room)::numeric / l.width)::int  --@acquire_rated
                FOR UPDATE SKIP LOCKED  --@acquire_rated
            ) AS shared  --@acquire_rated
        ) AS d  --@acquire_rated
        -- Twice the room when fair: where a priority's rows end within it, the next  --@acquire_rated
        -- priority's keys each give their share too, not the first of them all of it.  --@acquire_rated
        LIMIT (SELECT m FROM room) * (1 + (SELECT by_key FROM fair)::int)  --@acquire_rated
    ) AS resumed  --@acquire_rated
    UNION ALL  --@acquire_rated
    SELECT * FROM (  --@acquire_rated
        SELECT d.* FROM (SELECT * FROM lanes WHERE key IS NOT NULL  --@acquire_rated
                         ORDER BY priority DESC, ord) AS l  --@acquire_rated
        CROSS JOIN LATERAL (  --@acquire_rated
            SELECT item_id, 1 AS src, priority, available_at AS since, partition_key AS pkey  --@acquire_rated
            FROM work_items  --@acquire_rated
            WHERE tenant_id = %(tenant)s AND queue = %(queue)s AND state = 'ready'  --@acquire_rated
              AND coalesce(partition_key, '') = l.key AND priority = l.priority  --@acquire_rated
              AND (available_at, item_id) >= (l.at, l.id)  --@acquire_rated
              AND available_at <= statement_timestamp()  --@acquire_rated
            ORDER BY available_at, item_id  --@acquire_rated
            LIMIT (SELECT m FROM room)  --@acquire_rated
            FOR UPDATE SKIP LOCKED  --@acquire_rated
        ) AS d  --@acquire_rated
        LIMIT (SELECT m FROM room)  --@acquire_rated
    ) AS filled  --@acquire_rated
    UNION ALL
    -- Rows made ready by a transaction the cursor's snapshot did not see (committed late,
    -- behind the cursor, or of a priority it did not know), found by that transaction's id.
    -- The first of them in acquire order (a few, unlocked), then locked by their keys alone
    -- and checked: no other index can serve either step.
    SELECT * FROM (
        SELECT item_id, 1 AS src, priority, available_at AS since  --@acquire
        SELECT item_id, 1 AS src, priority, available_at AS since, partition_key AS pkey  --@acquire_rated
        FROM (
            SELECT * FROM work_items
            WHERE tenant_id = %(tenant)s
              AND item_id = ANY(ARRAY(
                  SELECT item_id FROM (
                      SELECT item_id, tenant_id, queue, priority, available_at FROM work_items  --@acquire
                      SELECT item_id, tenant_id, queue, priority, available_at,  --@acquire_rated
                             coalesce(partition_key, '') AS pkey FROM work_items  --@acquire_rated
                      WHERE placed_xid >= %(since_xid)s::xid8 AND placed_xid < %(until_xid)s::xid8
                        AND state = 'ready'
                      OFFSET 0
                  ) AS placed
                  WHERE tenant_id = %(tenant)s AND queue = %(queue)s
                    AND available_at <= statement_timestamp()
                  ORDER BY priority DESC, available_at, item_id  --@acquire
                  -- In a fair queue, each key's first before any key's second: a key new  --@acquire_rated
                  -- since the cursor's snapshot has its turn beside the flood of another.  --@acquire_rated
                  ORDER BY priority DESC,  --@acquire_rated
                           CASE WHEN (SELECT by_key FROM fair) THEN  --@acquire_rated
                               row_number() OVER (PARTITION BY priority, pkey  --@acquire_rated
                                                  ORDER BY available_at, item_id) END,  --@acquire_rated
                           available_at, item_id  --@acquire_rated
                  LIMIT (SELECT n FROM room)))  --@acquire
                  LIMIT (SELECT m FROM room)))  --@acquire_rated
            FOR UPDATE SKIP LOCKED
            OFFSET 0  -- keeps the checks below out of this scan
        ) AS w
        WHERE queue = %(queue)s AND state = 'ready' AND available_at <= statement_timestamp()
        ORDER BY priority DESC, available_at, item_id
    ) AS late
), more AS (  --@acquire_rated
    -- A fair queue's acquire is sent the lanes of the keys whose turn is next only  --@acquire_rated
    -- (store/cursors.py); when they hold less than the room, the others' items are read too,  --@acquire_rated
    -- per priority from the first of all its keys' places (`floor`: no ready row the cursor  --@acquire_rated
    -- could see lay before it), in acquire order: an acquire never answers with less than  --@acquire_rated
    -- the queue has due because the keys it was sent had nothing.  --@acquire_rated
    SELECT d.* FROM unnest(%(floor_priority)s::int[], %(floor_at)s::timestamptz[],  --@acquire_rated
                           %(floor_id)s::uuid[]) AS l(priority, at, id)  --@acquire_rated
    CROSS JOIN LATERAL (  --@acquire_rated
        SELECT item_id, 1 AS src, priority, available_at AS since, partition_key AS pkey  --@acquire_rated
        FROM work_items  --@acquire_rated
        WHERE tenant_id = %(tenant)s AND queue = %(queue)s AND state = 'ready'  --@acquire_rated
          AND priority = l.priority AND (available_at, item_id) >= (l.at, l.id)  --@acquire_rated
          AND available_at <= statement_timestamp()  --@acquire_rated
        ORDER BY available_at, item_id  --@acquire_rated
        LIMIT (SELECT m FROM room)  --@acquire_rated
        FOR UPDATE SKIP LOCKED  --@acquire_rated
    ) AS d  --@acquire_rated
    WHERE (SELECT count(*) FROM due) < (SELECT m FROM room)  --@acquire_rated
), picked AS (
    -- A row both resumed and late is one candidate.  --@acquire
    SELECT item_id FROM (SELECT DISTINCT item_id, src, priority, since  --@acquire
                         FROM (SELECT item_id, src, priority, since FROM expired  --@acquire
                               UNION ALL SELECT * FROM due) AS a) AS c  --@acquire
    -- A row both resumed and late is one candidate. Under a rate limit per partition key,  --@acquire_rated
    -- each key's candidates in order, as many as the room its grants of the last interval  --@acquire_rated
    -- leave (no key: the key '').  --@acquire_rated
    -- In a fair queue (0040), each key's nth candidate of a priority (`round`) goes before  --@acquire_rated
    -- any key's next, in the keys' turns; a key whose lane was not sent (its turn is not  --@acquire_rated
    -- next, or it is new since the last look) after those sent, so that one whose items keep  --@acquire_rated
    -- coming does not take a place at every acquire from the rows made ready since.  --@acquire_rated
    SELECT item_id FROM (  --@acquire_rated
        SELECT c.*, row_number() OVER (PARTITION BY c.pkey  --@acquire_rated
                                       ORDER BY c.src, c.priority DESC, c.since, c.item_id)  --@acquire_rated
                        AS nth,  --@acquire_rated
               CASE WHEN (SELECT by_key FROM fair) THEN  --@acquire_rated
                   row_number() OVER (PARTITION BY c.src, c.priority, c.pkey  --@acquire_rated
                                      ORDER BY c.since, c.item_id) END AS round,  --@acquire_rated
               CASE WHEN (SELECT by_key FROM fair) THEN  --@acquire_rated
                   coalesce((SELECT min(l.ord) FROM lanes l  --@acquire_rated
                             WHERE l.priority = c.priority AND l.key = c.pkey),  --@acquire_rated
                            2147483647) END AS turn  --@acquire_rated
        FROM (SELECT DISTINCT item_id, src, priority, since, coalesce(pkey, '') AS pkey  --@acquire_rated
              FROM (SELECT item_id, src, priority, since, pkey FROM expired  --@acquire_rated
                    UNION ALL SELECT * FROM due UNION ALL SELECT * FROM more) AS a) AS c  --@acquire_rated
    ) AS c  --@acquire_rated
    WHERE NOT (SELECT keyed FROM room)  --@acquire_rated
       OR c.nth <= (SELECT r.lim - coalesce((SELECT sum(g.n) FROM rate_grants g  --@acquire_rated
                                             WHERE g.tenant_id = %(tenant)s  --@acquire_rated
                                               AND g.queue = %(queue)s  --@acquire_rated
                                               AND g.partition_key = c.pkey  --@acquire_rated
                                               AND g.granted_at  --@acquire_rated
                                                   > statement_timestamp() - r.per), 0)  --@acquire_rated
                    FROM rate r)  --@acquire_rated
    ORDER BY src, priority DESC, since, item_id  --@acquire
    ORDER BY src, priority DESC, round, turn, since, item_id  --@acquire_rated
    LIMIT (SELECT n FROM room)
), overdue AS (
    -- Picked leases that ran to their deadline: each gets a deadline_exceeded event, and
    -- the attempt's failure (its holder never finished it) as its last_failure.
    SELECT item_id, holder, deadline_at,
           jsonb_build_object('class', 'LeaseDeadlineExceeded', 'transient', true,
                              'message', 'the lease held by ' || holder
                                         || ' ran to its deadline at '
                                         || api_timestamp(deadline_at)) AS failure
    FROM expired
    WHERE at_deadline AND item_id = ANY(ARRAY(SELECT item_id FROM picked))
), leased AS (
    UPDATE work_items w
    SET state = 'leased', fence = w.fence + 1, acquisition_count = w.acquisition_count + 1,
        lease_holder = %(worker)s,
        lease_key_id = %(key_id)s,
        lease_expires_at = statement_timestamp() + (SELECT least(ttl, deadline) FROM terms),
        lease_deadline_at = statement_timestamp() + (SELECT deadline FROM terms),
        leased_at = statement_timestamp(), updated_at = statement_timestamp(),
        last_failure = coalesce((SELECT failure FROM overdue o WHERE o.item_id = w.item_id),
                                w.last_failure),
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
        last_failure = coalesce((SELECT failure FROM overdue o WHERE o.item_id = w.item_id),
                                w.last_failure),
        event_seq = w.event_seq + 1 + (w.item_id = ANY(ARRAY(SELECT item_id FROM overdue)))::int
    -- An array, not a join: the planner cannot tell how few rows `picked` has, and a
    -- join would hash the whole table; `= ANY(array)` probes the primary key per item.
    WHERE w.tenant_id = %(tenant)s AND w.item_id = ANY(ARRAY(SELECT item_id FROM picked))
      AND w.acquisition_count >= w.max_acquisitions
    RETURNING w.*
), dead AS (
    INSERT INTO dead_letters (tenant_id, kind, item_id, queue, reason, last_failure, created_at)
    SELECT tenant_id, 'item', item_id, queue, 'acquisition budget exhausted', last_failure,
           statement_timestamp()
    FROM quarantined
), ev AS (
    -- A lease that ran to its deadline is recorded before its takeover (or quarantine).
    INSERT INTO item_events (tenant_id, item_id, seq, at, kind, fence, actor, data)
    SELECT o.tenant_id, o.item_id, o.event_seq - 2, o.updated_at, 'deadline_exceeded',
           o.overdue_fence, 'server',
           jsonb_build_object('lease_holder', o.holder, 'lease_deadline_at', o.deadline_at,
                              'failure', o.last_failure)
    FROM (SELECT l.*, l.fence - 1 AS overdue_fence, d.holder, d.deadline_at
          FROM leased l JOIN overdue d USING (item_id)
          UNION ALL
          SELECT q.*, q.fence AS overdue_fence, d.holder, d.deadline_at
          FROM quarantined q JOIN overdue d USING (item_id)) AS o
    UNION ALL
    SELECT tenant_id, item_id, event_seq - 1, updated_at, 'acquired', fence, %(worker)s,
           jsonb_build_object('lease_holder', lease_holder,
                              'lease_expires_at', lease_expires_at,
                              'lease_deadline_at', lease_deadline_at,
                              'acquisition_count', acquisition_count)
    FROM leased
    UNION ALL
    SELECT tenant_id, item_id, event_seq - 1, updated_at, 'quarantined', fence, 'server',
           jsonb_build_object('reason', 'acquisition budget exhausted')
    FROM quarantined
), granted AS (  --@acquire_rated
    -- A rate-limited queue's leases, in its window: per partition key, or the queue's ''.  --@acquire_rated
    INSERT INTO rate_grants (tenant_id, queue, partition_key, granted_at, n)  --@acquire_rated
    SELECT %(tenant)s, %(queue)s, k, statement_timestamp(), count(*)  --@acquire_rated
    FROM (SELECT CASE WHEN r.by_key THEN coalesce(l.partition_key, '') ELSE '' END AS k  --@acquire_rated
          FROM leased l CROSS JOIN rate r) AS s  --@acquire_rated
    GROUP BY k  --@acquire_rated
), counted AS (
    -- Out of the backlog.
    INSERT INTO counter_deltas (tenant_id, queue, shard, released, quarantined)
    SELECT tenant_id, queue, admission_shard, count(*), count(*)
    FROM quarantined GROUP BY tenant_id, queue, admission_shard
), outbox AS (
    INSERT INTO outbox_deliveries (tenant_id, watcher_id, delivery_key, event, item_id, queue,
                                   body, state, next_attempt_at, due_at, created_at, updated_at)
    SELECT s.tenant_id, w.watcher_id, delivery_key(w.watcher_id, s.item_id, s.event_seq - 1),
           'item.quarantined', s.item_id, s.queue,
           jsonb_build_object('event', 'item.quarantined',
                              'occurred_at', api_timestamp(statement_timestamp()),
                              'item', item_json(s)),
           'pending', statement_timestamp(), statement_timestamp(), statement_timestamp(),
           statement_timestamp()
    FROM quarantined s
    JOIN watchers w ON w.tenant_id = s.tenant_id AND w.state = 'active'
     AND 'item.quarantined' = ANY(w.events) AND (w.queues IS NULL OR s.queue = ANY(w.queues))
    ORDER BY s.item_id, w.watcher_id
)
-- The answer: what a lease says (views.lease), its wait (metrics: available_at to
-- leased_at) and a fair queue's turn (partition_key); not every column (the others were a
-- third of the server's CPU in reading the answer).
SELECT true AS leased, item_id, fence, acquisition_count, lease_expires_at,
       lease_deadline_at, payload, priority, queue, available_at, leased_at, created_at,
       traceparent, tracestate, partition_key
FROM leased
UNION ALL
SELECT false AS leased, item_id, fence, acquisition_count, lease_expires_at,
       lease_deadline_at, payload, priority, queue, available_at, leased_at, created_at,
       traceparent, tracestate, partition_key
FROM quarantined
UNION ALL
-- Under the shared lock with little room left: nothing leased, retry exclusively.
SELECT NULL AS leased, w.item_id, w.fence, w.acquisition_count, w.lease_expires_at,
       w.lease_deadline_at, w.payload, w.priority, w.queue, w.available_at, w.leased_at,
       w.created_at, w.traceparent, w.tracestate, w.partition_key
FROM (SELECT 1) AS one LEFT JOIN work_items w ON false
WHERE (SELECT contended FROM room);

-- name: release_unsent
WITH input AS (
    SELECT * FROM jsonb_to_recordset(%(leases)s::jsonb) AS x(item_id uuid, fence bigint)
), upd AS (
    UPDATE work_items w
    SET state = 'ready', available_at = statement_timestamp(), lease_holder = NULL,
        lease_expires_at = NULL, acquisition_count = w.acquisition_count - 1,
        updated_at = statement_timestamp(), event_seq = w.event_seq + 1
    FROM input i
    -- Each row by its key: `state::text` keeps the partial indexes of leased rows out of
    -- the plan (a generic plan would read every lease not yet expired, and while an old
    -- snapshot is held, every lease that ended within a TTL).
    WHERE w.tenant_id = %(tenant)s AND w.item_id = ANY(%(ids)s::uuid[]) AND w.item_id = i.item_id
      AND w.state::text = 'leased' AND w.fence = i.fence AND w.lease_holder = %(worker)s
      AND coalesce(w.lease_key_id, %(key_id)s) = %(key_id)s
    RETURNING w.*
), ev AS (
    INSERT INTO item_events (tenant_id, item_id, seq, at, kind, fence, actor, data)
    SELECT tenant_id, item_id, event_seq - 1, updated_at, 'released', fence, 'server',
           jsonb_build_object('reason', 'the client left before the lease was sent',
                              'acquisition_count', acquisition_count,
                              'available_at', available_at)
    FROM upd
)
SELECT upd.item_id FROM upd, (SELECT pg_notify('queue_server_ready', queue_server.ready_tag(%(tenant)s, queue))
                               FROM upd LIMIT 1) AS n;

-- name: heartbeat
-- Never past the lease's deadline: once there, the lease has expired for good and the
-- holder guard refuses every holder operation (explain_rejection: lease-deadline-exceeded).
WITH upd AS (
    UPDATE work_items
    -- The request's TTL, else the queue's, else the tenant's default; at most the policy's.
    SET lease_expires_at = least(
            statement_timestamp()
            + least(coalesce(%(ttl)s::interval,
                             (SELECT q.lease_ttl FROM queues q
                              WHERE q.tenant_id = work_items.tenant_id
                                AND q.queue = work_items.queue),
                             (SELECT t.default_lease_ttl FROM tenants t
                              WHERE t.tenant_id = work_items.tenant_id)),
                    %(max_ttl)s::interval),
            lease_deadline_at),
        updated_at = statement_timestamp(), event_seq = event_seq + 1
    WHERE tenant_id = %(tenant)s AND item_id = %(item_id)s
      AND state = 'leased' AND fence = %(fence)s AND lease_holder = %(worker)s
      AND coalesce(lease_key_id, %(key_id)s) = %(key_id)s
      AND lease_expires_at > statement_timestamp()
    RETURNING *
), ev AS (
    INSERT INTO item_events (tenant_id, item_id, seq, at, kind, fence, actor, data)
    SELECT tenant_id, item_id, event_seq - 1, updated_at, 'heartbeat', fence, %(worker)s,
           jsonb_build_object('lease_expires_at', lease_expires_at)
    FROM upd
)
SELECT upd.* FROM upd;

-- name: complete
WITH upd AS (
    UPDATE work_items
    SET state = 'completed', result = %(result)s, lease_holder = NULL, lease_expires_at = NULL,
        updated_at = statement_timestamp(), event_seq = event_seq + 1
    WHERE tenant_id = %(tenant)s AND item_id = %(item_id)s
      AND state = 'leased' AND fence = %(fence)s AND lease_holder = %(worker)s
      AND coalesce(lease_key_id, %(key_id)s) = %(key_id)s
      AND lease_expires_at > statement_timestamp()
    RETURNING *
), ev AS (
    INSERT INTO item_events (tenant_id, item_id, seq, at, kind, fence, actor, data)
    SELECT tenant_id, item_id, event_seq - 1, updated_at, 'completed', fence, %(worker)s,
           jsonb_build_object('result', result)
    FROM upd
), outbox AS (
    INSERT INTO outbox_deliveries (tenant_id, watcher_id, delivery_key, event, item_id, queue,
                                   body, state, next_attempt_at, due_at, created_at, updated_at)
    SELECT s.tenant_id, w.watcher_id, delivery_key(w.watcher_id, s.item_id, s.event_seq - 1),
           'item.completed', s.item_id, s.queue,
           jsonb_build_object('event', 'item.completed',
                              'occurred_at', api_timestamp(statement_timestamp()),
                              'item', item_json(s)),
           'pending', statement_timestamp(), statement_timestamp(), statement_timestamp(),
           statement_timestamp()
    FROM upd s
    JOIN watchers w ON w.tenant_id = s.tenant_id AND w.state = 'active'
     AND 'item.completed' = ANY(w.events) AND (w.queues IS NULL OR s.queue = ANY(w.queues))
    ORDER BY s.item_id, w.watcher_id
), counted AS (
    -- Out of the backlog, with each completion's acquire-to-complete time (`leased_at` is
    -- its lease's start).
    INSERT INTO counter_deltas (tenant_id, queue, shard, released, completed, timed_completions,
                                completion_ms)
    SELECT tenant_id, queue, admission_shard, count(*), count(*), count(leased_at),
           coalesce(sum(round(extract(epoch FROM statement_timestamp() - leased_at) * 1000)),
                    0)::bigint
    FROM upd GROUP BY tenant_id, queue, admission_shard
)
SELECT upd.* FROM upd;

-- name: requeue
WITH upd AS (
    UPDATE work_items
    SET state = 'ready', available_at = statement_timestamp() + make_interval(secs => coalesce(%(delay)s::double precision, (
            -- "delay": "backoff": min(cap, base * 2^(acquisitions - 1)), a uniform draw of
            -- it with full jitter; the queue's retry settings, else the server's defaults.
            SELECT least(coalesce(least(q.retry_cap, %(backoff_cap)s), %(backoff_cap)s),
                         coalesce(q.retry_base, %(backoff_base)s)
                         * power(2.0, greatest(work_items.acquisition_count - 1, 0)))
                   * CASE WHEN coalesce(q.retry_jitter, false) THEN random() ELSE 1 END
            FROM (SELECT 1) AS one
            LEFT JOIN queues q ON q.tenant_id = work_items.tenant_id
                              AND q.queue = work_items.queue))),
        last_failure = coalesce(%(failure)s::jsonb, last_failure),
        lease_holder = NULL, lease_expires_at = NULL, updated_at = statement_timestamp(),
        event_seq = event_seq + 1
    WHERE tenant_id = %(tenant)s AND item_id = %(item_id)s
      AND state = 'leased' AND fence = %(fence)s AND lease_holder = %(worker)s
      AND coalesce(lease_key_id, %(key_id)s) = %(key_id)s
      AND lease_expires_at > statement_timestamp()
    RETURNING *
), ev AS (
    INSERT INTO item_events (tenant_id, item_id, seq, at, kind, fence, actor, data)
    SELECT tenant_id, item_id, event_seq - 1, updated_at, 'requeued', fence, %(worker)s,
           jsonb_build_object('reason', %(reason)s::text, 'available_at', available_at,
                              'delay', round(extract(epoch FROM available_at - updated_at), 3),
                              'backoff', %(delay)s::double precision IS NULL)
           -- The failure the worker gave it back for, when it told one (a traceback in it).
           || CASE WHEN %(failure)s::jsonb IS NULL THEN '{}'::jsonb
                   ELSE jsonb_build_object('failure', %(failure)s::jsonb) END
    FROM upd
), outbox AS (
    INSERT INTO outbox_deliveries (tenant_id, watcher_id, delivery_key, event, item_id, queue,
                                   body, state, next_attempt_at, due_at, created_at, updated_at)
    SELECT s.tenant_id, w.watcher_id, delivery_key(w.watcher_id, s.item_id, s.event_seq - 1),
           'item.requeued', s.item_id, s.queue,
           jsonb_build_object('event', 'item.requeued',
                              'occurred_at', api_timestamp(statement_timestamp()),
                              'item', item_json(s)),
           'pending', statement_timestamp(), statement_timestamp(), statement_timestamp(),
           statement_timestamp()
    FROM upd s
    JOIN watchers w ON w.tenant_id = s.tenant_id AND w.state = 'active'
     AND 'item.requeued' = ANY(w.events) AND (w.queues IS NULL OR s.queue = ANY(w.queues))
    ORDER BY s.item_id, w.watcher_id
)
SELECT upd.* FROM upd,
     (SELECT pg_notify('queue_server_ready', queue_server.ready_tag(%(tenant)s, queue)) FROM upd) AS n;

-- name: triage_requeue
WITH upd AS (
    UPDATE work_items
    SET state = 'ready', available_at = statement_timestamp() + make_interval(secs => coalesce(%(delay)s::double precision, (
            -- "delay": "backoff": min(cap, base * 2^(acquisitions - 1)), a uniform draw of
            -- it with full jitter; the queue's retry settings, else the server's defaults.
            SELECT least(coalesce(least(q.retry_cap, %(backoff_cap)s), %(backoff_cap)s),
                         coalesce(q.retry_base, %(backoff_base)s)
                         * power(2.0, greatest(work_items.acquisition_count - 1, 0)))
                   * CASE WHEN coalesce(q.retry_jitter, false) THEN random() ELSE 1 END
            FROM (SELECT 1) AS one
            LEFT JOIN queues q ON q.tenant_id = work_items.tenant_id
                              AND q.queue = work_items.queue))),
        last_failure = %(failure)s, lease_holder = NULL, lease_expires_at = NULL,
        updated_at = statement_timestamp(), event_seq = event_seq + 1
    WHERE tenant_id = %(tenant)s AND item_id = %(item_id)s
      AND state = 'leased' AND fence = %(fence)s AND lease_holder = %(worker)s
      AND coalesce(lease_key_id, %(key_id)s) = %(key_id)s
      AND lease_expires_at > statement_timestamp()
      -- With no attempt left it changes nothing: the failure is its last (triage_quarantine).
      AND acquisition_count < max_acquisitions
    RETURNING *
), ev AS (
    INSERT INTO item_events (tenant_id, item_id, seq, at, kind, fence, actor, data)
    SELECT tenant_id, item_id, event_seq - 1, updated_at, 'triaged', fence, %(worker)s,
           jsonb_build_object('decision', 'requeue', 'failure', last_failure,
                              'available_at', available_at,
                              'delay', round(extract(epoch FROM available_at - updated_at), 3),
                              'backoff', %(delay)s::double precision IS NULL)
    FROM upd
), outbox AS (
    INSERT INTO outbox_deliveries (tenant_id, watcher_id, delivery_key, event, item_id, queue,
                                   body, state, next_attempt_at, due_at, created_at, updated_at)
    SELECT s.tenant_id, w.watcher_id, delivery_key(w.watcher_id, s.item_id, s.event_seq - 1),
           'item.requeued', s.item_id, s.queue,
           jsonb_build_object('event', 'item.requeued',
                              'occurred_at', api_timestamp(statement_timestamp()),
                              'item', item_json(s)),
           'pending', statement_timestamp(), statement_timestamp(), statement_timestamp(),
           statement_timestamp()
    FROM upd s
    JOIN watchers w ON w.tenant_id = s.tenant_id AND w.state = 'active'
     AND 'item.requeued' = ANY(w.events) AND (w.queues IS NULL OR s.queue = ANY(w.queues))
    ORDER BY s.item_id, w.watcher_id
), counted AS (
    INSERT INTO counter_deltas (tenant_id, queue, failed)
    SELECT tenant_id, queue, count(*)
    FROM upd GROUP BY tenant_id, queue
)
SELECT upd.* FROM upd,
     (SELECT pg_notify('queue_server_ready', queue_server.ready_tag(%(tenant)s, queue)) FROM upd) AS n;

-- name: triage_quarantine
-- Also a decision requeue's failure when the item has no attempt left (`exhausted`: the
-- requeue statement changed nothing for that reason): it is dead-lettered now, not when the
-- next acquire finds it out of budget.
WITH upd AS (
    UPDATE work_items
    SET state = 'quarantined', last_failure = %(failure)s, lease_holder = NULL,
        lease_expires_at = NULL, updated_at = statement_timestamp(), event_seq = event_seq + 1
    WHERE tenant_id = %(tenant)s AND item_id = %(item_id)s
      AND state = 'leased' AND fence = %(fence)s AND lease_holder = %(worker)s
      AND coalesce(lease_key_id, %(key_id)s) = %(key_id)s
      AND lease_expires_at > statement_timestamp()
      AND (NOT %(exhausted)s OR acquisition_count >= max_acquisitions)
    RETURNING *
), ev AS (
    INSERT INTO item_events (tenant_id, item_id, seq, at, kind, fence, actor, data)
    SELECT tenant_id, item_id, event_seq - 1, updated_at, 'triaged', fence, %(worker)s,
           jsonb_build_object('decision', 'quarantine', 'failure', last_failure)
           || CASE WHEN %(exhausted)s THEN '{"budget_exhausted": true}'::jsonb
                   ELSE '{}'::jsonb END
    FROM upd
), dead AS (
    INSERT INTO dead_letters (tenant_id, kind, item_id, queue, reason, last_failure, created_at)
    SELECT tenant_id, 'item', item_id, queue,
           CASE WHEN %(exhausted)s THEN 'acquisition budget exhausted'
                ELSE 'quarantined by triage' END, last_failure,
           statement_timestamp()
    FROM upd
), outbox AS (
    INSERT INTO outbox_deliveries (tenant_id, watcher_id, delivery_key, event, item_id, queue,
                                   body, state, next_attempt_at, due_at, created_at, updated_at)
    SELECT s.tenant_id, w.watcher_id, delivery_key(w.watcher_id, s.item_id, s.event_seq - 1),
           'item.quarantined', s.item_id, s.queue,
           jsonb_build_object('event', 'item.quarantined',
                              'occurred_at', api_timestamp(statement_timestamp()),
                              'item', item_json(s)),
           'pending', statement_timestamp(), statement_timestamp(), statement_timestamp(),
           statement_timestamp()
    FROM upd s
    JOIN watchers w ON w.tenant_id = s.tenant_id AND w.state = 'active'
     AND 'item.quarantined' = ANY(w.events) AND (w.queues IS NULL OR s.queue = ANY(w.queues))
    ORDER BY s.item_id, w.watcher_id
), counted AS (
    -- Out of the backlog.
    INSERT INTO counter_deltas (tenant_id, queue, shard, released, failed, quarantined)
    SELECT tenant_id, queue, admission_shard, count(*), count(*), count(*)
    FROM upd GROUP BY tenant_id, queue, admission_shard
)
SELECT upd.* FROM upd;

-- name: record_triage_rejected
-- Any actor of the tenant may report a failure: a refused triage is still ledgered.
WITH upd AS (
    UPDATE work_items SET event_seq = event_seq + 1
    WHERE tenant_id = %(tenant)s AND item_id = %(item_id)s
    RETURNING tenant_id, item_id, event_seq, fence
)
INSERT INTO item_events (tenant_id, item_id, seq, at, kind, fence, actor, data)
    SELECT tenant_id, item_id, event_seq - 1, statement_timestamp(), 'triage_rejected', fence,
        %(actor)s,
           jsonb_build_object('failure', %(failure)s::jsonb, 'presented_fence', %(fence)s::bigint,
                          'worker', %(worker)s::text, 'reason', %(reason)s::text)
    FROM upd;

-- name: record_scheduled
WITH upd AS (
    UPDATE work_items SET event_seq = event_seq + 1
    WHERE tenant_id = %(tenant)s AND item_id = %(item_id)s
    RETURNING tenant_id, item_id, event_seq, fence
)
INSERT INTO item_events (tenant_id, item_id, seq, at, kind, fence, actor, data)
    SELECT tenant_id, item_id, event_seq - 1, statement_timestamp(), 'scheduled', fence, %(actor)s,
           jsonb_build_object('schedule', %(schedule)s::text, 'schedule_id', %(schedule_id)s::text,
                          'tick_at', %(tick_at)s::timestamptz,
                          'trigger', %(trigger)s::boolean)
    FROM upd;

-- name: explain_rejections
SELECT item_id::text AS item_id, state, fence, lease_holder, lease_key_id, lease_expires_at,
       lease_deadline_at, lease_expires_at <= statement_timestamp() AS expired,
       -- Who cancelled a cancelled item, when, and whose lease it ended.
       CASE WHEN state = 'cancelled' THEN
           (SELECT jsonb_build_object('actor', e.actor, 'at', e.at, 'data', e.data)
            FROM item_events e
            WHERE e.tenant_id = w.tenant_id AND e.item_id = w.item_id AND e.kind = 'cancelled'
            ORDER BY e.seq DESC LIMIT 1)
       END AS cancellation
FROM work_items w WHERE tenant_id = %(tenant)s AND item_id = ANY(%(item_ids)s::uuid[]);

-- name: heartbeat_many
WITH input AS (
    SELECT * FROM jsonb_to_recordset(%(leases)s::jsonb) AS x(item_id uuid, fence bigint)
), upd AS (
    UPDATE work_items w
    -- The request's TTL, else the item's queue's, else the tenant's default (as heartbeat).
    SET lease_expires_at = least(
            statement_timestamp()
            + least(coalesce(%(ttl)s::interval,
                             (SELECT q.lease_ttl FROM queues q
                              WHERE q.tenant_id = w.tenant_id AND q.queue = w.queue),
                             (SELECT t.default_lease_ttl FROM tenants t
                              WHERE t.tenant_id = w.tenant_id)),
                    %(max_ttl)s::interval),
            w.lease_deadline_at),
        updated_at = statement_timestamp(), event_seq = w.event_seq + 1
    FROM input i
    -- Each row by its key: `state::text` keeps the partial indexes of leased rows out of
    -- the plan (a generic plan would read every lease not yet expired, and while an old
    -- snapshot is held, every lease that ended within a TTL).
    WHERE w.tenant_id = %(tenant)s AND w.item_id = ANY(%(ids)s::uuid[]) AND w.item_id = i.item_id
      AND w.state::text = 'leased' AND w.fence = i.fence AND w.lease_holder = %(worker)s
      AND coalesce(w.lease_key_id, %(key_id)s) = %(key_id)s
      AND w.lease_expires_at > statement_timestamp()
    RETURNING w.*
), ev AS (
    INSERT INTO item_events (tenant_id, item_id, seq, at, kind, fence, actor, data)
    SELECT tenant_id, item_id, event_seq - 1, updated_at, 'heartbeat', fence, %(worker)s,
           jsonb_build_object('lease_expires_at', lease_expires_at)
    FROM upd
)
SELECT item_id::text AS item_id, lease_expires_at, lease_deadline_at FROM upd;

-- name: complete_many
WITH input AS (
    SELECT * FROM jsonb_to_recordset(%(items)s::jsonb) AS x(item_id uuid, fence bigint,
        result jsonb)
), upd AS (
    UPDATE work_items w
    SET state = 'completed', result = coalesce(i.result, 'null'::jsonb), lease_holder = NULL,
        lease_expires_at = NULL, updated_at = statement_timestamp(), event_seq = w.event_seq + 1
    FROM input i
    -- Each row by its key: `state::text` keeps the partial indexes of leased rows out of
    -- the plan (a generic plan would read every lease not yet expired, and while an old
    -- snapshot is held, every lease that ended within a TTL).
    WHERE w.tenant_id = %(tenant)s AND w.item_id = ANY(%(ids)s::uuid[]) AND w.item_id = i.item_id
      AND w.state::text = 'leased' AND w.fence = i.fence AND w.lease_holder = %(worker)s
      AND coalesce(w.lease_key_id, %(key_id)s) = %(key_id)s
      AND w.lease_expires_at > statement_timestamp()
    RETURNING w.*
), ev AS (
    INSERT INTO item_events (tenant_id, item_id, seq, at, kind, fence, actor, data)
    SELECT tenant_id, item_id, event_seq - 1, updated_at, 'completed', fence, %(worker)s,
           jsonb_build_object('result', result)
    FROM upd
), counted AS (
    -- Out of the backlog, with each completion's acquire-to-complete time (`leased_at` is
    -- its lease's start).
    INSERT INTO counter_deltas (tenant_id, queue, shard, released, completed, timed_completions,
                                completion_ms)
    SELECT tenant_id, queue, admission_shard, count(*), count(*), count(leased_at),
           coalesce(sum(round(extract(epoch FROM statement_timestamp() - leased_at) * 1000)),
                    0)::bigint
    FROM upd GROUP BY tenant_id, queue, admission_shard
), outbox AS (
    INSERT INTO outbox_deliveries (tenant_id, watcher_id, delivery_key, event, item_id, queue,
                                   body, state, next_attempt_at, due_at, created_at, updated_at)
    SELECT s.tenant_id, w.watcher_id, delivery_key(w.watcher_id, s.item_id, s.event_seq - 1),
           'item.completed', s.item_id, s.queue,
           jsonb_build_object('event', 'item.completed',
                              'occurred_at', api_timestamp(statement_timestamp()),
                              'item', item_json(s)),
           'pending', statement_timestamp(), statement_timestamp(), statement_timestamp(),
           statement_timestamp()
    FROM upd s
    JOIN watchers w ON w.tenant_id = s.tenant_id AND w.state = 'active'
     AND 'item.completed' = ANY(w.events) AND (w.queues IS NULL OR s.queue = ANY(w.queues))
    ORDER BY s.item_id, w.watcher_id
)
SELECT upd.* FROM upd;

-- name: replay
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
        updated_at = statement_timestamp(), event_seq = w.event_seq + 1,
        admission_shard = %(shard)s
    FROM dl
    WHERE w.tenant_id = %(tenant)s AND w.item_id = dl.item_id AND w.state = 'quarantined'
    RETURNING w.*
), ev AS (
    INSERT INTO item_events (tenant_id, item_id, seq, at, kind, fence, actor, data)
    SELECT tenant_id, item_id, event_seq - 1, updated_at, 'replayed', fence, %(actor)s,
           jsonb_build_object('dead_letter_id', %(dead_letter_id)s::text,
                              'max_acquisitions', max_acquisitions,
                              'available_at', available_at)
    FROM upd
), counted AS (
    -- Back in the backlog, charged to the admission shard the caller took for it.
    INSERT INTO counter_deltas (tenant_id, queue, shard, admitted)
    SELECT tenant_id, queue, admission_shard, count(*)
    FROM upd GROUP BY tenant_id, queue, admission_shard
), outbox AS (
    INSERT INTO outbox_deliveries (tenant_id, watcher_id, delivery_key, event, item_id, queue,
                                   body, state, next_attempt_at, due_at, created_at, updated_at)
    SELECT s.tenant_id, w.watcher_id, delivery_key(w.watcher_id, s.item_id, s.event_seq - 1),
           'item.replayed', s.item_id, s.queue,
           jsonb_build_object('event', 'item.replayed',
                              'occurred_at', api_timestamp(statement_timestamp()),
                              'item', item_json(s)),
           'pending', statement_timestamp(), statement_timestamp(), statement_timestamp(),
           statement_timestamp()
    FROM upd s
    JOIN watchers w ON w.tenant_id = s.tenant_id AND w.state = 'active'
     AND 'item.replayed' = ANY(w.events) AND (w.queues IS NULL OR s.queue = ANY(w.queues))
    ORDER BY s.item_id, w.watcher_id
)
SELECT upd.* FROM upd,
     (SELECT pg_notify('queue_server_ready', queue_server.ready_tag(%(tenant)s, queue)) FROM upd) AS n;

-- name: discard
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
), ev AS (
    INSERT INTO item_events (tenant_id, item_id, seq, at, kind, fence, actor, data)
    SELECT tenant_id, item_id, event_seq - 1, updated_at, 'cancelled', fence, %(actor)s,
           jsonb_build_object('dead_letter_id', %(dead_letter_id)s::text,
                              'reason', %(reason)s::text)
    FROM upd
), counted AS (
    -- From quarantined: it had left the backlog already.
    INSERT INTO counter_deltas (tenant_id, queue, cancelled)
    SELECT tenant_id, queue, count(*)
    FROM upd GROUP BY tenant_id, queue
), outbox AS (
    INSERT INTO outbox_deliveries (tenant_id, watcher_id, delivery_key, event, item_id, queue,
                                   body, state, next_attempt_at, due_at, created_at, updated_at)
    SELECT s.tenant_id, w.watcher_id, delivery_key(w.watcher_id, s.item_id, s.event_seq - 1),
           'item.cancelled', s.item_id, s.queue,
           jsonb_build_object('event', 'item.cancelled',
                              'occurred_at', api_timestamp(statement_timestamp()),
                              'item', item_json(s)),
           'pending', statement_timestamp(), statement_timestamp(), statement_timestamp(),
           statement_timestamp()
    FROM upd s
    JOIN watchers w ON w.tenant_id = s.tenant_id AND w.state = 'active'
     AND 'item.cancelled' = ANY(w.events) AND (w.queues IS NULL OR s.queue = ANY(w.queues))
    ORDER BY s.item_id, w.watcher_id
)
SELECT upd.* FROM upd;

-- name: cancel
WITH prev AS (
    -- Locked in id order (two bulk cancels never wait on each other in a cycle); a row
    -- that a holder changed meanwhile is read again after its commit, and left out
    -- when it is no longer waiting, ready, leased or quarantined.
    SELECT item_id, state AS previous_state, lease_holder AS previous_holder
    FROM work_items
    WHERE tenant_id = %(tenant)s AND item_id = ANY(%(item_ids)s::uuid[])
      AND state IN ('waiting', 'ready', 'leased', 'quarantined')
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
    -- The row alone (what it was comes from prev): the outbox's item_json takes a work_items row.
    RETURNING w.*
), ev AS (
    INSERT INTO item_events (tenant_id, item_id, seq, at, kind, fence, actor, data)
    SELECT tenant_id, item_id, event_seq - 1, updated_at, 'cancelled', fence, %(actor)s,
           jsonb_build_object('reason', %(reason)s::text, 'previous_state', previous_state,
                              'lease_holder', previous_holder)
    FROM upd JOIN prev USING (item_id)
), dl AS (
    -- A quarantined item's open dead letter is resolved with it.
    UPDATE dead_letters d SET closed_at = statement_timestamp(), resolution = 'cancelled'
    WHERE d.tenant_id = %(tenant)s AND d.kind = 'item' AND d.closed_at IS NULL
      AND d.item_id IN (SELECT item_id FROM upd JOIN prev USING (item_id)
                        WHERE previous_state = 'quarantined')
), counted AS (
    -- Those that were waiting, ready or leased leave the backlog.
    INSERT INTO counter_deltas (tenant_id, queue, shard, released, cancelled)
    SELECT tenant_id, queue, admission_shard,
           count(*) FILTER (WHERE previous_state <> 'quarantined'), count(*)
    FROM upd JOIN prev USING (item_id) GROUP BY tenant_id, queue, admission_shard
), outbox AS (
    INSERT INTO outbox_deliveries (tenant_id, watcher_id, delivery_key, event, item_id, queue,
                                   body, state, next_attempt_at, due_at, created_at, updated_at)
    SELECT s.tenant_id, w.watcher_id, delivery_key(w.watcher_id, s.item_id, s.event_seq - 1),
           'item.cancelled', s.item_id, s.queue,
           jsonb_build_object('event', 'item.cancelled',
                              'occurred_at', api_timestamp(statement_timestamp()),
                              'item', item_json(s)),
           'pending', statement_timestamp(), statement_timestamp(), statement_timestamp(),
           statement_timestamp()
    FROM upd s
    JOIN watchers w ON w.tenant_id = s.tenant_id AND w.state = 'active'
     AND 'item.cancelled' = ANY(w.events) AND (w.queues IS NULL OR s.queue = ANY(w.queues))
    ORDER BY s.item_id, w.watcher_id
)
SELECT upd.*, prev.previous_state, prev.previous_holder
FROM upd JOIN prev USING (item_id) ORDER BY upd.item_id;

-- name: finished_queues
WITH RECURSIVE q_completed AS (
    (SELECT w.queue FROM work_items w
     WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.fence >= 0
       AND w.state = 'completed'
     ORDER BY w.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT w.queue FROM work_items w
            WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.fence >= 0
              AND w.state = 'completed'
              AND w.queue > q.queue
            ORDER BY w.queue LIMIT 1)
    FROM q_completed q WHERE q.queue IS NOT NULL
), q_cancelled AS (
    (SELECT w.queue FROM work_items w
     WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.fence >= 0
       AND w.state = 'cancelled'
     ORDER BY w.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT w.queue FROM work_items w
            WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.fence >= 0
              AND w.state = 'cancelled'
              AND w.queue > q.queue
            ORDER BY w.queue LIMIT 1)
    FROM q_cancelled q WHERE q.queue IS NOT NULL
)
SELECT 'completed' AS state, queue FROM q_completed WHERE queue IS NOT NULL
UNION ALL
SELECT 'cancelled' AS state, queue FROM q_cancelled WHERE queue IS NOT NULL;

-- name: purge_finished
-- One (state, queue) range of the list index, from a position on, at most a batch: items
-- created before the cutoff are candidates; those that also finished before it go.
-- (`w.fence >= 0`, true of every row, is the list index's own condition: reads.sql.)
WITH cutoff AS (
    SELECT statement_timestamp() - retention AS before FROM tenants WHERE tenant_id = %(tenant)s
), scanned AS (
    SELECT w.item_id, w.created_at, w.updated_at FROM work_items w
    WHERE w.tenant_id = %(tenant)s AND w.state <> 'leased' AND w.fence >= 0
      AND w.state = %(state)s::item_state
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
), counted AS (
    INSERT INTO counter_deltas (tenant_id, queue, purged_completed, purged_cancelled)
    SELECT tenant_id, queue, count(*) FILTER (WHERE state = 'completed'),
        count(*) FILTER (WHERE state = 'cancelled')
    FROM gone GROUP BY tenant_id, queue
)
SELECT (SELECT count(*) FROM scanned) AS scanned, (SELECT count(*) FROM gone) AS deleted,
       last.created_at AS last_at, last.item_id::text AS last_id
FROM (SELECT 1) AS one
LEFT JOIN (SELECT created_at, item_id FROM scanned
           ORDER BY created_at DESC, item_id DESC LIMIT 1) AS last ON true;

-- name: retry
-- quarantined or cancelled -> ready: due now, its acquisition budget whole again (as a
-- replay), `retried` in its ledger; a quarantined item's open dead letter closes as
-- `retried`. Back in the backlog, each item charged to the admission shard the caller
-- took for it (`shards`, by position in `item_ids`). A cancelled item leaves the cancelled
-- count as a deleted one does. An item with a dependency not completed (migration 0035: a
-- descendant of a replayed step) waits for it instead: `waiting`, said in its event, with
-- the count of those it waits for (0038) made again, its tallies of before deleted.
WITH unmet AS (
    SELECT x.item_id, count(*) AS pending
    FROM item_dependencies x
    JOIN work_items w ON w.tenant_id = x.tenant_id AND w.item_id = x.item_id
    JOIN work_items d ON d.tenant_id = x.tenant_id AND d.item_id = x.depends_on
    WHERE x.tenant_id = %(tenant)s AND x.item_id = ANY(%(item_ids)s::uuid[])
      AND d.state <> 'completed'
      AND NOT (w.on_dependency_failure = 'run' AND d.state IN ('quarantined', 'cancelled'))
    GROUP BY x.item_id
), upd AS (
    UPDATE work_items w
    SET state = CASE WHEN EXISTS (SELECT 1 FROM unmet u WHERE u.item_id = w.item_id)
                     THEN 'waiting' ELSE 'ready' END::item_state,
        dependencies_pending = CASE
            WHEN w.on_dependency_failure IS NOT NULL
            THEN coalesce((SELECT u.pending FROM unmet u WHERE u.item_id = w.item_id), 0) END,
        available_at = statement_timestamp(), acquisition_count = 0,
        updated_at = statement_timestamp(), event_seq = w.event_seq + 1,
        admission_shard = (%(shards)s::smallint[])[array_position(%(item_ids)s::uuid[],
                                                                   w.item_id)]
    WHERE w.tenant_id = %(tenant)s AND w.item_id = ANY(%(item_ids)s::uuid[])
      AND w.state = %(state)s::item_state AND w.state IN ('quarantined', 'cancelled')
    RETURNING w.*
), dl AS (
    UPDATE dead_letters d SET closed_at = statement_timestamp(), resolution = 'retried'
    WHERE d.tenant_id = %(tenant)s AND d.kind = 'item' AND d.closed_at IS NULL
      AND d.item_id = ANY(ARRAY(SELECT item_id FROM upd))
    RETURNING d.item_id, d.dead_letter_id
), recounted AS (
    DELETE FROM dependency_tallies t
    WHERE t.tenant_id = %(tenant)s AND t.item_id = ANY(ARRAY(SELECT item_id FROM upd))
), ev AS (
    INSERT INTO item_events (tenant_id, item_id, seq, at, kind, fence, actor, data)
    SELECT u.tenant_id, u.item_id, u.event_seq - 1, u.updated_at, 'retried', u.fence,
           %(actor)s,
           jsonb_build_object('from', %(state)s::text, 'available_at', u.available_at,
                              'max_acquisitions', u.max_acquisitions,
                              'dead_letter_id', dl.dead_letter_id)
           || CASE WHEN u.state = 'waiting' THEN jsonb_build_object('state', 'waiting')
                   ELSE '{}'::jsonb END
    FROM upd u LEFT JOIN dl ON dl.item_id = u.item_id
), counted AS (
    -- Back in the backlog; a cancelled item leaves the cancelled count as a deleted one.
    INSERT INTO counter_deltas (tenant_id, queue, shard, admitted, purged_cancelled)
    SELECT tenant_id, queue, admission_shard, count(*),
           CASE WHEN %(state)s::text = 'cancelled' THEN count(*) ELSE 0 END
    FROM upd GROUP BY tenant_id, queue, admission_shard
)
-- One row each (a single notification per queue retried into).
SELECT upd.* FROM upd,
     (SELECT count(pg_notify('queue_server_ready', queue_server.ready_tag(%(tenant)s, queue))) AS n
      FROM (SELECT DISTINCT queue FROM upd) AS retried_into) AS n;

-- name: delete_finished
-- completed or cancelled -> gone, with its ledger: an operator's delete. The queue
-- counters count them as purged, and the queue's own ledger keeps who deleted which.
WITH gone AS (
    DELETE FROM work_items w
    WHERE w.tenant_id = %(tenant)s AND w.item_id = ANY(%(item_ids)s::uuid[])
      AND w.state = %(state)s::item_state AND w.state IN ('completed', 'cancelled')
    RETURNING w.tenant_id, w.item_id, w.queue, w.state
), ledger AS (
    DELETE FROM item_events e
    WHERE e.tenant_id = %(tenant)s AND e.item_id = ANY(ARRAY(SELECT item_id FROM gone))
), counted AS (
    INSERT INTO counter_deltas (tenant_id, queue, purged_completed, purged_cancelled)
    SELECT tenant_id, queue, count(*) FILTER (WHERE state = 'completed'),
        count(*) FILTER (WHERE state = 'cancelled')
    FROM gone GROUP BY tenant_id, queue
), q AS (
    INSERT INTO queues AS t (tenant_id, queue, event_seq, updated_at)
    SELECT tenant_id, queue, 1, statement_timestamp() FROM gone
    GROUP BY tenant_id, queue ORDER BY tenant_id, queue
    ON CONFLICT (tenant_id, queue) DO UPDATE
    SET event_seq = t.event_seq + 1, updated_at = excluded.updated_at
    RETURNING t.tenant_id, t.queue, t.event_seq, t.updated_at
), ev AS (
    INSERT INTO queue_events (tenant_id, queue, seq, at, kind, actor, data)
    SELECT q.tenant_id, q.queue, q.event_seq - 1, q.updated_at, 'deleted', %(actor)s,
           jsonb_build_object('state', %(state)s::text,
                              'item_ids', (SELECT jsonb_agg(g.item_id ORDER BY g.item_id)
                                           FROM gone g WHERE g.queue = q.queue))
    FROM q
)
SELECT gone.item_id, gone.queue FROM gone ORDER BY gone.item_id;
