"""Queues: spend approvals and the concurrency limit they raise, and each queue's status."""

from __future__ import annotations

from datetime import datetime

from queue_server import auth, views
from queue_server.db import Database
from queue_server.idempotency import Answer, Effects, Idempotency
from queue_server.models import Role
from queue_server.policy import ReliabilityPolicy
from queue_server.services.common import WORKER_OR_OPERATOR, require_tenant
from queue_server.store import dead_letters, reads, tenants
from queue_server.store.types import Conn, Row

STATUS_LEASES = 100  # the status shows at most this many leases, the oldest first


class Queues:
    """Spend approvals, concurrency and status of a tenant's queues."""

    def __init__(self, db: Database, effects: Effects, policy: ReliabilityPolicy) -> None:
        self.db = db
        self.effects = effects
        # Without a live spend approval: the policy's local leased-work concurrency (one).
        self.base_limit = policy.leased_work.concurrency

    async def approve_spend(
        self,
        principal: auth.Principal,
        tenant: str,
        queue: str,
        idem: Idempotency,
        *,
        instance: str,
        approved_by: str,
        max_concurrency: int,
        expires_at: datetime,
        reason: str,
    ) -> Answer:
        principal.require(tenant, Role.OPERATOR)

        async def operation(conn: Conn) -> Answer:
            await require_tenant(conn, tenant)
            row = await tenants.add_spend_approval(
                conn,
                tenant=tenant,
                queue=queue,
                approved_by=approved_by,
                max_concurrency=max_concurrency,
                expires_at=expires_at,
                reason=reason,
            )
            return Answer.of(201, views.spend_approval(row))

        return await self.effects.run(tenant, idem, instance, operation)

    async def concurrency(self, principal: auth.Principal, tenant: str, queue: str) -> Answer:
        principal.require(tenant, *WORKER_OR_OPERATOR)
        async with self.db.conn() as conn:
            info = await tenants.concurrency(
                conn, tenant=tenant, queue=queue, base_limit=self.base_limit
            )
        return Answer.of(200, {"tenant": tenant, "queue": queue, **info})

    async def status(self, principal: auth.Principal, tenant: str) -> Answer:
        """Per queue: ready, due, leased, quarantined, oldest due age, concurrency limit."""
        principal.require(tenant, *WORKER_OR_OPERATOR)
        async with self.db.conn() as conn:
            row = await require_tenant(conn, tenant)
            backlog = await tenants.backlog(conn, tenant)
            queues = []
            for q in await reads.queue_status(conn, tenant=tenant):
                limits = await tenants.concurrency(
                    conn, tenant=tenant, queue=q["queue"], base_limit=self.base_limit
                )
                age = q["oldest_ready_age"]
                queues.append(
                    {
                        "queue": q["queue"],
                        "ready": q["ready"],
                        "due": q["due"],
                        "leased": q["leased"],
                        "quarantined": q["quarantined"],
                        "completed": q["completed"],
                        "cancelled": q["cancelled"],
                        "oldest_ready_age": float(age) if age is not None else None,
                        "concurrency_limit": limits["limit"],
                        "active_leases": limits["active_leases"],
                    }
                )
            open_dead_letters = await dead_letters.count_open(conn, tenant=tenant)
            leases = await reads.leases(conn, tenant=tenant, limit=STATUS_LEASES)
        return Answer.of(
            200,
            {
                "tenant": tenant,
                "backlog": backlog,
                "backlog_cap": row["backlog_cap"],
                "open_dead_letters": open_dead_letters,
                "queues": queues,
                "leases": [
                    {
                        "queue": r["queue"],
                        "item_id": str(r["item_id"]),
                        "worker": r["lease_holder"],
                        "fence": r["fence"],
                        "acquired_at": r["acquired_at"],
                        "lease_expires_at": r["lease_expires_at"],
                    }
                    for r in leases
                ],
            },
        )

    async def state_counts(self) -> list[Row]:
        """Items by tenant and state, over every tenant (for the metrics scrape)."""
        async with self.db.conn() as conn:
            return await reads.all_state_counts(conn)
