-- The statements of queue_server/store/bootstrap.py, each a `-- name:` block, loaded at import
-- (queue_server/store/sql/__init__.py) and run by name: the text here is the text sent.

-- name: database_exists
SELECT 1 FROM pg_database WHERE datname = %s;

-- name: create_database
CREATE DATABASE queue_server;
