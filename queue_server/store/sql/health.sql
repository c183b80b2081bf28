-- The statements of queue_server/store/health.py, run by name. Each `-- name:`
-- block is loaded at import (queue_server/store/sql/__init__.py); the text here is
-- the text sent.

-- name: horizon_holders
-- What holds back the xmin horizon (the oldest row version VACUUM, pruning and index
-- hints must keep), one row per kind of holder, every kind always present: how many
-- there are, the age in seconds of the oldest (NULL for replication slots, which keep
-- no time) and its age in transactions.
--   snapshot: every backend with a backend_xmin (an open transaction or a running
--     statement's snapshot, of any database and any role, a walsender with
--     hot_standby_feedback too), aged from its transaction's start, else its
--     statement's; only this session, which runs the query, is left out. A role
--     without pg_read_all_stats sees no backend_xmin of other roles' sessions.
--   replication_slot: slots that keep an xmin or catalog_xmin (a standby's
--     hot_standby_feedback, a logical slot not consumed).
--   prepared_transaction: transactions prepared for two-phase commit, not yet
--     committed or rolled back, aged from their PREPARE.
SELECT 'snapshot' AS holder, count(*) AS holders,
       max(extract(epoch FROM statement_timestamp()
                   - coalesce(xact_start, query_start, backend_start)))::float8 AS age_seconds,
       coalesce(max(age(backend_xmin)), 0)::bigint AS xid_age
FROM pg_stat_activity
WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid()
UNION ALL
SELECT 'replication_slot', count(*), NULL::float8,
       coalesce(max(greatest(age(xmin), age(catalog_xmin))), 0)::bigint
FROM pg_replication_slots
WHERE xmin IS NOT NULL OR catalog_xmin IS NOT NULL
UNION ALL
SELECT 'prepared_transaction', count(*),
       max(extract(epoch FROM statement_timestamp() - prepared))::float8,
       coalesce(max(age(transaction)), 0)::bigint
FROM pg_prepared_xacts;

-- name: table_tuples
-- Live and dead row versions of the named tables (the statistics collector's estimates,
-- as autovacuum reads them), resolved on the search path; a name that is not a table
-- there is left out.
SELECT s.relname AS "table", s.n_live_tup AS live, s.n_dead_tup AS dead
FROM unnest(%(tables)s::text[]) AS t(name)
JOIN pg_stat_user_tables s ON s.relid = to_regclass(t.name)
ORDER BY s.relname;

-- name: connection_limits
-- The connections the database takes: max_connections, and the slots kept for superusers
-- and (PostgreSQL 16 on) for roles granted pg_use_reserved_connections.
SELECT current_setting('max_connections')::int AS max_connections,
       current_setting('superuser_reserved_connections')::int
       + coalesce(current_setting('reserved_connections', true)::int, 0) AS reserved;
