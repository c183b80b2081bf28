#!/bin/sh
# Run once by the postgres image on a new volume (/docker-entrypoint-initdb.d): the server's
# own role, which owns its database and is neither superuser nor CREATEROLE. The image's
# POSTGRES_USER stays the administrator; the server never connects as it. Also the role
# queue_server_enqueuer (migration 0017 needs it and the server's role may not create it):
# an application's role is made a member of it by `queue-server db grant-enqueue`.
set -eu
: "${QUEUE_SERVER_DB_PASSWORD:?set QUEUE_SERVER_DB_PASSWORD}"
psql -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d postgres -v pw="$QUEUE_SERVER_DB_PASSWORD" <<'SQL'
SELECT format('CREATE ROLE queue_server LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD %L', :'pw')
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'queue_server') \gexec
SELECT 'CREATE ROLE queue_server_enqueuer NOLOGIN'
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'queue_server_enqueuer') \gexec
SELECT 'CREATE DATABASE queue_server OWNER queue_server'
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = 'queue_server') \gexec
SQL
