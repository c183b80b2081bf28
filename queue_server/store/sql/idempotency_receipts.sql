-- The statements of queue_server/store/idempotency_receipts.py, run by name. Each `-- name:`
-- block is loaded at import (queue_server/store/sql/__init__.py); the text here is
-- the text sent.

-- name: claim
-- ON CONFLICT waits while another transaction holds an uncommitted receipt with
-- this key, then sees its outcome: concurrent same-key requests make one effect.
INSERT INTO idempotency_receipts
    (tenant_id, idempotency_key, fingerprint, response_status, response_body, expires_at)
VALUES (%(tenant)s, %(key)s, %(fingerprint)s, 0, '', statement_timestamp() + %(retention)s)
ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
RETURNING 1 AS claimed;

-- name: get
SELECT * FROM idempotency_receipts WHERE tenant_id = %s AND idempotency_key = %s;

-- name: fill
UPDATE idempotency_receipts SET response_status = %s, response_body = %s WHERE tenant_id = %s
  AND idempotency_key = %s;

-- name: purge_expired
-- Oldest first, a batch at a time (ix_idempotency_receipts_expires_at): short transactions.
DELETE FROM idempotency_receipts r
USING (SELECT tenant_id, idempotency_key FROM idempotency_receipts
       WHERE expires_at < statement_timestamp()
       ORDER BY expires_at LIMIT %(limit)s) AS spent
WHERE r.tenant_id = spent.tenant_id AND r.idempotency_key = spent.idempotency_key;
