-- The statements of queue_server/store/channels.py, run by name. Each `-- name:`
-- block is loaded at import (queue_server/store/sql/__init__.py); the text here is
-- the text sent.

-- name: listen_ready
LISTEN queue_server_ready;

-- name: listen_keys
LISTEN queue_server_keys;

-- name: listen_policy
LISTEN queue_server_policy;

-- name: listener_probe
-- The notifier's check on a session that has been quiet for a while.
SELECT 1;

-- name: installation_secret
-- What the ready channel's payloads are made with (queue_server.ready_tag): the listener
-- computes the tags of the queues it waits on. Only the tables' owner may read it.
SELECT secret FROM installation_secret;

-- name: placed_since
-- What wakes the acquires waiting in a process (the notifier's watch): the queues with a
-- row made ready (enqueued, requeued, released, replayed) by a transaction that ended
-- since the last look, whose snapshot is `since` (the rows placed at or past its xmax, or
-- by one of the transactions then in progress), and this statement's own snapshot, for the
-- next look. An enqueue sends no notification: PostgreSQL serializes the commits of every
-- transaction that sends one (a lock held through the commit's flush), so an
-- application's transactions that enqueue would commit one at a time.
-- ix_work_items_ready_placed from the last look's place on (both ends bounded, so even a
-- generic plan reads the index): the rows placed since, never the history an old
-- snapshot keeps. With no `since`, nothing (the first look only takes its place).
WITH placed AS (
    SELECT p.tenant_id, p.queue FROM (
        SELECT tenant_id, queue FROM work_items
        WHERE placed_xid >= pg_snapshot_xmax(%(since)s::pg_snapshot)
          AND placed_xid < pg_snapshot_xmax(pg_current_snapshot()) AND state = 'ready'
        OFFSET 0
    ) AS p
    UNION
    -- Each transaction then in progress, by key (a probe each, not a join over the rows).
    SELECT w.tenant_id, w.queue FROM pg_snapshot_xip(%(since)s::pg_snapshot) AS x(xid)
    CROSS JOIN LATERAL (
        SELECT tenant_id, queue FROM work_items WHERE placed_xid = x.xid AND state = 'ready'
        OFFSET 0
    ) AS w
)
SELECT pg_current_snapshot()::text AS snapshot,
       coalesce(array_agg(tenant_id ORDER BY tenant_id, queue), '{}') AS tenants,
       coalesce(array_agg(queue ORDER BY tenant_id, queue), '{}') AS queues
FROM placed;
