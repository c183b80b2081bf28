-- The statements of queue_server/store/confirmation_receipts.py, run by name. Each `-- name:`
-- block is loaded at import (queue_server/store/sql/__init__.py); the text here is
-- the text sent.

-- name: claim
-- ON CONFLICT covers both identities: the outcome reference (primary key) and the
-- idempotency key (unique per tenant). A concurrent claim of the same pair waits
-- for the first one to commit, then inserts nothing and reads the existing row.
INSERT INTO confirmation_receipts (tenant_id, outcome_ref, idempotency_key, claim_token)
VALUES (%(tenant)s, %(ref)s, %(key)s, %(token)s)
ON CONFLICT DO NOTHING
RETURNING tenant_id, outcome_ref, idempotency_key, claim_token, status, outcome, created_at,
    settled_at, settled_by, settle_reason;

-- name: settle
UPDATE confirmation_receipts
SET status = %(status)s, outcome = %(outcome)s, settled_at = statement_timestamp()
WHERE tenant_id = %(tenant)s AND outcome_ref = %(ref)s AND status = 'pending'
RETURNING tenant_id, outcome_ref, idempotency_key, claim_token, status, outcome, created_at,
    settled_at, settled_by, settle_reason;

-- name: get
SELECT tenant_id, outcome_ref, idempotency_key, claim_token, status, outcome, created_at,
    settled_at, settled_by, settle_reason FROM confirmation_receipts WHERE tenant_id = %s
AND outcome_ref = %s;

-- name: get_by_key
SELECT tenant_id, outcome_ref, idempotency_key, claim_token, status, outcome, created_at,
    settled_at, settled_by, settle_reason FROM confirmation_receipts WHERE tenant_id = %s
AND idempotency_key = %s;

-- name: list_pending
-- Stale: still pending `older_than` after its claim. Oldest first (the partial index).
SELECT tenant_id, outcome_ref, idempotency_key, claim_token, status, outcome, created_at,
    settled_at, settled_by, settle_reason,
    created_at <= statement_timestamp() - %(stale_after)s AS stale
FROM confirmation_receipts
WHERE tenant_id = %(tenant)s AND status = 'pending'
  AND created_at <= statement_timestamp() - %(older_than)s
  AND (%(after_at)s::timestamptz IS NULL
       OR (created_at, outcome_ref) > (%(after_at)s::timestamptz, %(after_ref)s::text))
ORDER BY created_at, outcome_ref
LIMIT %(limit)s;

-- name: resolve
-- An operator's settlement, only of a receipt pending past `stale_after`: a dispatched
-- mutation settles as what happened (succeeded or failed), never as cancelled.
UPDATE confirmation_receipts
SET status = %(status)s, outcome = %(outcome)s, settled_at = statement_timestamp(),
    settled_by = %(actor)s, settle_reason = %(reason)s
WHERE tenant_id = %(tenant)s AND outcome_ref = %(ref)s AND status = 'pending'
  AND created_at <= statement_timestamp() - %(stale_after)s
RETURNING tenant_id, outcome_ref, idempotency_key, claim_token, status, outcome, created_at,
    settled_at, settled_by, settle_reason;
