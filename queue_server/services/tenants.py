"""Tenants: their settings (backlog cap, default budget and lease TTL, retention of finished
items) and items by state."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from queue_server import auth, errors, views
from queue_server.db import Database
from queue_server.idempotency import Answer
from queue_server.models import Role
from queue_server.policy import ReliabilityPolicy
from queue_server.services.common import require_tenant
from queue_server.services.envelope import LeaseEnvelope, refuse_above
from queue_server.store import reads, tenants

# How long finished items are kept unless the tenant says otherwise.
DEFAULT_RETENTION = timedelta(days=7)


class Tenants:
    """Create, change and show tenants."""

    def __init__(
        self, db: Database, policy: ReliabilityPolicy, *, on_keys_deleted: Callable[[], None]
    ) -> None:
        self.db = db
        self.envelope = LeaseEnvelope(policy)
        self.on_keys_deleted = on_keys_deleted

    async def delete_tenant(self, principal: auth.Principal, tenant: str) -> None:
        """The tenant and all of its data, at once (admin): items, ledgers, receipts, runs,
        watchers and keys. `queue-server policy verify --server` cleans up its scratch
        tenant with it."""
        principal.require_admin(tenant)
        async with self.db.tx() as conn:
            if not await tenants.delete_tenant(conn, tenant=tenant):
                raise errors.TenantNotFoundError(tenant=tenant)
        self.on_keys_deleted()

    async def put_tenant(
        self,
        principal: auth.Principal,
        tenant: str,
        *,
        backlog_cap: int,
        default_max_acquisitions: int | None,
        default_lease_ttl: float | None,
        retention: float = DEFAULT_RETENTION.total_seconds(),
    ) -> Answer:
        """Unset defaults are the policy's attempt cap and attempt timeout; above them: 422."""
        principal.require_admin(tenant)
        envelope = self.envelope
        refuse_above(
            [
                envelope.budget(default_max_acquisitions, "body", "default_max_acquisitions"),
                envelope.lease_ttl(default_lease_ttl, "body", "default_lease_ttl"),
                envelope.backlog(backlog_cap, "body", "backlog_cap"),
            ]
        )
        budget = default_max_acquisitions or envelope.leased.attempt_cap
        ttl = default_lease_ttl or envelope.leased.attempt_timeout
        async with self.db.tx() as conn:
            row = await tenants.put_tenant(
                conn,
                tenant=tenant,
                backlog_cap=backlog_cap,
                default_max_acquisitions=budget,
                default_lease_ttl=timedelta(seconds=ttl),
                retention=timedelta(seconds=retention),
            )
        return Answer.of(200, views.tenant(row))

    async def list_tenants(
        self, principal: auth.Principal, *, after: str | None, limit: int
    ) -> Answer:
        """Tenants in name order (admin); `next_cursor` is the last name of a full page."""
        principal.require_admin()
        async with self.db.conn() as conn:
            rows = await tenants.list_tenants(conn, after=after, limit=limit)
        next_cursor = rows[-1]["tenant_id"] if len(rows) == limit else None
        return Answer.of(
            200, {"tenants": [views.tenant(r) for r in rows], "next_cursor": next_cursor}
        )

    async def get_tenant(self, principal: auth.Principal, tenant: str) -> Answer:
        principal.require(tenant, Role.OPERATOR)
        async with self.db.conn() as conn:
            row = await require_tenant(conn, tenant)
            counts = await reads.state_counts(conn, tenant=tenant)
        return Answer.of(200, views.tenant(row, counts))
