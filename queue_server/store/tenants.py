"""Tenants, API keys and spend approvals: rows that are not work items."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from queue_server.store.channels import KEYS_CHANNEL
from queue_server.store.sql import Statements
from queue_server.store.types import Conn, Row

_SQL = Statements(__name__)

_PUT_TENANT = _SQL(
    "put_tenant",
    """
INSERT INTO tenants (tenant_id, backlog_cap, default_max_acquisitions, default_lease_ttl,
                     retention)
VALUES (%(tenant)s, %(backlog_cap)s, %(default_max_acquisitions)s, %(default_lease_ttl)s,
        %(retention)s)
ON CONFLICT (tenant_id) DO UPDATE
SET backlog_cap = excluded.backlog_cap,
    default_max_acquisitions = excluded.default_max_acquisitions,
    default_lease_ttl = excluded.default_lease_ttl,
    retention = excluded.retention,
    updated_at = statement_timestamp()
RETURNING *
""",
)


async def put_tenant(
    conn: Conn,
    *,
    tenant: str,
    backlog_cap: int,
    default_max_acquisitions: int,
    default_lease_ttl: timedelta,
    retention: timedelta,
) -> Row:
    """Create the tenant or replace its settings."""
    cur = await conn.execute(
        _PUT_TENANT,
        {
            "tenant": tenant,
            "backlog_cap": backlog_cap,
            "default_max_acquisitions": default_max_acquisitions,
            "default_lease_ttl": default_lease_ttl,
            "retention": retention,
        },
    )
    row = await cur.fetchone()
    assert row is not None
    return row


_GET_TENANT = _SQL("get_tenant", "SELECT * FROM tenants WHERE tenant_id = %s")


async def get_tenant(conn: Conn, tenant: str) -> Row | None:
    cur = await conn.execute(_GET_TENANT, (tenant,))
    return await cur.fetchone()


# The backlog of tenant row `t`: admitted minus the releases on all its shards.
_BACKLOG_OF_T = """(t.admitted - coalesce((SELECT sum(released) FROM backlog_releases r
                                 WHERE r.tenant_id = t.tenant_id), 0))::bigint"""

_LIST_TENANTS = _SQL(
    "list_tenants",
    f"""
SELECT t.*, {_BACKLOG_OF_T} AS backlog FROM tenants t
WHERE %(after)s::text IS NULL OR t.tenant_id > %(after)s
ORDER BY t.tenant_id LIMIT %(limit)s
""",
)


async def list_tenants(conn: Conn, *, after: str | None, limit: int) -> list[Row]:
    """Tenants in name order after `after` (the primary key serves it), with their backlog."""
    cur = await conn.execute(_LIST_TENANTS, {"after": after, "limit": limit})
    return await cur.fetchall()


_LIST_KEYS = _SQL(
    "list_keys",
    """
SELECT key_id, tenant_id, role, created_at, revoked_at FROM api_keys
WHERE tenant_id = %(tenant)s AND (%(revoked)s OR revoked_at IS NULL)
ORDER BY created_at, key_id
""",
)


async def list_keys(conn: Conn, *, tenant: str, revoked: bool) -> list[Row]:
    """The tenant's keys, oldest first, without their secrets' hashes."""
    cur = await conn.execute(_LIST_KEYS, {"tenant": tenant, "revoked": revoked})
    return await cur.fetchall()


_RELEASED = _SQL(
    "released",
    """
SELECT coalesce(sum(released), 0) AS released FROM backlog_releases WHERE tenant_id = %(tenant)s
""",
)


_ADMIT = _SQL(
    "admit",
    "SELECT * FROM tenants WHERE tenant_id = %s FOR NO KEY UPDATE",
)


async def admit(conn: Conn, tenant: str) -> tuple[Row | None, int]:
    """Take the tenant's admission lock (held until the transaction ends), then read its backlog.

    Backlog = items admitted (counted under this lock) - items released (completed or
    quarantined, counted on shards without it). Two statements: the second's snapshot
    is taken after the lock is granted, so it sees every release committed before.
    A release still in flight is not counted yet, which errs on the side of the cap.
    """
    # NO KEY UPDATE: serialises admissions without blocking inserts that reference the tenant.
    cur = await conn.execute(_ADMIT, (tenant,))
    row = await cur.fetchone()
    if row is None:
        return None, 0
    cur = await conn.execute(_RELEASED, {"tenant": tenant})
    released = await cur.fetchone()
    assert released is not None
    return row, int(row["admitted"]) - int(released["released"])


_ROOM = _SQL(
    "room",
    f"""
SELECT t.backlog_cap,
       {_BACKLOG_OF_T} AS backlog,
       EXISTS (SELECT 1 FROM idempotency_receipts i
               WHERE i.tenant_id = t.tenant_id AND i.idempotency_key = %(key)s) AS has_receipt
FROM tenants t WHERE t.tenant_id = %(tenant)s
""",
)


async def room(conn: Conn, *, tenant: str, key: str) -> Row | None:
    """Without any lock: the cap, the backlog, and whether the key already has a receipt."""
    cur = await conn.execute(_ROOM, {"tenant": tenant, "key": key})
    return await cur.fetchone()


_BACKLOG = _SQL(
    "backlog",
    f"SELECT {_BACKLOG_OF_T} AS backlog FROM tenants t WHERE t.tenant_id = %s",
)


async def backlog(conn: Conn, tenant: str) -> int:
    """Ready + leased items of the tenant, from the admission counters (no lock taken)."""
    cur = await conn.execute(_BACKLOG, (tenant,))
    row = await cur.fetchone()
    return int(row["backlog"]) if row is not None else 0


_CREATE_KEY = _SQL(
    "create_key",
    "INSERT INTO api_keys (key_id, tenant_id, role, secret_hash)"
    " VALUES (%s, %s, %s, %s) RETURNING *",
)


async def create_key(
    conn: Conn, *, key_id: str, tenant: str | None, role: str, secret_hash: str
) -> Row:
    cur = await conn.execute(_CREATE_KEY, (key_id, tenant, role, secret_hash))
    row = await cur.fetchone()
    assert row is not None
    return row


_GET_KEY = _SQL("get_key", "SELECT * FROM api_keys WHERE key_id = %s")


async def get_key(conn: Conn, key_id: str) -> Row | None:
    cur = await conn.execute(_GET_KEY, (key_id,))
    return await cur.fetchone()


_REVOKE_KEY = _SQL(
    "revoke_key",
    "UPDATE api_keys SET revoked_at = coalesce(revoked_at, statement_timestamp())"
    f" WHERE tenant_id = %s AND key_id = %s RETURNING pg_notify('{KEYS_CHANNEL}', key_id)",
)


async def revoke_key(conn: Conn, *, tenant: str, key_id: str) -> bool:
    """Revoked at once: every request checks `revoked_at`."""
    cur = await conn.execute(_REVOKE_KEY, (tenant, key_id))
    return await cur.fetchone() is not None


_REVOKE_ADMIN_KEY = _SQL(
    "revoke_admin_key",
    "UPDATE api_keys SET revoked_at = coalesce(revoked_at, statement_timestamp())"
    f" WHERE role = 'admin' AND key_id = %s RETURNING pg_notify('{KEYS_CHANNEL}', key_id)",
)


async def revoke_admin_key(conn: Conn, key_id: str) -> bool:
    """Revoke one admin key, at once in every API process (the keys channel)."""
    cur = await conn.execute(_REVOKE_ADMIN_KEY, (key_id,))
    return await cur.fetchone() is not None


_REVOKE_OTHER_ADMIN_KEYS = _SQL(
    "revoke_other_admin_keys",
    "UPDATE api_keys SET revoked_at = statement_timestamp()"
    " WHERE role = 'admin' AND revoked_at IS NULL AND key_id <> %s"
    f" RETURNING key_id, pg_notify('{KEYS_CHANNEL}', key_id)",
)


async def revoke_other_admin_keys(conn: Conn, *, keep: str) -> list[str]:
    """Revoke every active admin key but `keep`; returns the ids revoked."""
    cur = await conn.execute(_REVOKE_OTHER_ADMIN_KEYS, (keep,))
    return sorted(str(row["key_id"]) for row in await cur.fetchall())


_LIST_ADMIN_KEYS = _SQL(
    "list_admin_keys",
    "SELECT key_id, created_at, revoked_at FROM api_keys WHERE role = 'admin'"
    " ORDER BY created_at, key_id",
)


async def list_admin_keys(conn: Conn) -> list[Row]:
    cur = await conn.execute(_LIST_ADMIN_KEYS)
    return await cur.fetchall()


_LOCK_ADMIN_KEYS = _SQL(
    "lock_admin_keys",
    "SELECT pg_advisory_xact_lock(hashtext('queue-server-admin-key'))",
)


async def lock_admin_keys(conn: Conn) -> None:
    """Serialise changes to the admin keys: the first one's creation, rotation and revocation
    (so two admins revoking each other cannot leave none). Held until the transaction ends."""
    await conn.execute(_LOCK_ADMIN_KEYS)


_COUNT_ADMIN_KEYS = _SQL(
    "count_admin_keys",
    "SELECT count(*) AS n FROM api_keys WHERE role = 'admin' AND revoked_at IS NULL",
)


async def count_admin_keys(conn: Conn) -> int:
    cur = await conn.execute(_COUNT_ADMIN_KEYS)
    row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


_ADD_SPEND_APPROVAL = _SQL(
    "add_spend_approval",
    "INSERT INTO spend_approvals"
    " (tenant_id, queue, approved_by, max_concurrency, expires_at, reason)"
    " VALUES (%s, %s, %s, %s, %s, %s) RETURNING *, expires_at > statement_timestamp() AS live",
)


async def add_spend_approval(
    conn: Conn,
    *,
    tenant: str,
    queue: str,
    approved_by: str,
    max_concurrency: int,
    expires_at: datetime,
    reason: str,
) -> Row:
    cur = await conn.execute(
        _ADD_SPEND_APPROVAL, (tenant, queue, approved_by, max_concurrency, expires_at, reason)
    )
    row = await cur.fetchone()
    assert row is not None
    return row


_CONCURRENCY = _SQL(
    "concurrency",
    """
SELECT (SELECT count(*) FROM work_items
        WHERE tenant_id = %(tenant)s AND queue = %(queue)s AND state = 'leased'
          AND lease_expires_at > statement_timestamp()) AS active_leases,
       (SELECT to_jsonb(a) FROM spend_approvals a
        WHERE tenant_id = %(tenant)s AND queue = %(queue)s
          AND expires_at > statement_timestamp()
        ORDER BY max_concurrency DESC, created_at DESC LIMIT 1) AS approval
""",
)


async def concurrency(
    conn: Conn, *, tenant: str, queue: str, base_limit: int = 1
) -> dict[str, Any]:
    """The queue's limit (`base_limit`, the policy's local concurrency, without a live spend
    approval) and its active leases."""
    cur = await conn.execute(_CONCURRENCY, {"tenant": tenant, "queue": queue})
    row = await cur.fetchone()
    assert row is not None
    approval = row["approval"]
    return {
        "limit": approval["max_concurrency"] if approval else base_limit,
        "active_leases": row["active_leases"],
        "approval": approval,
    }


# The tables without a foreign key to the tenant first; the rest cascade from `tenants`.
# Its keys stop at once (every process's key cache hears the notification).
_DELETE_TENANT = _SQL(
    "delete_tenant",
    f"""
WITH events AS (
    DELETE FROM item_events WHERE tenant_id = %(tenant)s
), receipts AS (
    DELETE FROM idempotency_receipts WHERE tenant_id = %(tenant)s
), letters AS (
    DELETE FROM dead_letters WHERE tenant_id = %(tenant)s
), releases AS (
    DELETE FROM backlog_releases WHERE tenant_id = %(tenant)s
), keys AS (
    SELECT pg_notify('{KEYS_CHANNEL}', key_id) FROM api_keys WHERE tenant_id = %(tenant)s
)
DELETE FROM tenants WHERE tenant_id = %(tenant)s
RETURNING tenant_id, (SELECT count(*) FROM keys) AS keys
""",
)


async def delete_tenant(conn: Conn, *, tenant: str) -> bool:
    """The tenant and everything of it: items, ledgers, receipts, runs, watchers, keys."""
    cur = await conn.execute(_DELETE_TENANT, {"tenant": tenant})
    return await cur.fetchone() is not None
