-- The statements of queue_server/store/schedules.py, run by name. Each `-- name:`
-- block is loaded at import (queue_server/store/sql/__init__.py); the text here is
-- the text sent.

-- name: insert_schedule
INSERT INTO schedules (tenant_id, name, schedule_id, queue, payload, priority, max_acquisitions,
                       cron, every_seconds, timezone, catch_up, catch_up_limit, paused,
                       next_tick_at, due_at, created_at, updated_at, traceparent, tracestate)
VALUES (%(tenant)s, %(name)s, gen_random_uuid(), %(queue)s, %(payload)s, %(priority)s,
        %(max_acquisitions)s, %(cron)s, %(every_seconds)s, %(timezone)s, %(catch_up)s,
        %(catch_up_limit)s, %(paused)s, %(next_tick)s, %(next_tick)s,
        %(at)s, %(at)s, %(traceparent)s, %(tracestate)s)
RETURNING *;

-- name: update_schedule
UPDATE schedules
SET queue = %(queue)s, payload = %(payload)s, priority = %(priority)s,
    max_acquisitions = %(max_acquisitions)s, cron = %(cron)s, every_seconds = %(every_seconds)s,
    timezone = %(timezone)s, catch_up = %(catch_up)s, catch_up_limit = %(catch_up_limit)s,
    paused = %(paused)s, next_tick_at = %(next_tick)s,
    due_at = CASE WHEN next_tick_at = %(next_tick)s THEN due_at ELSE %(next_tick)s END,
    updated_at = %(at)s,
    -- The latest put's trace context: the fires from now on belong to its trace.
    traceparent = %(traceparent)s, tracestate = %(tracestate)s
WHERE tenant_id = %(tenant)s AND name = %(name)s
RETURNING *;

-- name: get_schedule
SELECT s.*, statement_timestamp() AS now FROM schedules s
WHERE tenant_id = %(tenant)s AND name = %(name)s;

-- name: lock_schedule
SELECT s.*, statement_timestamp() AS now FROM schedules s
WHERE tenant_id = %(tenant)s AND name = %(name)s
FOR NO KEY UPDATE;

-- name: list_schedules
SELECT s.*, statement_timestamp() AS now FROM schedules s
WHERE tenant_id = %(tenant)s AND (%(after)s::text IS NULL OR name > %(after)s)
ORDER BY name LIMIT %(limit)s;

-- name: delete_schedule
DELETE FROM schedules WHERE tenant_id = %(tenant)s AND name = %(name)s RETURNING schedule_id;

-- name: set_paused
UPDATE schedules
SET paused = %(paused)s,
    next_tick_at = coalesce(%(next_tick)s, next_tick_at),
    due_at = coalesce(%(next_tick)s, due_at),
    updated_at = %(at)s
WHERE tenant_id = %(tenant)s AND name = %(name)s
RETURNING *, statement_timestamp() AS now;

-- name: due_schedules
-- The clock: the pinned `now` of a test, else the statement's own.
SELECT tenant_id, name, extract(epoch FROM due_at - coalesce(%(now)s::timestamptz,
    statement_timestamp()))::float8 AS wait
FROM schedules WHERE NOT paused
ORDER BY due_at LIMIT %(limit)s;

-- name: claim_schedule
-- The clock: the pinned `now` of a test, else the statement's own.
SELECT s.*, coalesce(%(now)s::timestamptz, statement_timestamp()) AS now FROM schedules s
WHERE tenant_id = %(tenant)s AND name = %(name)s AND NOT paused
  AND due_at <= coalesce(%(now)s::timestamptz, statement_timestamp())
-- SKIP LOCKED: another loop is firing it; its commit moves the cursor past these ticks.
FOR NO KEY UPDATE SKIP LOCKED;

-- name: advance
UPDATE schedules
SET next_tick_at = %(next_tick)s, due_at = %(due_at)s, fires = fires + %(fired)s,
    refusals = refusals + %(refused)s, skipped = skipped + %(dropped)s
WHERE tenant_id = %(tenant)s AND schedule_id = %(schedule_id)s;

-- name: record_fire
INSERT INTO schedule_fires AS f (tenant_id, schedule_id, tick_at, kind, outcome, item_id,
                                 attempts, at, detail)
VALUES (%(tenant)s, %(schedule_id)s, %(tick_at)s, %(kind)s, %(outcome)s, %(item_id)s, 1,
        statement_timestamp(), %(detail)s)
ON CONFLICT (tenant_id, schedule_id, tick_at, kind) DO UPDATE
SET outcome = excluded.outcome, item_id = excluded.item_id, attempts = f.attempts + 1,
    at = excluded.at, detail = excluded.detail;

-- name: drop_refused
UPDATE schedule_fires SET outcome = 'dropped', at = statement_timestamp()
WHERE tenant_id = %(tenant)s AND schedule_id = %(schedule_id)s AND kind = 'tick'
  AND outcome = 'refused' AND tick_at < %(before)s;

-- name: prune_fires
DELETE FROM schedule_fires
WHERE tenant_id = %(tenant)s AND schedule_id = %(schedule_id)s
  AND tick_at <= (SELECT tick_at FROM schedule_fires
                  WHERE tenant_id = %(tenant)s AND schedule_id = %(schedule_id)s
                  ORDER BY tick_at DESC OFFSET %(keep)s LIMIT 1);

-- name: recent_fires
SELECT * FROM schedule_fires
WHERE tenant_id = %(tenant)s AND schedule_id = %(schedule_id)s
ORDER BY tick_at DESC, kind LIMIT %(limit)s;

-- name: now
SELECT statement_timestamp() AS now;

-- name: postpone
UPDATE schedules SET due_at = statement_timestamp() + make_interval(secs => %(seconds)s)
WHERE tenant_id = %(tenant)s AND name = %(name)s AND NOT paused;
