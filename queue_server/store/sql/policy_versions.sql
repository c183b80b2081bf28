-- The policy versions the server has started under: one row per (version, sha256).

-- name: record_load
-- A start under this document: the first start keeps its time, the last is now.
INSERT INTO policy_versions AS p (version, sha256, source, document, first_loaded_at,
    last_loaded_at, loads)
VALUES (%(version)s, %(sha256)s, %(source)s, %(document)s, statement_timestamp(),
    statement_timestamp(), 1)
ON CONFLICT (version, sha256) DO UPDATE
SET source = EXCLUDED.source, last_loaded_at = statement_timestamp(), loads = p.loads + 1
RETURNING version, sha256, source, first_loaded_at, last_loaded_at, loads;

-- name: list_versions
-- Newest start first; the table is one row per version the server ran, so it stays small.
SELECT version, sha256, source, first_loaded_at, last_loaded_at, loads
FROM policy_versions
ORDER BY last_loaded_at DESC, version, sha256;

-- name: record_enqueue_envelope
-- The loaded policy's ceilings that queue_server.enqueue (an application's transaction)
-- applies, and how long its receipts are kept: the last server started decides.
UPDATE enqueue_envelope
SET policy_version = %(version)s, attempt_cap = %(attempt_cap)s, backlog_cap = %(backlog_cap)s,
    receipt_retention = %(retention)s, updated_at = statement_timestamp();
