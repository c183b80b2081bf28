-- The policy versions the server has started under or an admin has published: one row per
-- version, which names one document (its sha256): a name is never reused for other content.

-- name: record_load
-- A process loads this document: the first load keeps its time, the last is now. A version
-- kept with other content returns no row: the caller refuses the document.
INSERT INTO policy_versions AS p (version, sha256, source, document, first_loaded_at,
    last_loaded_at, loads)
VALUES (%(version)s, %(sha256)s, %(source)s, %(document)s, statement_timestamp(),
    statement_timestamp(), 1)
ON CONFLICT (version) DO UPDATE
SET source = EXCLUDED.source, last_loaded_at = statement_timestamp(), loads = p.loads + 1
WHERE p.sha256 = EXCLUDED.sha256
RETURNING version, sha256, source, first_loaded_at, last_loaded_at, loads;

-- name: publish
-- An admin publishes this document and activates it: a new version keeps who, why and when;
-- the same document again is activated again (its first publication kept). A version kept
-- with other content returns no row: the caller refuses it, naming the content kept. The
-- policy channel tells every API process to read the version activated last at once.
WITH published AS (
INSERT INTO policy_versions AS p (version, sha256, source, document, first_loaded_at,
    last_loaded_at, loads, published_by, reason, published_at, activated_at)
VALUES (%(version)s, %(sha256)s, 'published', %(document)s, statement_timestamp(),
    statement_timestamp(), 0, %(actor)s, %(reason)s, statement_timestamp(),
    statement_timestamp())
ON CONFLICT (version) DO UPDATE
SET activated_at = statement_timestamp(),
    published_by = coalesce(p.published_by, EXCLUDED.published_by),
    reason = coalesce(p.reason, EXCLUDED.reason),
    published_at = coalesce(p.published_at, EXCLUDED.published_at)
WHERE p.sha256 = EXCLUDED.sha256
RETURNING version, sha256, source, first_loaded_at, last_loaded_at, loads, published_by,
    reason, published_at, activated_at, (xmax = 0) AS created
)
SELECT published.* FROM published, (SELECT pg_notify('queue_server_policy', '')) AS n;

-- name: kept_sha256
-- The content a version name is kept with, for the refusal of other content under it.
SELECT sha256 FROM policy_versions WHERE version = %(version)s;

-- name: active
-- The published version activated last: what a server started without --policy runs under.
SELECT version, sha256, document
FROM policy_versions
WHERE activated_at IS NOT NULL
ORDER BY activated_at DESC, version
LIMIT 1;

-- name: list_versions
-- Newest start first; the table is one row per version the server ran, so it stays small.
SELECT version, sha256, source, first_loaded_at, last_loaded_at, loads, published_by, reason,
    published_at, activated_at
FROM policy_versions
ORDER BY greatest(last_loaded_at, activated_at) DESC, version, sha256;

-- name: record_enqueue_envelope
-- The loaded policy's ceilings that queue_server.enqueue (an application's transaction)
-- applies, and how long its receipts are kept: the last server started decides.
UPDATE enqueue_envelope
SET policy_version = %(version)s, attempt_cap = %(attempt_cap)s, backlog_cap = %(backlog_cap)s,
    receipt_retention = %(retention)s, updated_at = statement_timestamp();
