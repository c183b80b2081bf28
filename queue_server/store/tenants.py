"""Tenants, API keys and spend approvals: rows that are not work items."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from queue_server.store import queues
from queue_server.store.sql import load
from queue_server.store.types import Conn, Row

_SQL = load("tenants")


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
        _SQL["put_tenant"],
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


async def get_tenant(conn: Conn, tenant: str) -> Row | None:
    cur = await conn.execute(_SQL["get_tenant"], (tenant,))
    return await cur.fetchone()


async def list_tenants(conn: Conn, *, after: str | None, limit: int) -> list[Row]:
    """Tenants in name order after `after` (the primary key serves it), with their backlog."""
    cur = await conn.execute(_SQL["list_tenants"], {"after": after, "limit": limit})
    return await cur.fetchall()


async def list_keys(conn: Conn, *, tenant: str, revoked: bool) -> list[Row]:
    """The tenant's keys, oldest first, without their secrets' hashes."""
    cur = await conn.execute(_SQL["list_keys"], {"tenant": tenant, "revoked": revoked})
    return await cur.fetchall()


async def take_admission(conn: Conn, *, tenant: str, n: int, cap: int) -> list[int]:
    """The tenant's admission shards that take `n` items back into its backlog (a replay,
    a retry), one entry per item, each locked until the transaction ends
    (`queue_server.admission_shards`, as an enqueue takes them). Refused (QS429: the caller
    translates it with `db.admission_refusals`) when the backlog + `n` would exceed `cap`.
    """
    cur = await conn.execute(_SQL["take_admission"], {"tenant": tenant, "n": n, "cap": cap})
    row = await cur.fetchone()
    assert row is not None
    return [int(shard) for shard in row["shards"]]


async def room(conn: Conn, *, tenant: str, key: str | None = None) -> Row | None:
    """Without any lock: the cap, the backlog, and whether `key` (when given) already has a
    receipt."""
    cur = await conn.execute(_SQL["room"], {"tenant": tenant, "key": key})
    return await cur.fetchone()


async def backlog(conn: Conn, tenant: str) -> int:
    """Ready + leased items of the tenant, from the admission counters (no lock taken)."""
    cur = await conn.execute(_SQL["backlog"], (tenant,))
    row = await cur.fetchone()
    return int(row["backlog"]) if row is not None else 0


async def create_key(
    conn: Conn,
    *,
    key_id: str,
    tenant: str | None,
    role: str,
    secret_hash: str,
    name: str | None = None,
) -> Row:
    cur = await conn.execute(_SQL["create_key"], (key_id, tenant, role, secret_hash, name))
    row = await cur.fetchone()
    assert row is not None
    return row


async def get_key(conn: Conn, key_id: str) -> Row | None:
    cur = await conn.execute(_SQL["get_key"], (key_id,))
    return await cur.fetchone()


async def revoke_key(conn: Conn, *, tenant: str, key_id: str) -> bool:
    """Revoked at once: every request checks `revoked_at`."""
    cur = await conn.execute(_SQL["revoke_key"], (tenant, key_id))
    return await cur.fetchone() is not None


async def revoke_admin_key(conn: Conn, key_id: str) -> bool:
    """Revoke one admin key, at once in every API process (the keys channel)."""
    cur = await conn.execute(_SQL["revoke_admin_key"], (key_id,))
    return await cur.fetchone() is not None


async def revoke_other_admin_keys(conn: Conn, *, keep: str) -> list[str]:
    """Revoke every active admin key but `keep`; returns the ids revoked."""
    cur = await conn.execute(_SQL["revoke_other_admin_keys"], (keep,))
    return sorted(str(row["key_id"]) for row in await cur.fetchall())


async def list_admin_keys(conn: Conn) -> list[Row]:
    cur = await conn.execute(_SQL["list_admin_keys"])
    return await cur.fetchall()


async def lock_admin_keys(conn: Conn) -> None:
    """Serialise changes to the admin keys: the first one's creation, rotation and revocation
    (so two admins revoking each other cannot leave none). Held until the transaction ends."""
    await conn.execute(_SQL["lock_admin_keys"])


async def count_admin_keys(conn: Conn) -> int:
    cur = await conn.execute(_SQL["count_admin_keys"])
    row = await cur.fetchone()
    assert row is not None
    return int(row["n"])


async def spend_window(conn: Conn, *, expires_at: datetime) -> Row:
    """Whether `expires_at` is in the future (`future`) and at most a year ahead
    (`within_year`) on the database's clock, and that year's end (`latest`)."""
    cur = await conn.execute(_SQL["spend_window"], {"expires_at": expires_at})
    row = await cur.fetchone()
    assert row is not None
    return row


async def add_spend_approval(
    conn: Conn,
    *,
    tenant: str,
    queue: str,
    key_id: str,
    role: str,
    max_concurrency: int,
    expires_at: datetime,
    reason: str,
) -> Row:
    """Record an approval by the key `key_id` (of `role`)."""
    cur = await conn.execute(
        _SQL["add_spend_approval"],
        {
            "tenant": tenant,
            "queue": queue,
            "key_id": key_id,
            "role": role,
            "max_concurrency": max_concurrency,
            "expires_at": expires_at,
            "reason": reason,
        },
    )
    row = await cur.fetchone()
    assert row is not None
    return row


async def revoke_spend_approval(
    conn: Conn, *, tenant: str, queue: str, approval_id: str, key_id: str
) -> Row | None:
    """The approval, revoked by `key_id` (or earlier, by whoever revoked it first); None when
    the queue has no such approval."""
    cur = await conn.execute(
        _SQL["revoke_spend_approval"],
        {"tenant": tenant, "queue": queue, "approval_id": approval_id, "key_id": key_id},
    )
    return await cur.fetchone()


async def list_spend_approvals(conn: Conn, *, tenant: str, queue: str, limit: int) -> list[Row]:
    """The queue's approvals, live, expired and revoked, newest first."""
    cur = await conn.execute(
        _SQL["list_spend_approvals"], {"tenant": tenant, "queue": queue, "limit": limit}
    )
    return await cur.fetchall()


async def spend_limit(
    conn: Conn,
    *,
    tenant: str,
    queue: str,
    base_limit: int = 1,
    max_approved: int | None = None,
    warn: timedelta = timedelta(0),
) -> dict[str, Any]:
    """The queue's limit and what sets it: the approved limit (`base_limit`, the policy's
    local concurrency, without a live spend approval; with one, its `max_concurrency`, at
    most `max_approved`), the queue's own `concurrency` below it (None: not set), the
    approval, and whether it expires within `warn` (`expiring`)."""
    cur = await conn.execute(
        _SQL["live_approval"], {"tenant": tenant, "queue": queue, "warn": warn}
    )
    row = await cur.fetchone()
    assert row is not None
    approval = row["approval"]
    approved = (
        min(approval["max_concurrency"], max_approved or approval["max_concurrency"])
        if approval
        else base_limit
    )
    own = row["concurrency"]
    return {
        "limit": approved if own is None else min(own, approved),
        "approved_limit": approved,
        "concurrency": own,
        "approval": approval,
        "expiring": bool(row["expiring"]),
        "expires_at": approval["expires_at"] if approval else None,
    }


async def concurrency(
    conn: Conn,
    *,
    tenant: str,
    queue: str,
    base_limit: int = 1,
    max_approved: int | None = None,
    warn: timedelta = timedelta(0),
) -> dict[str, Any]:
    """`spend_limit`, with the queue's active leases (`queues.open_figures`)."""
    limits = await spend_limit(
        conn,
        tenant=tenant,
        queue=queue,
        base_limit=base_limit,
        max_approved=max_approved,
        warn=warn,
    )
    (figures,) = await queues.open_figures(conn, [(tenant, queue)])
    return {**limits, "active_leases": figures["active_leases"]}


async def delete_tenant(conn: Conn, *, tenant: str) -> bool:
    """The tenant and everything of it: items, ledgers, receipts, runs, watchers, keys."""
    cur = await conn.execute(_SQL["delete_tenant"], {"tenant": tenant})
    deleted = await cur.fetchone() is not None
    await conn.execute(_SQL["delete_counter_deltas"], {"tenant": tenant})
    return deleted
