"""Thin handlers: parse, authenticate, call the service, shape the answer. No SQL here."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path, Request
from starlette.responses import Response

from queue_server import errors
from queue_server.api import schemas
from queue_server.api.problems import problem_response
from queue_server.auth import Principal
from queue_server.models import NAME_PATTERN, Role
from queue_server.services.items import Answer, Idempotency, NewItem, QueueService

TenantName = Annotated[str, Path(pattern=NAME_PATTERN, description="Tenant name")]
QueueName = Annotated[str, Path(pattern=NAME_PATTERN, description="Queue name")]
ItemId = Annotated[str, Path(max_length=64, description="Item id (a UUID)")]
IdempotencyKey = Annotated[
    str,
    Header(
        alias="Idempotency-Key",
        pattern=r"^[!-~]{1,255}$",
        description="1 to 255 printable ASCII characters; a retry of the same request reuses it."
        " Missing or malformed: 400 `idempotency-key-required`.",
    ),
]

PROBLEMS: dict[int | str, dict[str, Any]] = {
    status: {"model": schemas.Problem, "content": {"application/problem+json": {}}}
    for status in (400, 401, 403, 404, 409, 413, 422, 429, 503)
}

router = APIRouter(prefix="/v1", responses=PROBLEMS)


async def service(request: Request) -> QueueService:
    svc: QueueService = request.app.state.service
    return svc


Service = Annotated[QueueService, Depends(service)]


async def principal(
    svc: Service, authorization: Annotated[str | None, Header()] = None
) -> Principal:
    return await svc.authenticate(authorization)


Caller = Annotated[Principal, Depends(principal)]


def respond(answer: Answer) -> Response:
    headers = {"Idempotent-Replayed": "true"} if answer.replayed else None
    media = "application/problem+json" if answer.problem else "application/json"
    return Response(answer.body, status_code=answer.status, media_type=media, headers=headers)


def idempotency(request: Request, key: str | None, body: schemas.Body) -> Idempotency:
    return Idempotency.of(
        key, method=request.method, path=request.url.path, body=body.model_dump(mode="json")
    )


# -- tenants and keys ----------------------------------------------------------


@router.put("/tenants/{tenant}", response_model=schemas.TenantOut, tags=["tenants"])
async def put_tenant(
    tenant: TenantName, body: schemas.TenantIn, svc: Service, caller: Caller
) -> Response:
    """Create a tenant or change its backlog cap and defaults (admin)."""
    return respond(
        await svc.put_tenant(
            caller,
            tenant,
            backlog_cap=body.backlog_cap,
            default_max_acquisitions=body.default_max_acquisitions,
            default_lease_ttl=body.default_lease_ttl,
        )
    )


@router.get("/tenants/{tenant}", response_model=schemas.TenantOut, tags=["tenants"])
async def get_tenant(tenant: TenantName, svc: Service, caller: Caller) -> Response:
    """The tenant's settings and its items by state (admin, or an operator of the tenant)."""
    return respond(await svc.get_tenant(caller, tenant))


@router.post(
    "/tenants/{tenant}/keys", status_code=201, response_model=schemas.KeyOut, tags=["tenants"]
)
async def create_key(
    tenant: TenantName, body: schemas.KeyIn, svc: Service, caller: Caller
) -> Response:
    """Create an API key for the tenant (admin). The secret is shown once."""
    return respond(await svc.create_key(caller, tenant, Role(body.role)))


@router.delete("/tenants/{tenant}/keys/{key_id}", status_code=204, tags=["tenants"])
async def revoke_key(
    tenant: TenantName,
    key_id: Annotated[str, Path(max_length=64)],
    svc: Service,
    caller: Caller,
) -> Response:
    """Revoke a key; it is refused from the next request on (admin)."""
    await svc.revoke_key(caller, tenant, key_id)
    return Response(status_code=204)


# -- work items ----------------------------------------------------------------


def _new_item(item: schemas.ItemIn) -> NewItem:
    return NewItem(
        payload=item.payload,
        priority=item.priority,
        delay=item.delay,
        max_acquisitions=item.max_acquisitions,
    )


@router.post(
    "/tenants/{tenant}/queues/{queue}/items",
    status_code=201,
    response_model=schemas.ItemOut,
    tags=["items"],
)
async def enqueue(
    request: Request,
    tenant: TenantName,
    queue: QueueName,
    body: schemas.ItemIn,
    svc: Service,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Enqueue one item. At the tenant's backlog cap: 429 `backlog-cap-reached`."""
    idem = idempotency(request, idempotency_key, body)
    answer = await svc.enqueue(
        caller, tenant, queue, [_new_item(body)], idem, instance=request.url.path, batch=False
    )
    return respond(answer)


@router.post(
    "/tenants/{tenant}/queues/{queue}/items:batch",
    status_code=201,
    response_model=schemas.BatchOut,
    tags=["items"],
)
async def enqueue_batch(
    request: Request,
    tenant: TenantName,
    queue: QueueName,
    body: schemas.BatchIn,
    svc: Service,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Enqueue 1 to 500 items, all or nothing against the backlog cap."""
    idem = idempotency(request, idempotency_key, body)
    items = [_new_item(item) for item in body.items]
    answer = await svc.enqueue(
        caller, tenant, queue, items, idem, instance=request.url.path, batch=True
    )
    return respond(answer)


@router.get("/tenants/{tenant}/items/{item_id}", response_model=schemas.ItemOut, tags=["items"])
async def get_item(tenant: TenantName, item_id: ItemId, svc: Service, caller: Caller) -> Response:
    """One item as it is now."""
    return respond(await svc.get_item(caller, tenant, item_id))


@router.get(
    "/tenants/{tenant}/items/{item_id}/ledger", response_model=schemas.LedgerOut, tags=["items"]
)
async def get_ledger(tenant: TenantName, item_id: ItemId, svc: Service, caller: Caller) -> Response:
    """Every transition of the item, in order."""
    return respond(await svc.ledger(caller, tenant, item_id))


# -- leases --------------------------------------------------------------------


@router.post(
    "/tenants/{tenant}/queues/{queue}/leases", response_model=schemas.LeasesOut, tags=["leases"]
)
async def acquire(
    request: Request,
    tenant: TenantName,
    queue: QueueName,
    body: schemas.AcquireIn,
    svc: Service,
    caller: Caller,
) -> Response:
    """Lease up to `max_items` due items; long-poll up to `wait` seconds when none is due."""
    try:
        answer = await svc.acquire(
            caller,
            tenant,
            queue,
            worker=body.worker,
            lease_ttl=body.lease_ttl,
            max_items=body.max_items,
            wait=body.wait,
            client_gone=request.is_disconnected,
        )
    except errors.ClientDisconnectedError as exc:
        # Nobody is listening; the status is for the access log and metrics only.
        return problem_response(
            errors.problem(exc, base_uri=svc.settings.problem_base_uri, instance=request.url.path)
        )
    return respond(answer)


@router.post(
    "/tenants/{tenant}/items/{item_id}/heartbeat",
    response_model=schemas.HeartbeatOut,
    tags=["leases"],
)
async def heartbeat(
    tenant: TenantName, item_id: ItemId, body: schemas.HeartbeatIn, svc: Service, caller: Caller
) -> Response:
    """Extend the lease (holder with the current fence, lease not expired)."""
    answer = await svc.heartbeat(
        caller, tenant, item_id, worker=body.worker, fence=body.fence, lease_ttl=body.lease_ttl
    )
    return respond(answer)


@router.post(
    "/tenants/{tenant}/items/{item_id}/complete", response_model=schemas.ItemOut, tags=["leases"]
)
async def complete(
    request: Request,
    tenant: TenantName,
    item_id: ItemId,
    body: schemas.CompleteIn,
    svc: Service,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Complete the item with a result (holder with the current fence, lease not expired)."""
    idem = idempotency(request, idempotency_key, body)
    answer = await svc.complete(
        caller,
        tenant,
        item_id,
        idem,
        instance=request.url.path,
        worker=body.worker,
        fence=body.fence,
        result=body.result,
    )
    return respond(answer)


@router.post(
    "/tenants/{tenant}/completions", response_model=schemas.CompletionsOut, tags=["leases"]
)
async def complete_many(
    request: Request,
    tenant: TenantName,
    body: schemas.CompletionsIn,
    svc: Service,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Complete up to 500 items of one worker at once, each guarded by its own fence.

    Answers 200 with one result per entry: the completed item, or the problem a
    single complete would have answered (stale-fence, lease-expired, ...).
    """
    idem = idempotency(request, idempotency_key, body)
    answer = await svc.complete_many(
        caller,
        tenant,
        idem,
        instance=request.url.path,
        worker=body.worker,
        completions=[entry.model_dump(mode="json") for entry in body.completions],
    )
    return respond(answer)


@router.post(
    "/tenants/{tenant}/items/{item_id}/requeue", response_model=schemas.ItemOut, tags=["leases"]
)
async def requeue(
    request: Request,
    tenant: TenantName,
    item_id: ItemId,
    body: schemas.RequeueIn,
    svc: Service,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Give the item back to the queue now; the next acquire raises its fence."""
    idem = idempotency(request, idempotency_key, body)
    answer = await svc.requeue(
        caller,
        tenant,
        item_id,
        idem,
        instance=request.url.path,
        worker=body.worker,
        fence=body.fence,
        reason=body.reason,
    )
    return respond(answer)


@router.post(
    "/tenants/{tenant}/items/{item_id}/triage", response_model=schemas.ItemOut, tags=["leases"]
)
async def triage(
    request: Request,
    tenant: TenantName,
    item_id: ItemId,
    body: schemas.TriageIn,
    svc: Service,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Record a failure and requeue or quarantine the item. Refused triage is still ledgered."""
    idem = idempotency(request, idempotency_key, body)
    answer = await svc.triage(
        caller,
        tenant,
        item_id,
        idem,
        instance=request.url.path,
        worker=body.worker,
        fence=body.fence,
        failure=body.failure.model_dump(by_alias=True),
        quarantine=body.decision == "quarantine",
    )
    return respond(answer)


# -- spend approvals -----------------------------------------------------------


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
    svc: Service,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Record an operator's approval for more than one concurrent lease on the queue."""
    idem = idempotency(request, idempotency_key, body)
    answer = await svc.approve_spend(
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
    tenant: TenantName, queue: QueueName, svc: Service, caller: Caller
) -> Response:
    """The queue's concurrency limit (1 without a live approval) and its active leases."""
    return respond(await svc.concurrency(caller, tenant, queue))
