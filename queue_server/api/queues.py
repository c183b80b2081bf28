"""Queue routes: pause and resume, spend approvals and the concurrency limit they raise, and
each queue's figures."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request
from starlette.responses import Response

from queue_server.api import schemas
from queue_server.api.body import JsonRoute
from queue_server.api.deps import (
    PROBLEMS,
    Caller,
    IdempotencyKey,
    QueueName,
    QueueSettingsService,
    QueuesService,
    TenantName,
    idempotency,
    respond,
)

router = APIRouter(prefix="/v1", responses=PROBLEMS, route_class=JsonRoute)

ApprovalId = Annotated[str, Path(max_length=64, description="Spend approval id (a UUID)")]


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
    """Record the calling operator key's approval of more than one concurrent lease on the
    queue: at most the policy's max-approved, until at most a year ahead."""
    idem = idempotency(request, idempotency_key, body, caller)
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
    "/tenants/{tenant}/queues/{queue}/spend-approvals",
    response_model=schemas.SpendApprovalsOut,
    tags=["spend"],
)
async def spend_approvals(
    tenant: TenantName, queue: QueueName, queues: QueuesService, caller: Caller
) -> Response:
    """The queue's spend approvals, live, expired and revoked, newest first (operator)."""
    return respond(await queues.spend_approvals(caller, tenant, queue))


@router.delete(
    "/tenants/{tenant}/queues/{queue}/spend-approvals/{approval_id}",
    response_model=schemas.SpendApprovalOut,
    tags=["spend"],
)
async def revoke_spend(
    request: Request,
    tenant: TenantName,
    queue: QueueName,
    approval_id: ApprovalId,
    queues: QueuesService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Revoke a spend approval (operator): from the next acquire on, it raises nothing.
    Revoking it again answers the approval as first revoked."""
    idem = idempotency(request, idempotency_key, schemas.Body(), caller)
    answer = await queues.revoke_spend(
        caller, tenant, queue, approval_id, idem, instance=request.url.path
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
    """The queue's concurrency limit and what sets it (the approved limit: 1 without a live
    approval; the queue's own concurrency below it), its active leases, and a warning
    while the approval behind the limit expires within the server's warning window."""
    return respond(await queues.concurrency(caller, tenant, queue))


@router.put(
    "/tenants/{tenant}/queues/{queue}/concurrency",
    response_model=schemas.ConcurrencyOut,
    tags=["spend"],
)
async def set_concurrency(
    request: Request,
    tenant: TenantName,
    queue: QueueName,
    body: schemas.ConcurrencyIn,
    queues: QueuesService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Set the queue's concurrency live (operator), at most its approved limit: from the
    next acquire on it leases at most that many at once. Null follows the approved limit.
    Above it: 422 naming `body.concurrency`. Ledgered on the queue."""
    idem = idempotency(request, idempotency_key, body, caller)
    answer = await queues.set_concurrency(
        caller,
        tenant,
        queue,
        idem,
        instance=request.url.path,
        concurrency=body.concurrency,
        reason=body.reason,
    )
    return respond(answer)


@router.get("/tenants/{tenant}/queues", response_model=schemas.StatusOut, tags=["queues"])
async def queue_status(tenant: TenantName, queues: QueuesService, caller: Caller) -> Response:
    """Every queue: items by state, oldest ready and lease ages, active leases, open dead
    letters, paused, completions and failures over the last minute and hour."""
    return respond(await queues.status(caller, tenant))


@router.get(
    "/tenants/{tenant}/queues/{queue}", response_model=schemas.QueueDetailOut, tags=["queues"]
)
async def get_queue(
    tenant: TenantName, queue: QueueName, queues: QueuesService, caller: Caller
) -> Response:
    """One queue's figures and its latest pause and resume events (newest first)."""
    return respond(await queues.get_queue(caller, tenant, queue))


@router.post(
    "/tenants/{tenant}/queues/{queue}/pause", response_model=schemas.QueueOut, tags=["queues"]
)
async def pause(
    request: Request,
    tenant: TenantName,
    queue: QueueName,
    queues: QueuesService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
    body: schemas.PauseIn | None = None,
) -> Response:
    """Stop handing out leases of the queue (operator); enqueues are still admitted and
    long-polling acquires keep waiting. When this answers, no new lease is committed."""
    body = body or schemas.PauseIn()
    idem = idempotency(request, idempotency_key, body, caller)
    answer = await queues.pause(
        caller, tenant, queue, idem, instance=request.url.path, reason=body.reason
    )
    return respond(answer)


@router.post(
    "/tenants/{tenant}/queues/{queue}/resume", response_model=schemas.QueueOut, tags=["queues"]
)
async def resume(
    request: Request,
    tenant: TenantName,
    queue: QueueName,
    queues: QueuesService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
    body: schemas.PauseIn | None = None,
) -> Response:
    """Hand out leases of the queue again (operator); waiting acquires wake up."""
    body = body or schemas.PauseIn()
    idem = idempotency(request, idempotency_key, body, caller)
    answer = await queues.resume(
        caller, tenant, queue, idem, instance=request.url.path, reason=body.reason
    )
    return respond(answer)


@router.put(
    "/tenants/{tenant}/queues/{queue}/settings",
    response_model=schemas.QueueSettingsOut,
    tags=["queues"],
)
async def put_queue_settings(
    request: Request,
    tenant: TenantName,
    queue: QueueName,
    body: schemas.QueueSettingsIn,
    settings: QueueSettingsService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Set the queue's own lease TTL, lease deadline, acquisition budget and retry backoff
    (operator), all at once: a field left out inherits the tenant's default, else the
    policy's. Each value above the loaded policy's envelope is 422 naming the field and the
    cell. Enqueue, acquire, heartbeat, requeue and triage read them."""
    idem = idempotency(request, idempotency_key, body, caller)
    answer = await settings.put(
        caller, tenant, queue, body.given(), idem, instance=request.url.path
    )
    return respond(answer)


@router.get(
    "/tenants/{tenant}/queues/{queue}/settings",
    response_model=schemas.QueueSettingsOut,
    tags=["queues"],
)
async def get_queue_settings(
    tenant: TenantName, queue: QueueName, settings: QueueSettingsService, caller: Caller
) -> Response:
    """Each effective setting of the queue and where it comes from: `queue`, `tenant`,
    `policy` or `default` (the retry defaults: base 1 s, factor 2, no jitter)."""
    return respond(await settings.get(caller, tenant, queue))
