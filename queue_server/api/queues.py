"""Queue routes: spend approvals, the concurrency limit they raise, and each queue's status."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Request
from pydantic import BaseModel
from starlette.responses import Response

from queue_server.api import schemas
from queue_server.api.deps import (
    PROBLEMS,
    Caller,
    IdempotencyKey,
    QueueName,
    QueuesService,
    TenantName,
    idempotency,
    respond,
)

router = APIRouter(prefix="/v1", responses=PROBLEMS)


class QueueStatusOut(BaseModel):
    queue: str
    ready: int
    due: int
    leased: int
    quarantined: int
    completed: int
    cancelled: int
    oldest_ready_age: float | None
    concurrency_limit: int
    active_leases: int


class LeaseStatusOut(BaseModel):
    queue: str
    item_id: str
    worker: str
    fence: int
    acquired_at: datetime | None
    lease_expires_at: datetime


class StatusOut(BaseModel):
    tenant: str
    backlog: int
    backlog_cap: int
    open_dead_letters: int
    queues: list[QueueStatusOut]
    leases: list[LeaseStatusOut]


@router.post(
    "/tenants/{tenant}/queues/{queue}/spend-approvals",
    status_code=201,
    response_model=schemas.SpendApprovalOut,
    tags=["spend"],
)
async def approve_spend(
    request: Request,
    tenant: TenantName,
    queue: QueueName,
    body: schemas.SpendApprovalIn,
    queues: QueuesService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Record an operator's approval for more than one concurrent lease on the queue."""
    idem = idempotency(request, idempotency_key, body)
    answer = await queues.approve_spend(
        caller,
        tenant,
        queue,
        idem,
        instance=request.url.path,
        approved_by=body.approved_by,
        max_concurrency=body.max_concurrency,
        expires_at=body.expires_at,
        reason=body.reason,
    )
    return respond(answer)


@router.get(
    "/tenants/{tenant}/queues/{queue}/concurrency",
    response_model=schemas.ConcurrencyOut,
    tags=["spend"],
)
async def concurrency(
    tenant: TenantName, queue: QueueName, queues: QueuesService, caller: Caller
) -> Response:
    """The queue's concurrency limit (1 without a live approval) and its active leases."""
    return respond(await queues.concurrency(caller, tenant, queue))


@router.get("/tenants/{tenant}/queues", response_model=StatusOut, tags=["operators"])
async def queue_status(tenant: TenantName, queues: QueuesService, caller: Caller) -> Response:
    """Per queue: ready, due, leased, quarantined, oldest due age; the backlog against its cap."""
    return respond(await queues.status(caller, tenant))
