-- The statements of queue_server/store/channels.py, run by name. Each `-- name:`
-- block is loaded at import (queue_server/store/sql/__init__.py); the text here is
-- the text sent.

-- name: listen_ready
LISTEN queue_server_ready;

-- name: listen_keys
LISTEN queue_server_keys;

-- name: listener_probe
-- The notifier's check on a session that has been quiet for a while.
SELECT 1;
