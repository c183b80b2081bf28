-- The statements of queue_server/store/sessions.py, run by name. Each `-- name:`
-- block is loaded at import (queue_server/store/sql/__init__.py); the text here is
-- the text sent.

-- name: want_role_defaults
-- The settings the server wants as its role's defaults in this database, as a JSON
-- object, kept on the (direct, never pooled) session for the block below to read.
SELECT set_config('queue_server.role_defaults', %(settings)s, false);

-- name: apply_role_defaults
-- Every wanted setting the role does not have yet in this database becomes its default
-- there (what each server connection a transaction pooler opens then starts with); a
-- NOTICE names each one that changed.
DO $$
DECLARE
    wanted record;
BEGIN
    FOR wanted IN
        SELECT key, value
        FROM json_each_text(current_setting('queue_server.role_defaults')::json)
        WHERE key || '=' || value <> ALL (coalesce((
            SELECT setconfig FROM pg_db_role_setting
            WHERE setrole = (SELECT oid FROM pg_roles WHERE rolname = current_user)
              AND setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
        ), '{}'))
    LOOP
        EXECUTE format('ALTER ROLE CURRENT_USER IN DATABASE %I SET %I = %L',
                       current_database(), wanted.key, wanted.value);
        RAISE NOTICE 'queue-server: %=% is now a default of this role in this database',
                     wanted.key, wanted.value;
    END LOOP;
END
$$;

-- name: wait_for_standby
-- Writes WAL under a transaction id, so the COMMIT of the transaction it runs in waits
-- for the synchronous standby (a transaction that only took an id writes no WAL before
-- its commit record, and PostgreSQL does not make such a COMMIT wait).
SELECT pg_logical_emit_message(true, 'queue-server', 'confirm');

-- name: begin
-- The three statements of a transaction sent inside a pipeline (`pipelined_transaction`).
BEGIN;

-- name: commit
COMMIT;

-- name: rollback
ROLLBACK;
