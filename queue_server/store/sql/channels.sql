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
-- Both reads are in ix_work_items_ready_placed's order, so that even a plan made on an
-- empty table (a new server's first look, kept by its prepared statement) reads that index,
-- from the last look's place on: the rows placed since, never the history an old snapshot
-- keeps. At most LIMIT rows each; at the limit `more` is true and every waiter looks. With
-- no `since`, nothing (the first look only takes its place).
WITH ranged AS MATERIALIZED (
    SELECT tenant_id, queue FROM work_items
    WHERE placed_xid >= pg_snapshot_xmax(%(since)s::pg_snapshot)
      AND placed_xid < pg_snapshot_xmax(pg_current_snapshot()) AND state = 'ready'
    ORDER BY placed_xid LIMIT 1000
), probed AS MATERIALIZED (
    -- The transactions then in progress, each by key.
    SELECT tenant_id, queue FROM work_items
    WHERE placed_xid = ANY(ARRAY(SELECT pg_snapshot_xip(%(since)s::pg_snapshot)))
      AND state = 'ready'
    ORDER BY placed_xid LIMIT 1000
), placed AS (
    SELECT tenant_id, queue FROM ranged UNION SELECT tenant_id, queue FROM probed
)
SELECT pg_current_snapshot()::text AS snapshot,
       greatest((SELECT count(*) FROM ranged), (SELECT count(*) FROM probed)) >= 1000 AS more,
       coalesce(array_agg(tenant_id ORDER BY tenant_id, queue), '{}') AS tenants,
       coalesce(array_agg(queue ORDER BY tenant_id, queue), '{}') AS queues
FROM placed;
