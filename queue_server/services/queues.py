"""Queues: pause and resume, spend approvals and the concurrency limit they raise, and each
queue's figures (items by state, ages, leases, dead letters, rates)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from itertools import pairwise
from typing import Any

from queue_server import auth, errors, views
from queue_server.db import Database
from queue_server.idempotency import Answer, Effects, Idempotency
from queue_server.models import Role, is_uuid
from queue_server.policy import ReliabilityPolicy
from queue_server.services.common import WORKER_OR_OPERATOR, require_tenant
from queue_server.services.envelope import Above, refuse_above
from queue_server.store import dead_letters, reads, tenants, transitions
from queue_server.store import queues as queue_store
from queue_server.store.types import Conn, Row

STATUS_LEASES = 100  # the status shows at most this many leases, the oldest first
# The queue ledger events a queue's page shows, newest first.
QUEUE_EVENTS = 50
# A queue's approvals a listing shows, newest first.
SPEND_APPROVALS = 100


def _seconds(value: Decimal | float | None) -> float | None:
    return round(float(value), 3) if value is not None else None


def queue_figures(
    queue: str,
    *,
    open_row: Row | None,
    finished: Row | None,
    setting: Row | None,
    open_dead_letters: int,
    limits: dict[str, Any] | None,
) -> dict[str, Any]:
    """One queue as GET /queues shows it, from the bounded reads of `store.queues`."""
    o = open_row or {}
    f = finished or {}
    paused = setting is not None and setting["paused_at"] is not None
    return {
        "queue": queue,
        "paused": paused,
        "paused_at": setting["paused_at"] if paused and setting else None,
        "paused_by": setting["paused_by"] if paused and setting else None,
        "pause_reason": setting["pause_reason"] if paused and setting else None,
        "states": {
            "ready": int(o.get("ready", 0)),
            "leased": int(o.get("leased", 0)),
            "completed": int(f.get("completed", 0)),
            "quarantined": int(o.get("quarantined", 0)),
            "cancelled": int(f.get("cancelled", 0)),
        },
        # The fields of the earlier status, kept for its readers.
        "ready": int(o.get("ready", 0)),
        "due": int(o.get("due", 0)),
        "leased": int(o.get("leased", 0)),
        "quarantined": int(o.get("quarantined", 0)),
        "completed": int(f.get("completed", 0)),
        "cancelled": int(f.get("cancelled", 0)),
        "oldest_ready_age": _seconds(o.get("oldest_ready_age")),
        "active_leases": int(o.get("active_leases", 0)),
        "oldest_lease_age": _seconds(o.get("oldest_lease_age")),
        "concurrency_limit": limits["limit"] if limits else None,
        "open_dead_letters": open_dead_letters,
        "completions": {
            "last_minute": int(f.get("completions_last_minute", 0)),
            "last_hour": int(f.get("completions_last_hour", 0)),
            "total": int(f.get("completions", 0)),
        },
        "failures": {
            "last_minute": int(f.get("failures_last_minute", 0)),
            "last_hour": int(f.get("failures_last_hour", 0)),
            "total": int(f.get("failures", 0)),
        },
        "quarantines": int(f.get("quarantines", 0)),
    }


@dataclass(frozen=True, slots=True)
class Activity:
    """A queue's last hour, a count per minute, oldest first."""

    completed: list[int]
    failed: list[int]


@dataclass(frozen=True, slots=True)
class Span:
    """A chart's window: `points` steps of `step`, on the step's grid when `aligned`."""

    name: str
    step: timedelta
    points: int
    aligned: bool


# The hour: a point a minute back from now, from the samples. The day: a point each
# quarter hour on the clock's grid (the day's samples are the last of each quarter).
SPANS = {
    "1h": Span("1h", timedelta(minutes=1), 60, aligned=False),
    "24h": Span("24h", timedelta(minutes=15), 96, aligned=True),
}


@dataclass(frozen=True, slots=True)
class History:
    """One queue over a span, a value per step, oldest first (the last step ends now):
    completions and failures in each step, the mean acquire-to-complete seconds of the
    step's completions (None: none was timed), and the ready items and the oldest due
    one's age (seconds, 0 when none) at each step's end."""

    span: Span
    completed: list[int]
    failed: list[int]
    latency: list[float | None]
    ready: list[int]
    oldest_ready_age: list[float]


def _history(span: Span, rows: list[Row]) -> History:
    timed = _rises([int(r["timed_completions"]) for r in rows])
    spent = _rises([int(r["completion_ms"]) for r in rows])
    ends = rows[1:]
    return History(
        span=span,
        completed=_rises([int(r["completed"]) for r in rows]),
        failed=_rises([int(r["failed"]) for r in rows]),
        latency=[
            round(ms / n / 1000, 3) if n else None for n, ms in zip(timed, spent, strict=True)
        ],
        ready=[int(r["ready"]) for r in ends],
        oldest_ready_age=[max(0.0, round(float(r["oldest_ready_age"] or 0), 1)) for r in ends],
    )


def _rises(totals: list[int]) -> list[int]:
    """Each minute's count from the totals at its edges (a total never falls; a counter
    reset by a deleted tenant shows as nothing, never as a negative count)."""
    return [max(0, later - earlier) for earlier, later in pairwise(totals)]


class Queues:
    """Spend approvals, concurrency and status of a tenant's queues."""

    def __init__(
        self,
        db: Database,
        effects: Effects,
        policy: ReliabilityPolicy,
        *,
        approval_warning: timedelta = timedelta(days=1),
    ) -> None:
        self.db = db
        self.effects = effects
        # Without a live spend approval: the policy's local leased-work concurrency (one).
        self.base_limit = policy.leased_work.concurrency
        # The most an approval may raise it to (durable-leased-work/concurrency max-approved).
        self.max_approved = policy.leased_work.max_approved
        self.max_approved_cell = policy.leased_work.cell("max_approved")
        # An approval expiring within this is shown as expiring (the answer, the console,
        # the metrics, the worker's log).
        self.approval_warning = approval_warning

    async def _limits(self, conn: Conn, tenant: str, queue: str) -> dict[str, Any]:
        return await tenants.spend_limit(
            conn,
            tenant=tenant,
            queue=queue,
            base_limit=self.base_limit,
            max_approved=self.max_approved,
            warn=self.approval_warning,
        )

    async def set_concurrency(
        self,
        principal: auth.Principal,
        tenant: str,
        queue: str,
        idem: Idempotency,
        *,
        instance: str,
        concurrency: int | None,
        reason: str,
    ) -> Answer:
        """Set the queue's own concurrency (operator), live: the acquire leases at most the
        lesser of it and the approved limit from the next acquire on. None: the approved
        limit itself. Above the approved limit now: 422 naming `body.concurrency` (a spend
        approval raises the approved limit first)."""
        principal.require(tenant, Role.OPERATOR)

        async def operation(conn: Conn) -> Answer:
            await require_tenant(conn, tenant)
            # Under the queue's lock: no acquire counts its room while the limit changes.
            await transitions.lock_queue(conn, tenant=tenant, queue=queue)
            limits = await self._limits(conn, tenant, queue)
            approved = limits["approved_limit"]
            if concurrency is not None and concurrency > approved:
                raise errors.InvalidRequestError(
                    f"concurrency {concurrency} is above the queue's approved limit, {approved}"
                    + (
                        f" (the live spend approval's, until {limits['expires_at']})"
                        if limits["approval"]
                        else " (no live spend approval: the policy's one at a time)"
                    )
                    + ": record a spend approval first (queue-server spend approve).",
                    errors=[
                        {
                            "loc": ["body", "concurrency"],
                            "msg": f"must be at most the approved limit, {approved}",
                            "type": "above_approved_limit",
                            "limit": approved,
                        }
                    ],
                )
            await queue_store.put_concurrency(
                conn,
                tenant=tenant,
                queue=queue,
                concurrency=concurrency,
                approved=approved,
                actor=principal.actor,
                reason=reason,
            )
            return Answer.of(200, await self._concurrency(conn, tenant, queue))

        return await self.effects.run(tenant, idem, instance, operation)

    async def _concurrency(self, conn: Conn, tenant: str, queue: str) -> dict[str, Any]:
        """GET /concurrency's answer: the limit, what sets it, the active leases, and a
        warning while the approval behind the limit expires within the warning window."""
        info = await tenants.concurrency(
            conn,
            tenant=tenant,
            queue=queue,
            base_limit=self.base_limit,
            max_approved=self.max_approved,
            warn=self.approval_warning,
        )
        warning = None
        if info["expiring"] and info["approval"]:
            warning = (
                f"The spend approval raising {queue}'s limit to {info['approved_limit']}"
                f" expires at {info['expires_at']}; then the queue leases"
                f" {self.base_limit} at a time unless another approval is recorded"
                f" (queue-server spend approve {queue})."
            )
        return {"tenant": tenant, "queue": queue, **info, "warning": warning}

    async def approve_spend(
        self,
        principal: auth.Principal,
        tenant: str,
        queue: str,
        idem: Idempotency,
        *,
        instance: str,
        approved_by: str | None,
        max_concurrency: int,
        expires_at: datetime,
        reason: str,
    ) -> Answer:
        """Record the calling key's approval of up to `max_concurrency` leases at once on the
        queue until `expires_at`: at most the policy's `max-approved`, at most a year ahead."""
        principal.require(tenant, Role.OPERATOR)
        # The approver is the authenticated key; a name of its own choosing proves nothing.
        if approved_by is not None and approved_by != principal.key_id:
            raise errors.InvalidRequestError(
                f"approved_by {approved_by!r} is not the calling key ({principal.key_id}):"
                " an approval records the key that makes it; leave approved_by out.",
                errors=[
                    {
                        "loc": ["body", "approved_by"],
                        "msg": "the approval records the calling key; leave this out",
                        "type": "approver_is_the_key",
                    }
                ],
            )
        refuse_above(
            [
                Above(
                    ("body", "max_concurrency"),
                    max_concurrency,
                    self.max_approved,
                    self.max_approved_cell,
                    "approval ceiling (max-approved)",
                )
                if max_concurrency > self.max_approved
                else None
            ]
        )

        async def operation(conn: Conn) -> Answer:
            await require_tenant(conn, tenant)
            window = await tenants.spend_window(conn, expires_at=expires_at)
            if not (window["future"] and window["within_year"]):
                msg = (
                    "must be in the future"
                    if not window["future"]
                    else f"must be at most 365 days ahead (by {window['latest'].isoformat()})"
                )
                raise errors.InvalidRequestError(
                    f"expires_at {expires_at.isoformat()} {msg}: an approval lasts up to a year.",
                    errors=[
                        {
                            "loc": ["body", "expires_at"],
                            "msg": msg,
                            "type": "approval_window",
                            "limit": window["latest"].isoformat(),
                        }
                    ],
                )
            row = await tenants.add_spend_approval(
                conn,
                tenant=tenant,
                queue=queue,
                key_id=principal.key_id,
                role=principal.role.value,
                max_concurrency=max_concurrency,
                expires_at=expires_at,
                reason=reason,
            )
            return Answer.of(201, views.spend_approval(row))

        return await self.effects.run(tenant, idem, instance, operation)

    async def revoke_spend(
        self,
        principal: auth.Principal,
        tenant: str,
        queue: str,
        approval_id: str,
        idem: Idempotency,
        *,
        instance: str,
    ) -> Answer:
        """The approval no longer raises the queue's limit; revoking it again answers it as
        first revoked."""
        principal.require(tenant, Role.OPERATOR)

        async def operation(conn: Conn) -> Answer:
            await require_tenant(conn, tenant)
            row = None
            if is_uuid(approval_id):
                row = await tenants.revoke_spend_approval(
                    conn,
                    tenant=tenant,
                    queue=queue,
                    approval_id=approval_id,
                    key_id=principal.key_id,
                )
            if row is None:
                raise errors.SpendApprovalNotFoundError(approval_id=approval_id, queue=queue)
            return Answer.of(200, views.spend_approval(row))

        return await self.effects.run(tenant, idem, instance, operation)

    async def spend_approvals(self, principal: auth.Principal, tenant: str, queue: str) -> Answer:
        """The queue's approvals, live, expired and revoked, newest first."""
        principal.require(tenant, Role.OPERATOR)
        async with self.db.conn() as conn:
            await require_tenant(conn, tenant)
            rows = await tenants.list_spend_approvals(
                conn, tenant=tenant, queue=queue, limit=SPEND_APPROVALS
            )
        return Answer.of(200, {"approvals": [views.spend_approval(r) for r in rows]})

    async def concurrency(self, principal: auth.Principal, tenant: str, queue: str) -> Answer:
        principal.require(tenant, *WORKER_OR_OPERATOR)
        async with self.db.conn() as conn:
            return Answer.of(200, await self._concurrency(conn, tenant, queue))

    async def status(self, principal: auth.Principal, tenant: str) -> Answer:
        """Every queue of the tenant: items by state, oldest ready and lease ages, active
        leases (a worker key's own only), open dead letters, paused, completions and
        failures over the last minute and hour; the backlog against its cap."""
        principal.require(tenant, *WORKER_OR_OPERATOR)
        async with self.db.conn() as conn:
            row = await require_tenant(conn, tenant)
            backlog = await tenants.backlog(conn, tenant)
            queues = await self._figures(conn, tenant)
            open_dead_letters = await dead_letters.count_open(conn, tenant=tenant)
            # A worker key sees its own leases only: no other holder's name and fence.
            own = principal.key_id if principal.role is Role.WORKER else None
            leases = await reads.leases(conn, tenant=tenant, limit=STATUS_LEASES, key_id=own)
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

    async def _figures(
        self, conn: Conn, tenant: str, only: str | None = None
    ) -> list[dict[str, Any]]:
        """The figures of every queue that has counters, settings or dead letters (or of
        `only`): every queue that ever admitted an item has counters."""
        finished = {r["queue"]: r for r in await queue_store.finished_counts(conn, tenant=tenant)}
        settings = {r["queue"]: r for r in await queue_store.settings(conn, tenant=tenant)}
        letters = await queue_store.open_dead_letters(conn, tenant=tenant)
        names = sorted({*finished, *settings, *letters})
        if only is not None:
            names = [only]
        open_rows = await queue_store.open_figures(conn, [(tenant, name) for name in names])
        figures = []
        for name, open_row in zip(names, open_rows, strict=True):
            limits = await self._limits(conn, tenant, name)
            figures.append(
                queue_figures(
                    name,
                    open_row=open_row,
                    finished=finished.get(name),
                    setting=settings.get(name),
                    open_dead_letters=letters.get(name, 0),
                    limits=limits,
                )
            )
        return figures

    async def activity(self, principal: auth.Principal, tenant: str) -> dict[str, Activity]:
        """Per queue, its completions and failures in each of the last 60 minutes, oldest
        first (the last is the minute now running, counted to now)."""
        principal.require(tenant, *WORKER_OR_OPERATOR)
        async with self.db.conn() as conn:
            await require_tenant(conn, tenant)
            rows = await queue_store.minute_totals(conn, tenant=tenant)
        totals: dict[str, list[Row]] = {}
        for row in rows:
            totals.setdefault(row["queue"], []).append(row)
        return {
            queue: Activity(
                completed=_rises([int(r["completed"]) for r in edges]),
                failed=_rises([int(r["failed"]) for r in edges]),
            )
            for queue, edges in totals.items()
        }

    async def history(
        self, principal: auth.Principal, tenant: str, queue: str, span: str
    ) -> History:
        """One queue over the last hour (`1h`) or day (`24h`): rates, latency, depth, age."""
        principal.require(tenant, *WORKER_OR_OPERATOR)
        window = SPANS.get(span)
        if window is None:
            raise errors.InvalidRequestError(
                "The span is 1h (the last hour) or 24h (the last day)."
            )
        async with self.db.conn() as conn:
            await require_tenant(conn, tenant)
            rows = await queue_store.series(
                conn,
                tenant=tenant,
                queue=queue,
                step=window.step,
                points=window.points,
                aligned=window.aligned,
            )
        return _history(window, rows)

    async def get_queue(self, principal: auth.Principal, tenant: str, queue: str) -> Answer:
        """One queue's figures and its latest pause and resume events."""
        principal.require(tenant, *WORKER_OR_OPERATOR)
        async with self.db.conn() as conn:
            await require_tenant(conn, tenant)
            (figures,) = await self._figures(conn, tenant, only=queue)
            events = await queue_store.events(conn, tenant=tenant, queue=queue, limit=QUEUE_EVENTS)
        return Answer.of(200, {**figures, "events": [_queue_event(e) for e in events]})

    async def pause(
        self,
        principal: auth.Principal,
        tenant: str,
        queue: str,
        idem: Idempotency,
        *,
        instance: str,
        reason: str,
    ) -> Answer:
        """The queue hands out no lease until resumed (enqueues are still admitted).

        Pausing a paused queue changes nothing. When this answers, no acquire commits a
        lease of the queue any more: pause waits for the queue's lock, which every
        acquire holds while it leases.
        """
        principal.require(tenant, Role.OPERATOR)

        async def operation(conn: Conn) -> Answer:
            await require_tenant(conn, tenant)
            await transitions.lock_queue(conn, tenant=tenant, queue=queue)
            await queue_store.pause(
                conn, tenant=tenant, queue=queue, actor=principal.actor, reason=reason
            )
            (figures,) = await self._figures(conn, tenant, only=queue)
            return Answer.of(200, figures)

        return await self.effects.run(tenant, idem, instance, operation)

    async def resume(
        self,
        principal: auth.Principal,
        tenant: str,
        queue: str,
        idem: Idempotency,
        *,
        instance: str,
        reason: str,
    ) -> Answer:
        """The queue hands out leases again; its long-polling acquires wake up."""
        principal.require(tenant, Role.OPERATOR)

        async def operation(conn: Conn) -> Answer:
            await require_tenant(conn, tenant)
            await queue_store.resume(
                conn, tenant=tenant, queue=queue, actor=principal.actor, reason=reason
            )
            (figures,) = await self._figures(conn, tenant, only=queue)
            return Answer.of(200, figures)

        return await self.effects.run(tenant, idem, instance, operation)


def _queue_event(row: Row) -> dict[str, Any]:
    return {
        "seq": row["seq"],
        "at": row["at"],
        "kind": row["kind"],
        "actor": row["actor"],
        "actor_name": row["actor_name"],
        "data": row["data"],
    }
