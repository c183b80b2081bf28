-- The statements of queue_server/store/enqueue_grants.py, run by name. Each `-- name:`
-- block is loaded at import (queue_server/store/sql/__init__.py); the text here is
-- the text sent.

-- name: grant_enqueue
-- The role (made, logging in with the password, when it does not exist) may call
-- queue_server.enqueue for the tenant: the functions of migration 0017 quote its name.
SELECT queue_server.grant_enqueue(%(role)s, %(tenant)s, %(password)s) AS created;

-- name: revoke_enqueue
SELECT queue_server.revoke_enqueue(%(role)s, %(tenant)s) AS revoked;

-- name: list_grants
-- Every grant, by tenant then role; a role dropped since shows as not existing.
SELECT g.tenant_id AS tenant, coalesce(r.rolname, g.role_name) AS role,
       r.oid IS NOT NULL AS role_exists, g.granted_at
FROM enqueue_grants g LEFT JOIN pg_roles r ON r.oid = g.role_oid
WHERE %(tenant)s::text IS NULL OR g.tenant_id = %(tenant)s
ORDER BY g.tenant_id, 2;


-- name: restrict_advisory_locks
-- Advisory locks are the server's own (the queue locks of `acquire`, the deliverers' and
-- sweepers' locks): a role that could take them, an application's role among them, could
-- stall another tenant's workers. Their keys cannot be hidden (pg_locks shows every held
-- key to every role), so the lock functions are taken from PUBLIC, in this database only,
-- and given to the role that owns the queue's tables (the server's). Unlocking is left
-- to everyone: a role can release only the locks it holds. Needs a superuser.
DO $$
DECLARE
    f regprocedure;
    server_role text := (SELECT pg_get_userbyid(relowner) FROM pg_class
                         WHERE oid = 'work_items'::regclass);
BEGIN
    FOR f IN
        SELECT p.oid::regprocedure FROM pg_proc p
        WHERE p.pronamespace = 'pg_catalog'::regnamespace
          AND p.proname ~ '^pg_(try_)?advisory_(xact_)?lock(_shared)?$'
    LOOP
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I', f, server_role);
    END LOOP;
END
$$;

-- name: name_own_schema
-- Whose schema `own_schema` makes (a DO block takes no parameter): for this transaction.
SELECT set_config('queue_server.own_schema', %(role)s, true);

-- name: own_schema
-- A schema named like the role and owned by it, for the application's own tables beside
-- the queue's: PostgreSQL's default search_path ("$user", public) puts it first, so the
-- role's CREATE TABLE lands there (public takes no CREATE from other roles).
DO $$
DECLARE
    r text := current_setting('queue_server.own_schema');
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = r) THEN
        EXECUTE format('CREATE SCHEMA %I AUTHORIZATION %I', r, r);
    ELSIF (SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = r) <> r THEN
        RAISE EXCEPTION 'schema % exists and belongs to another role', r
            USING ERRCODE = 'duplicate_schema';
    END IF;
END
$$;
