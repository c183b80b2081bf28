-- The statements of queue_server/store/bootstrap.py, run by name. Each `-- name:`
-- block is loaded at import (queue_server/store/sql/__init__.py); the text here is
-- the text sent.

-- name: database_exists
SELECT 1 FROM pg_database WHERE datname = %s;

-- name: create_database
CREATE DATABASE queue_server;
