-- The statements of queue_server/store/sweeps.py, each a `-- name:` block, loaded at import
-- (queue_server/store/sql/__init__.py) and run by name: the text here is the text sent.

-- name: try_lock
SELECT pg_try_advisory_xact_lock(%(class)s, %(sweep)s) AS locked;
