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

