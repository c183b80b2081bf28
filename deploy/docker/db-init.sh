#!/bin/sh
# One-shot: the application's role, the role applications enqueue through
# (queue_server_enqueuer, which the server's role may not create) and the database on the
# leader (through HAProxy), if missing.
set -eu
: "${PGPASSWORD:?set PGPASSWORD (the superuser's)}"
: "${QUEUE_SERVER_DB_PASSWORD:?set QUEUE_SERVER_DB_PASSWORD}"
until pg_isready -h pg-router -p 5000 -U postgres; do sleep 1; done
psql -h pg-router -p 5000 -U postgres -v ON_ERROR_STOP=1 -v pw="$QUEUE_SERVER_DB_PASSWORD" <<'SQL'
SELECT format('CREATE ROLE queue_server LOGIN PASSWORD %L', :'pw')
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'queue_server') \gexec
SELECT 'CREATE ROLE queue_server_enqueuer NOLOGIN'
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'queue_server_enqueuer') \gexec
SELECT 'CREATE DATABASE queue_server OWNER queue_server'
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'queue_server') \gexec
SQL
