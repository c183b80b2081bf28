"""Which database roles may enqueue for which tenant inside their own transactions
(`queue_server.enqueue`, migration 0017): granted and revoked by an operator's command."""

from __future__ import annotations

from typing import Any

import psycopg

from queue_server.store.sql import load

_SQL = load("enqueue_grants")


def grant(conn: psycopg.Connection[Any], *, role: str, tenant: str, password: str) -> bool:
    """`role` may enqueue for `tenant`; a role that did not exist is made (LOGIN, with
    `password`). Returns whether it was made. Needs a role that may create roles."""
    row = conn.execute(
        _SQL["grant_enqueue"], {"role": role, "tenant": tenant, "password": password}
    ).fetchone()
    assert row is not None
    return bool(row[0])


def revoke(conn: psycopg.Connection[Any], *, role: str, tenant: str) -> bool:
    """Take the tenant's grant back from `role`; whether it had one."""
    row = conn.execute(_SQL["revoke_enqueue"], {"role": role, "tenant": tenant}).fetchone()
    assert row is not None
    return bool(row[0])


def list_grants(conn: psycopg.Connection[Any], *, tenant: str | None) -> list[tuple[Any, ...]]:
    """(tenant, role, role_exists, granted_at) of every grant, or of one tenant's."""
    return conn.execute(_SQL["list_grants"], {"tenant": tenant}).fetchall()


def restrict_advisory_locks(conn: psycopg.Connection[Any]) -> bool:
    """Only the server's role may take advisory locks in its database (an application's
    role could otherwise hold another tenant's queue lock); whether this session could
    make it so (it needs a superuser). Idempotent."""
    try:
        with conn.transaction():
            conn.execute(_SQL["restrict_advisory_locks"])
    except psycopg.errors.InsufficientPrivilege:
        return False
    return True


def own_schema(conn: psycopg.Connection[Any], *, role: str) -> None:
    """A schema named like `role`, owned by it, for the application's own tables (kept
    when it exists and is the role's; refused when it is another's)."""
    with conn.transaction():
        conn.execute(_SQL["name_own_schema"], {"role": role})
        conn.execute(_SQL["own_schema"])
