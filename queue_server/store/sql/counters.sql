-- The statements of queue_server/store/counters.py, run by name. Each `-- name:`
-- block is loaded at import (queue_server/store/sql/__init__.py); the text here is
-- the text sent.

-- name: fold
-- The deltas of every ended transaction summed into a new base, in one statement: the
-- latest base's rows and the deltas with an id in [its as_of_xid, x) are deleted and
-- their sums inserted as of x, the xmin of this statement's snapshot. Every transaction
-- below x has ended, so each of its deltas is visible here and none can appear later; a
-- transaction at or above x (still running, or committed since) keeps its deltas for the
-- next fold, and readers count them (`xid >= as_of_xid`, the view counter_totals). With
-- nothing to fold, the base stays. A transaction that holds an id open holds x back, and
-- the deltas since it began wait for it; a snapshot held without an id (a report, a
-- pg_dump) does not.
WITH horizon AS (
    SELECT pg_snapshot_xmin(pg_current_snapshot()) AS x
), base AS (
    -- The newest base: the first row of a backward scan of the key (older ones are gone).
    SELECT coalesce((SELECT as_of_xid FROM counter_bases ORDER BY as_of_xid DESC LIMIT 1),
                    '0'::xid8) AS as_of_xid
), folded AS (
    -- From the base on: the deltas an earlier fold deleted lie below it.
    DELETE FROM counter_deltas d
    WHERE d.xid >= (SELECT as_of_xid FROM base) AND d.xid < (SELECT x FROM horizon)
    RETURNING d.tenant_id, d.queue, d.shard, d.admitted, d.released, d.completed, d.failed,
              d.quarantined, d.cancelled, d.purged_completed, d.purged_cancelled,
              d.timed_completions, d.completion_ms
), replaced AS (
    DELETE FROM counter_bases b
    WHERE b.as_of_xid = (SELECT as_of_xid FROM base) AND EXISTS (SELECT 1 FROM folded)
    RETURNING b.tenant_id, b.queue, b.shard, b.admitted, b.released, b.completed, b.failed,
              b.quarantined, b.cancelled, b.purged_completed, b.purged_cancelled,
              b.timed_completions, b.completion_ms
), based AS (
    INSERT INTO counter_bases (as_of_xid, tenant_id, queue, shard, admitted, released, completed,
                               failed, quarantined, cancelled, purged_completed,
                               purged_cancelled, timed_completions, completion_ms)
    SELECT (SELECT x FROM horizon), c.tenant_id, c.queue, c.shard, sum(c.admitted), sum(c.released),
           sum(c.completed), sum(c.failed), sum(c.quarantined), sum(c.cancelled),
           sum(c.purged_completed), sum(c.purged_cancelled), sum(c.timed_completions),
           sum(c.completion_ms)
    FROM (SELECT * FROM replaced UNION ALL SELECT * FROM folded) AS c
    -- A deleted tenant's counters go with it; one being deleted is waited for (its row
    -- locked as the foreign key's check would, so the check cannot fail).
    WHERE EXISTS (SELECT 1 FROM tenants t WHERE t.tenant_id = c.tenant_id FOR KEY SHARE)
    GROUP BY c.tenant_id, c.queue, c.shard
    ORDER BY c.tenant_id, c.queue, c.shard
    RETURNING 1
)
SELECT (SELECT count(*) FROM folded) AS deltas, (SELECT count(*) FROM based) AS bases,
       (SELECT x FROM horizon)::text AS as_of_xid;
