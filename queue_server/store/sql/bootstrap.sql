-- The statements of queue_server/store/bootstrap.py, run by name. Each `-- name:`
-- block is loaded at import (queue_server/store/sql/__init__.py); the text here is
-- the text sent.

-- name: role_exists
SELECT 1 FROM pg_roles WHERE rolname = %s;

-- name: create_role
-- The server's own role: it logs in and owns the schema's objects, and nothing more. (A
-- utility statement takes no server-side parameter: the password is bound client-side.)
CREATE ROLE queue_server LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
    PASSWORD %(password)s;

-- name: set_role_password
ALTER ROLE queue_server LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS
    PASSWORD %(password)s;

-- name: create_enqueuer_role
-- What an application's role is made a member of to call queue_server.enqueue (migration
-- 0017 grants it EXECUTE on that, and nothing else); made here because the server's
-- role may not create roles.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'queue_server_enqueuer') THEN
        CREATE ROLE queue_server_enqueuer NOLOGIN;
    END IF;
END
$$;

-- name: grant_read_all_stats
-- The server's role reads every session's backend_xmin and transaction start in
-- pg_stat_activity (without it, other roles' sessions show NULLs there): /metrics and the
-- console report the oldest snapshot holding the horizon back, a pg_dump's included.
GRANT pg_read_all_stats TO queue_server;

-- name: create_database
CREATE DATABASE queue_server OWNER queue_server;

-- name: database_owner
SELECT pg_get_userbyid(datdba) AS owner FROM pg_database WHERE datname = %s;

-- name: alter_database_owner
ALTER DATABASE queue_server OWNER TO queue_server;

-- name: hand_over_objects
-- A database the superuser made (before the server had a role of its own): every object of
-- its schema goes to the server's role. Tables first: their identity sequences follow them.
DO $$
DECLARE
    target text := 'queue_server';
    r record;
BEGIN
    FOR r IN
        SELECT c.oid::regclass AS name, c.relkind FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm')
          AND pg_get_userbyid(c.relowner) <> target
    LOOP
        EXECUTE format('ALTER %s %s OWNER TO %I',
            CASE r.relkind WHEN 'v' THEN 'VIEW' WHEN 'm' THEN 'MATERIALIZED VIEW' ELSE 'TABLE' END,
            r.name, target);
    END LOOP;
    FOR r IN
        SELECT c.oid::regclass AS name FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'public' AND c.relkind = 'S' AND pg_get_userbyid(c.relowner) <> target
    LOOP
        EXECUTE format('ALTER SEQUENCE %s OWNER TO %I', r.name, target);
    END LOOP;
    FOR r IN
        SELECT t.oid::regtype AS name FROM pg_type t
        JOIN pg_namespace n ON n.oid = t.typnamespace
        WHERE n.nspname = 'public' AND t.typtype IN ('e', 'd')
          AND pg_get_userbyid(t.typowner) <> target
    LOOP
        EXECUTE format('ALTER TYPE %s OWNER TO %I', r.name, target);
    END LOOP;
    FOR r IN
        SELECT p.oid::regprocedure AS name FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'public' AND pg_get_userbyid(p.proowner) <> target
    LOOP
        EXECUTE format('ALTER ROUTINE %s OWNER TO %I', r.name, target);
    END LOOP;
END
$$;

-- name: schema_revisions
-- The revisions alembic recorded (a database it never migrated has no such table).
SELECT version_num FROM alembic_version;

-- name: create_backup_role
-- The local backup's role (`serve --backup-repo`): it streams WAL and takes base backups
-- over a replication connection (pg_hba.conf lets it in over the Unix socket only), and
-- may start and stop a backup, switch WAL and read the settings a backup checks; it owns
-- nothing and reads no table.
CREATE ROLE queue_server_backup LOGIN REPLICATION NOSUPERUSER NOCREATEDB NOCREATEROLE
    NOBYPASSRLS PASSWORD %(password)s;

-- name: set_backup_role_password
ALTER ROLE queue_server_backup LOGIN REPLICATION NOSUPERUSER NOCREATEDB NOCREATEROLE
    NOBYPASSRLS PASSWORD %(password)s;

-- name: grant_backup_privileges
-- What Barman asks of a backup role that is not a superuser.
GRANT pg_read_all_settings, pg_read_all_stats, pg_checkpoint TO queue_server_backup;
GRANT EXECUTE ON FUNCTION pg_backup_start(text, boolean) TO queue_server_backup;
GRANT EXECUTE ON FUNCTION pg_backup_stop(boolean) TO queue_server_backup;
GRANT EXECUTE ON FUNCTION pg_switch_wal() TO queue_server_backup;
GRANT EXECUTE ON FUNCTION pg_create_restore_point(text) TO queue_server_backup;

-- name: drop_replication_slot
-- The backup's slot, once archiving is turned off: a slot nobody reads keeps every WAL
-- segment from then on, until the disk is full.
SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
WHERE slot_name = %s AND NOT active;

-- name: in_recovery
-- A restored database replays WAL until its target, then is promoted and takes writes.
SELECT pg_is_in_recovery();
