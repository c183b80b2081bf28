-- The statements of queue_server/store/watchers.py, run by name. Each `-- name:`
-- block is loaded at import (queue_server/store/sql/__init__.py); the text here is
-- the text sent.

-- name: create_watcher
INSERT INTO watchers (tenant_id, url, events, queues, state, secret, created_at, updated_at)
VALUES (%(tenant)s, %(url)s, %(events)s, %(queues)s, 'active', %(secret)s,
        statement_timestamp(), statement_timestamp())
RETURNING tenant_id, watcher_id, url, events, queues, state, disabled_reason, created_at,
    updated_at, previous_secret_expires_at, backlogged_at, backlog_from;

-- name: get_watcher
SELECT tenant_id, watcher_id, url, events, queues, state, disabled_reason, created_at,
    updated_at, previous_secret_expires_at, backlogged_at, backlog_from FROM watchers
WHERE tenant_id = %(tenant)s AND watcher_id = %(watcher_id)s;

-- name: get_watcher_for_update
SELECT tenant_id, watcher_id, url, events, queues, state, disabled_reason, created_at,
    updated_at, previous_secret_expires_at, backlogged_at, backlog_from FROM watchers
WHERE tenant_id = %(tenant)s AND watcher_id = %(watcher_id)s FOR UPDATE;

-- name: list_watchers
SELECT tenant_id, watcher_id, url, events, queues, state, disabled_reason, created_at,
    updated_at, previous_secret_expires_at, backlogged_at, backlog_from FROM watchers
WHERE tenant_id = %(tenant)s
ORDER BY created_at, watcher_id;

-- name: change_state
WITH before AS (
    SELECT tenant_id, watcher_id, paused_at FROM watchers
    WHERE tenant_id = %(tenant)s AND watcher_id = %(watcher_id)s AND state = ANY(%(source)s)
    FOR UPDATE
), w AS (
    UPDATE watchers w SET state = %(target)s, updated_at = statement_timestamp(),
        -- Pausing a paused watcher keeps the instant its pause began.
        paused_at = CASE WHEN %(target)s = 'paused'
                         THEN coalesce(w.paused_at, statement_timestamp()) END
    FROM before b
    WHERE w.tenant_id = b.tenant_id AND w.watcher_id = b.watcher_id
    RETURNING w.tenant_id, w.watcher_id, w.url, w.events, w.queues, w.state, w.disabled_reason,
        w.created_at, w.updated_at, w.previous_secret_expires_at, w.backlogged_at, w.backlog_from
), resumed AS (
    -- The pause did not count toward the deadline of the rows that waited through it.
    UPDATE outbox_deliveries o
    SET deadline_from = o.deadline_from + (statement_timestamp() - b.paused_at)
    FROM before b
    WHERE %(target)s = 'active' AND b.paused_at IS NOT NULL
      AND o.tenant_id = b.tenant_id AND o.watcher_id = b.watcher_id AND o.state = 'pending'
)
SELECT * FROM w;

-- name: cancel_watcher
WITH w AS (
    -- A cancelled or disabled watcher is sent nothing more: its backlog is dropped too.
    UPDATE watchers SET state = %(target)s, disabled_reason = %(reason)s, paused_at = NULL,
        backlogged_at = NULL, backlog_from = NULL, updated_at = statement_timestamp()
    WHERE tenant_id = %(tenant)s AND watcher_id = %(watcher_id)s
      AND state IN ('active', 'paused')
    RETURNING tenant_id, watcher_id, url, events, queues, state, disabled_reason, created_at,
        updated_at, previous_secret_expires_at, backlogged_at, backlog_from
), rows AS (
    UPDATE outbox_deliveries o
    SET state = 'cancelled', claim_token = NULL, claimed_until = NULL,
        next_attempt_at = NULL, updated_at = statement_timestamp()
    FROM w
    WHERE o.tenant_id = w.tenant_id AND o.watcher_id = w.watcher_id AND o.state = 'pending'
      AND o.delivery_id IS DISTINCT FROM %(except_delivery)s::uuid
    RETURNING o.delivery_id
)
SELECT w.*, (SELECT count(*) FROM rows) AS cancelled_deliveries FROM w;

-- name: rotate_secret
UPDATE watchers
SET previous_secret = secret, previous_secret_expires_at = statement_timestamp() + %(grace)s,
    secret = %(secret)s, updated_at = statement_timestamp()
WHERE tenant_id = %(tenant)s AND watcher_id = %(watcher_id)s
  AND state IN ('active', 'paused', 'disabled')
RETURNING tenant_id, watcher_id, url, events, queues, state, disabled_reason, created_at,
    updated_at, previous_secret_expires_at, backlogged_at, backlog_from;
