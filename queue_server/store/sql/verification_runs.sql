-- The statements of queue_server/store/verification_runs.py, run by name. Each `-- name:`
-- block is loaded at import (queue_server/store/sql/__init__.py); the text here is
-- the text sent.

-- name: start
-- ON CONFLICT covers the run key and the one-running-run index: a second start of
-- the same pair or a start while another run is running inserts nothing. A new run of
-- a key whose last run failed or was abandoned carries that run's checkpoints over.
WITH ins AS (
    INSERT INTO verification_runs (tenant_id, run_id, artifact_version, verifier_version, items,
                                   deadline_at)
    VALUES (%(tenant)s, %(run_id)s, %(artifact)s, %(verifier)s, %(items)s,
            statement_timestamp() + %(deadline)s)
    ON CONFLICT DO NOTHING
    RETURNING tenant_id, run_id, artifact_version, verifier_version, items, state, created_at,
        completed_at, deadline_at, ended_at, ended_by, end_reason
), previous AS (
    SELECT run_id FROM verification_runs
    WHERE tenant_id = %(tenant)s AND artifact_version = %(artifact)s
      AND verifier_version = %(verifier)s AND state IN ('failed', 'abandoned')
    ORDER BY run_id DESC LIMIT 1
), carried AS (
    INSERT INTO verification_checkpoints (tenant_id, run_id, item, result, recorded_at)
    SELECT c.tenant_id, ins.run_id, c.item, c.result, c.recorded_at
    FROM ins, previous, verification_checkpoints c
    WHERE c.tenant_id = %(tenant)s AND c.run_id = previous.run_id AND ins.items ? c.item
)
SELECT * FROM ins;

-- name: record
INSERT INTO verification_checkpoints (tenant_id, run_id, item, result)
VALUES (%(tenant)s, %(run_id)s, %(item)s, %(result)s)
ON CONFLICT DO NOTHING
RETURNING tenant_id, run_id, item, result, recorded_at;

-- name: complete
-- The terminal marker is written only when no declared item lacks a checkpoint,
-- checked by the same statement that writes it.
UPDATE verification_runs r
SET state = 'complete', completed_at = statement_timestamp()
WHERE r.tenant_id = %(tenant)s AND r.run_id = %(run_id)s AND r.state = 'running'
  AND NOT EXISTS (
      SELECT 1 FROM jsonb_array_elements_text(r.items) AS declared(item)
      WHERE NOT EXISTS (
          SELECT 1 FROM verification_checkpoints c
          WHERE c.tenant_id = r.tenant_id AND c.run_id = r.run_id AND c.item = declared.item))
RETURNING tenant_id, run_id, artifact_version, verifier_version, items, state, created_at,
    completed_at, deadline_at, ended_at, ended_by, end_reason;

-- name: by_key
SELECT tenant_id, run_id, artifact_version, verifier_version, items, state, created_at,
    completed_at, deadline_at, ended_at, ended_by, end_reason FROM verification_runs
WHERE tenant_id = %s AND artifact_version = %s AND verifier_version = %s AND state IN ('running',
    'complete');

-- name: running
SELECT tenant_id, run_id, artifact_version, verifier_version, items, state, created_at,
    completed_at, deadline_at, ended_at, ended_by, end_reason FROM verification_runs
WHERE tenant_id = %s AND state = 'running';

-- name: get
SELECT tenant_id, run_id, artifact_version, verifier_version, items, state, created_at,
    completed_at, deadline_at, ended_at, ended_by, end_reason FROM verification_runs
WHERE tenant_id = %s AND run_id = %s;

-- name: get_for_share
-- FOR SHARE pins the run while a checkpoint is recorded, so the terminal marker
-- cannot be written between the state check and the checkpoint insert.
SELECT tenant_id, run_id, artifact_version, verifier_version, items, state, created_at,
    completed_at, deadline_at, ended_at, ended_by, end_reason FROM verification_runs
WHERE tenant_id = %s AND run_id = %s FOR SHARE;

-- name: list_page
SELECT tenant_id, run_id, artifact_version, verifier_version, items, state, created_at,
    completed_at, deadline_at, ended_at, ended_by, end_reason,
    jsonb_array_length(r.items) AS item_count,
       (SELECT count(*) FROM verification_checkpoints c
        WHERE c.tenant_id = r.tenant_id AND c.run_id = r.run_id) AS checkpoint_count
FROM verification_runs r
WHERE r.tenant_id = %(tenant)s AND (%(before)s::uuid IS NULL OR r.run_id < %(before)s::uuid)
ORDER BY r.run_id DESC
LIMIT %(limit)s;

-- name: checkpoints
SELECT tenant_id, run_id, item, result, recorded_at FROM verification_checkpoints
WHERE tenant_id = %s AND run_id = %s ORDER BY recorded_at, item;

-- name: checkpoint
SELECT tenant_id, run_id, item, result, recorded_at FROM verification_checkpoints
WHERE tenant_id = %s AND run_id = %s AND item = %s;

-- name: fail_overdue
-- The deadline, applied by the statement that checks it: a running run past its
-- deadline_at fails (at its next checkpoint or complete, or by the server's sweeper).
UPDATE verification_runs
SET state = 'failed', ended_at = statement_timestamp(), ended_by = 'server',
    end_reason = 'deadline-exceeded'
WHERE (%(tenant)s::text IS NULL OR tenant_id = %(tenant)s)
  AND (%(run_id)s::uuid IS NULL OR run_id = %(run_id)s::uuid)
  AND state = 'running' AND deadline_at <= statement_timestamp()
RETURNING tenant_id, run_id, artifact_version, verifier_version, items, state, created_at,
    completed_at, deadline_at, ended_at, ended_by, end_reason;

-- name: abandon
UPDATE verification_runs
SET state = 'abandoned', ended_at = statement_timestamp(), ended_by = %(actor)s,
    end_reason = %(reason)s
WHERE tenant_id = %(tenant)s AND run_id = %(run_id)s AND state = 'running'
RETURNING tenant_id, run_id, artifact_version, verifier_version, items, state, created_at,
    completed_at, deadline_at, ended_at, ended_by, end_reason;
