-- The statements of queue_server/store/sweeps.py, run by name. Each `-- name:`
-- block is loaded at import (queue_server/store/sql/__init__.py); the text here is
-- the text sent.

-- name: try_lock
SELECT pg_try_advisory_xact_lock(%(class)s, %(sweep)s) AS locked;
