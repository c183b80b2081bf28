-- The statements of queue_server/store/tenants.py, run by name. Each `-- name:`
-- block is loaded at import (queue_server/store/sql/__init__.py); the text here is
-- the text sent.

-- name: put_tenant
INSERT INTO tenants (tenant_id, backlog_cap, default_max_acquisitions, default_lease_ttl,
                     retention)
VALUES (%(tenant)s, %(backlog_cap)s, %(default_max_acquisitions)s, %(default_lease_ttl)s,
        %(retention)s)
ON CONFLICT (tenant_id) DO UPDATE
SET backlog_cap = excluded.backlog_cap,
    default_max_acquisitions = excluded.default_max_acquisitions,
    default_lease_ttl = excluded.default_lease_ttl,
    retention = excluded.retention,
    updated_at = statement_timestamp()
RETURNING *;

-- name: get_tenant
SELECT * FROM tenants WHERE tenant_id = %s;

-- name: list_tenants
-- The backlog of tenant row t: admitted minus released, over its queues.
SELECT t.*, (SELECT coalesce(sum(c.admitted - c.released), 0) FROM counter_totals c
             WHERE c.tenant_id = t.tenant_id)::bigint AS backlog
FROM tenants t
WHERE %(after)s::text IS NULL OR t.tenant_id > %(after)s
ORDER BY t.tenant_id LIMIT %(limit)s;

-- name: list_keys
SELECT key_id, tenant_id, role, name, created_at, revoked_at FROM api_keys
WHERE tenant_id = %(tenant)s AND (%(revoked)s OR revoked_at IS NULL)
ORDER BY created_at, key_id;

-- name: take_admission
-- `n` items' admission shards, locked until the transaction ends (migration 0028).
SELECT queue_server.admission_shards(%(tenant)s, %(n)s, %(cap)s) AS shards;

-- name: room
-- The backlog of tenant row t: admitted minus released, over its queues; with a key,
-- whether it has a receipt (a replay or retry asks none).
SELECT t.backlog_cap,
       (SELECT coalesce(sum(c.admitted - c.released), 0) FROM counter_totals c
        WHERE c.tenant_id = t.tenant_id)::bigint AS backlog,
       %(key)s::text IS NOT NULL
       AND EXISTS (SELECT 1 FROM idempotency_receipts i
                   WHERE i.tenant_id = t.tenant_id AND i.idempotency_key = %(key)s) AS has_receipt
FROM tenants t WHERE t.tenant_id = %(tenant)s;

-- name: backlog
-- The backlog of tenant row t: admitted minus released, over its queues.
SELECT (SELECT coalesce(sum(c.admitted - c.released), 0) FROM counter_totals c
        WHERE c.tenant_id = t.tenant_id)::bigint AS backlog
FROM tenants t WHERE t.tenant_id = %s;

-- name: create_key
INSERT INTO api_keys (key_id, tenant_id, role, secret_hash, name) VALUES (%s, %s, %s, %s, %s)
RETURNING *;

-- name: get_key
SELECT * FROM api_keys WHERE key_id = %s;

-- name: revoke_key
UPDATE api_keys SET revoked_at = coalesce(revoked_at, statement_timestamp())
WHERE tenant_id = %s AND key_id = %s RETURNING pg_notify('queue_server_keys', '');

-- name: revoke_admin_key
UPDATE api_keys SET revoked_at = coalesce(revoked_at, statement_timestamp())
WHERE role = 'admin' AND key_id = %s RETURNING pg_notify('queue_server_keys', '');

-- name: revoke_other_admin_keys
UPDATE api_keys SET revoked_at = statement_timestamp() WHERE role = 'admin'
  AND revoked_at IS NULL AND key_id <> %s RETURNING key_id, pg_notify('queue_server_keys', '');

-- name: list_admin_keys
SELECT key_id, created_at, revoked_at FROM api_keys WHERE role = 'admin' ORDER BY created_at,
    key_id;

-- name: lock_admin_keys
SELECT pg_advisory_xact_lock(hashtext('queue-server-admin-key'));

-- name: count_admin_keys
SELECT count(*) AS n FROM api_keys WHERE role = 'admin' AND revoked_at IS NULL;

-- name: spend_window
-- Where an approval's expiry falls on the database's clock: it must be in the future and at
-- most a year (365 days) ahead.
SELECT %(expires_at)s::timestamptz > statement_timestamp() AS future,
       %(expires_at)s::timestamptz <= statement_timestamp() + interval '365 days' AS within_year,
       statement_timestamp() + interval '365 days' AS latest;

-- name: add_spend_approval
-- The approving key, not a name it gives: `approved_by` keeps the key id for older readers.
INSERT INTO spend_approvals (tenant_id, queue, approved_by, approved_by_key_id,
    approved_by_role, max_concurrency, expires_at, reason)
VALUES (%(tenant)s, %(queue)s, %(key_id)s, %(key_id)s, %(role)s, %(max_concurrency)s,
    %(expires_at)s, %(reason)s)
RETURNING *, expires_at > statement_timestamp() AND revoked_at IS NULL AS live;

-- name: revoke_spend_approval
-- Revoking a revoked approval changes nothing: it keeps its first revocation.
-- A revoked approval never expires into the queue's ledger (`expiry_ledgered_at`).
UPDATE spend_approvals
SET revoked_at = coalesce(revoked_at, statement_timestamp()),
    revoked_by = coalesce(revoked_by, %(key_id)s),
    expiry_ledgered_at = coalesce(expiry_ledgered_at, statement_timestamp())
WHERE tenant_id = %(tenant)s AND queue = %(queue)s AND approval_id = %(approval_id)s
RETURNING *, false AS live;

-- name: list_spend_approvals
-- Live, expired and revoked ones, the newest first.
SELECT *, expires_at > statement_timestamp() AND revoked_at IS NULL AS live
FROM spend_approvals WHERE tenant_id = %(tenant)s AND queue = %(queue)s
ORDER BY created_at DESC, approval_id
LIMIT %(limit)s;

-- name: live_approval
-- The live approval: not expired and not revoked (a revoked one raises nothing); the
-- queue's own concurrency (NULL: none set); whether the approval expires within `warn`.
SELECT a.approval, q.concurrency,
       coalesce((a.approval->>'expires_at')::timestamptz
                <= statement_timestamp() + %(warn)s::interval, false) AS expiring
FROM (SELECT (SELECT to_jsonb(a) - 'expiry_ledgered_at' FROM spend_approvals a
              WHERE tenant_id = %(tenant)s AND queue = %(queue)s
                AND expires_at > statement_timestamp() AND revoked_at IS NULL
              ORDER BY max_concurrency DESC, created_at DESC LIMIT 1) AS approval) AS a
LEFT JOIN queues q ON q.tenant_id = %(tenant)s AND q.queue = %(queue)s;

-- name: delete_tenant
-- The tables without a foreign key to the tenant first; the rest cascade from `tenants`.
-- Its keys stop at once (every process's key cache hears the notification).
WITH events AS (
    DELETE FROM item_events WHERE tenant_id = %(tenant)s
), receipts AS (
    DELETE FROM idempotency_receipts WHERE tenant_id = %(tenant)s
), letters AS (
    DELETE FROM dead_letters WHERE tenant_id = %(tenant)s
), keys AS (
    SELECT pg_notify('queue_server_keys', '') FROM api_keys WHERE tenant_id = %(tenant)s
)
DELETE FROM tenants WHERE tenant_id = %(tenant)s
RETURNING tenant_id, (SELECT count(*) FROM keys) AS keys;

-- name: delete_counter_deltas
-- After delete_tenant, in the same transaction and a statement of its own: its snapshot
-- sees the deltas of every transition that held one of the tenant's items while
-- delete_tenant waited for it (a delta has no foreign key to cascade from the tenant);
-- a later transition finds no item of the tenant and counts nothing.
DELETE FROM counter_deltas WHERE tenant_id = %(tenant)s;
