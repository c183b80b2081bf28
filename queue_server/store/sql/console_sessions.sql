-- The statements of queue_server/store/console_sessions.py, run by name. Each `-- name:`
-- block is loaded at import (queue_server/store/sql/__init__.py); the text here is
-- the text sent.

-- name: open_session
-- A new session of a key; the key's sessions that ended or expired a day ago go with it.
WITH gone AS (
    DELETE FROM console_sessions
    WHERE key_id = %(key_id)s
      AND coalesce(ended_at, expires_at) < statement_timestamp() - interval '1 day'
)
INSERT INTO console_sessions (session_hash, key_id, created_at, expires_at)
VALUES (
    %(session_hash)s, %(key_id)s, statement_timestamp(),
    statement_timestamp() + make_interval(secs => %(ttl)s)
);

-- name: session_key
-- The key of a live session: not ended, not expired, its key not revoked.
SELECT k.key_id, k.tenant_id, k.role
FROM console_sessions s
JOIN api_keys k ON k.key_id = s.key_id
WHERE s.session_hash = %(session_hash)s
  AND s.ended_at IS NULL
  AND s.expires_at > statement_timestamp()
  AND k.revoked_at IS NULL;

-- name: end_session
UPDATE console_sessions SET ended_at = statement_timestamp()
WHERE session_hash = %(session_hash)s AND ended_at IS NULL;
