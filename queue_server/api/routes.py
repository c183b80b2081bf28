"""Tenants, keys and work items: thin handlers that parse, call a service and answer.

Queue-level routes are in `api/queues.py`, dead letters in `api/dead_letters.py`,
ledger verification in `api/ledgers.py`, watchers, receipts and runs in theirs.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

import orjson
from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel
from starlette.responses import Response

from queue_server import errors, tracecontext, wire
from queue_server.api import schemas
from queue_server.api.body import JsonRoute
from queue_server.api.deps import (
    PROBLEMS,
    Caller,
    Cursor,
    IdempotencyKey,
    ItemId,
    ItemsService,
    KeysService,
    LeasesService,
    QueueName,
    TenantName,
    TenantsService,
    disconnect_probe,
    idempotency,
    respond,
)
from queue_server.api.problems import problem_response
from queue_server.idempotency import Idempotency
from queue_server.models import NAME_PATTERN, Role
from queue_server.services.items import BulkPage, ItemFilter

router = APIRouter(prefix="/v1", responses=PROBLEMS, route_class=JsonRoute)


# -- tenants and keys ----------------------------------------------------------


@router.put("/tenants/{tenant}", response_model=schemas.TenantOut, tags=["tenants"])
async def put_tenant(
    tenant: TenantName, body: schemas.TenantIn, tenants: TenantsService, caller: Caller
) -> Response:
    """Create a tenant or change its backlog cap and defaults (admin)."""
    return respond(
        await tenants.put_tenant(
            caller,
            tenant,
            backlog_cap=body.backlog_cap,
            default_max_acquisitions=body.default_max_acquisitions,
            default_lease_ttl=body.default_lease_ttl,
            retention=body.retention,
        )
    )


@router.delete("/tenants/{tenant}", status_code=204, tags=["tenants"])
async def delete_tenant(tenant: TenantName, tenants: TenantsService, caller: Caller) -> Response:
    """Delete a tenant and all of its data: items, ledgers, receipts, runs, watchers and
    keys (admin). Irreversible."""
    await tenants.delete_tenant(caller, tenant)
    return Response(status_code=204)


@router.get("/tenants", response_model=schemas.TenantPage, tags=["tenants"])
async def list_tenants(
    tenants: TenantsService,
    caller: Caller,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
) -> Response:
    """Tenants in name order (admin); pass `next_cursor` for the next page."""
    return respond(await tenants.list_tenants(caller, after=cursor, limit=limit))


@router.get("/tenants/{tenant}", response_model=schemas.TenantOut, tags=["tenants"])
async def get_tenant(tenant: TenantName, tenants: TenantsService, caller: Caller) -> Response:
    """The tenant's settings and its items by state (admin, or an operator of the tenant)."""
    return respond(await tenants.get_tenant(caller, tenant))


@router.post(
    "/tenants/{tenant}/keys", status_code=201, response_model=schemas.KeyOut, tags=["tenants"]
)
async def create_key(
    tenant: TenantName, body: schemas.KeyIn, tenants: KeysService, caller: Caller
) -> Response:
    """Create an API key for the tenant (admin). The secret is shown once."""
    return respond(await tenants.create_key(caller, tenant, Role(body.role), body.name))


@router.get("/tenants/{tenant}/keys", response_model=schemas.KeysOut, tags=["tenants"])
async def list_keys(
    tenant: TenantName,
    tenants: KeysService,
    caller: Caller,
    revoked: Annotated[bool, Query(description="Also the revoked keys.")] = False,
) -> Response:
    """The tenant's API keys, oldest first: id, role, created, revoked; never a secret (admin)."""
    return respond(await tenants.list_keys(caller, tenant, revoked=revoked))


@router.delete("/tenants/{tenant}/keys/{key_id}", status_code=204, tags=["tenants"])
async def revoke_key(
    tenant: TenantName,
    key_id: Annotated[str, Path(max_length=64)],
    tenants: KeysService,
    caller: Caller,
) -> Response:
    """Revoke a key; it is refused from the next request on (admin)."""
    await tenants.revoke_key(caller, tenant, key_id)
    return Response(status_code=204)


class AdminKeyOut(BaseModel):
    key_id: str
    tenant: None
    role: str
    secret: str


class AdminKeyInfo(BaseModel):
    key_id: str
    created_at: datetime
    revoked_at: datetime | None


class AdminKeysOut(BaseModel):
    admin_keys: list[AdminKeyInfo]


@router.post("/admin-keys", status_code=201, response_model=AdminKeyOut, tags=["tenants"])
async def create_admin_key(keys: KeysService, caller: Caller) -> Response:
    """Create another admin key (admin). The secret is shown once."""
    return respond(await keys.create_admin_key(caller))


@router.get("/admin-keys", response_model=AdminKeysOut, tags=["tenants"])
async def list_admin_keys(keys: KeysService, caller: Caller) -> Response:
    """Every admin key: id, creation and revocation times (admin). No secrets."""
    return respond(await keys.list_admin_keys(caller))


@router.delete("/admin-keys/{key_id}", status_code=204, tags=["tenants"])
async def revoke_admin_key(
    key_id: Annotated[str, Path(max_length=64)], keys: KeysService, caller: Caller
) -> Response:
    """Revoke an admin key, at once in every API process (admin; another admin's or one's
    own). The last active admin key cannot be revoked: 409 `last-admin-key`."""
    await keys.revoke_admin_key(caller, key_id)
    return Response(status_code=204)


WhoAmIOut = wire.WhoAmI


@router.get("/whoami", response_model=WhoAmIOut, tags=["operators"])
async def whoami(keys: KeysService, caller: Caller) -> Response:
    """The calling key: its id, tenant (null for admin) and role."""
    return respond(keys.whoami(caller))


# -- work items ----------------------------------------------------------------


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
    items: ItemsService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Enqueue one item. At the tenant's backlog cap: 429 `backlog-cap-reached`. A W3C
    `traceparent` (and `tracestate`) header is kept with the item and handed to each of its
    leases as `trace`; a malformed one is ignored."""
    idem = idempotency(request, idempotency_key, body, caller)
    answer = await items.enqueue(
        caller,
        tenant,
        queue,
        [body],
        idem,
        trace=tracecontext.from_headers(request.scope["headers"]),
        instance=request.url.path,
        batch=False,
    )
    return respond(answer)


async def enqueue_batch(
    request: Request,
    tenant: TenantName,
    queue: QueueName,
    body: schemas.BatchIn,
    items: ItemsService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Enqueue 1 to 500 items, all or nothing against the backlog cap. Each item keeps the
    request's W3C `traceparent`/`tracestate` headers, as a single enqueue does. With a
    `callback`, one more item that waits until every item of the batch is finished (a
    fan-in), answered as `callback`."""
    idem = Idempotency.of(
        idempotency_key,
        caller=caller.key_id,
        method=request.method,
        path=request.url.path,
        body=body.canonical(),
    )
    answer = await items.enqueue(
        caller,
        tenant,
        queue,
        body.items,
        idem,
        trace=tracecontext.from_headers(request.scope["headers"]),
        instance=request.url.path,
        batch=True,
        callback=body.callback,
    )
    return respond(answer)


router.add_api_route(
    "/tenants/{tenant}/queues/{queue}/items:batch",
    enqueue_batch,
    methods=["POST"],
    status_code=201,
    response_model=schemas.BatchOut,
    tags=["items"],
)


@router.get("/tenants/{tenant}/items", response_model=schemas.ItemPage, tags=["items"])
async def list_items(
    tenant: TenantName,
    items: ItemsService,
    caller: Caller,
    queue: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
    state: schemas.ItemStateName | None = None,
    created_after: Annotated[
        schemas.Instant | None, Query(description="Only items created after this time")
    ] = None,
    created_before: Annotated[
        schemas.Instant | None, Query(description="Only items created before this time")
    ] = None,
    payload: Annotated[
        str | None,
        Query(
            max_length=4096,
            description='A JSON document the payload must contain, e.g. `{"customer": 42}`',
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Cursor = None,
    sort: Annotated[
        schemas.ItemSort,
        Query(
            description="The order: `created` (oldest first, the default), `priority` or"
            " `attempts` (acquisition_count), each then by creation; a leading `-`"
            " descends (`-created`: newest first). A cursor continues its own order only."
        ),
    ] = "created",
) -> Response:
    """Items of the tenant in `sort`'s order (oldest first by default), filtered (operator).

    Pass `next_cursor` (with the same `sort`) for the next page. Each state and queue is
    read from an index in each order, so a page costs the same with any amount of finished
    history, and paging while items are enqueued skips and repeats none.
    """
    match = ItemFilter(
        queue=queue,
        state=state,
        created_after=created_after,
        created_before=created_before,
        payload=payload,
    )
    return respond(
        await items.list_items(caller, tenant, filter=match, limit=limit, cursor=cursor, sort=sort)
    )


@router.post("/tenants/{tenant}/items:cancel", response_model=schemas.CancelManyOut, tags=["items"])
async def cancel_items(
    request: Request,
    tenant: TenantName,
    body: schemas.CancelManyIn,
    items: ItemsService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Cancel the ready, leased and quarantined items of one page of the filter (operator).

    At most `limit` items are examined per call, in list order; call again with
    `next_cursor` (and a new Idempotency-Key) until it is null.
    """
    idem = idempotency(request, idempotency_key, body, caller)
    answer = await items.cancel_many(
        caller, tenant, idem, _bulk_page(request, body), reason=body.reason
    )
    return respond(answer)


def _bulk_page(
    request: Request, body: schemas.CancelManyIn | schemas.RetryManyIn | schemas.DeleteManyIn
) -> BulkPage:
    """A bulk route's page as the services take it: its filter (the payload as JSON text),
    limit and cursor, answered under the request's path."""
    f = body.filter
    filter = ItemFilter(
        queue=f.queue,
        state=f.state,
        created_after=f.created_after,
        created_before=f.created_before,
        payload=None if "payload" not in f.model_fields_set else orjson.dumps(f.payload).decode(),
        item_ids=None
        if isinstance(f, schemas.ItemFilterIn) or f.item_ids is None
        else tuple(str(i) for i in f.item_ids),
    )
    return BulkPage(request.url.path, filter, body.limit, body.cursor)


@router.post("/tenants/{tenant}/items:retry", response_model=schemas.RetryManyOut, tags=["items"])
async def retry_items(
    request: Request,
    tenant: TenantName,
    body: schemas.RetryManyIn,
    items: ItemsService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Make the quarantined or cancelled items of one page of the filter ready now, their
    acquisition budget whole again, as a replay does (operator): under the backlog cap.

    Items past the cap's room are left as they were and counted in `over_cap` (429 when
    none fits); `next_cursor` resumes after the last one retried. A quarantined item's
    open dead letter closes as `retried`.
    """
    idem = idempotency(request, idempotency_key, body, caller)
    answer = await items.retry_many(caller, tenant, idem, _bulk_page(request, body))
    return respond(answer)


@router.post("/tenants/{tenant}/items:delete", response_model=schemas.DeleteManyOut, tags=["items"])
async def delete_items(
    request: Request,
    tenant: TenantName,
    body: schemas.DeleteManyIn,
    items: ItemsService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Delete the completed or cancelled items of one page of the filter with their ledgers
    (operator); each queue's ledger keeps who deleted which. `next_cursor` resumes."""
    idem = idempotency(request, idempotency_key, body, caller)
    answer = await items.delete_many(caller, tenant, idem, _bulk_page(request, body))
    return respond(answer)


@router.post(
    "/tenants/{tenant}/items/{item_id}/cancel", response_model=schemas.ItemOut, tags=["items"]
)
async def cancel_item(
    request: Request,
    tenant: TenantName,
    item_id: ItemId,
    items: ItemsService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
    body: schemas.CancelIn | None = None,
) -> Response:
    """Cancel a waiting, ready, leased or quarantined item (operator), and with `descendants`
    every item that depends on it. A leased item's holder is refused with 409
    `item-cancelled` at its next heartbeat or complete."""
    body = body or schemas.CancelIn()
    idem = idempotency(request, idempotency_key, body, caller)
    answer = await items.cancel(
        caller,
        tenant,
        item_id,
        idem,
        instance=request.url.path,
        reason=body.reason,
        descendants=body.descendants,
    )
    return respond(answer)


@router.get("/tenants/{tenant}/items/{item_id}", response_model=schemas.ItemOut, tags=["items"])
async def get_item(
    tenant: TenantName, item_id: ItemId, items: ItemsService, caller: Caller
) -> Response:
    """One item as it is now."""
    return respond(await items.get_item(caller, tenant, item_id))


@router.get(
    "/tenants/{tenant}/items/{item_id}/dependencies",
    response_model=schemas.DependenciesOut,
    tags=["items"],
)
async def list_dependencies(
    tenant: TenantName,
    item_id: ItemId,
    items: ItemsService,
    caller: Caller,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: Cursor = None,
) -> Response:
    """The items this one depends on, as they are now (state, result, last failure), in id
    order: a fan-in's worker reads its batch's results and failures here."""
    return respond(await items.dependencies(caller, tenant, item_id, limit, cursor))


@router.get(
    "/tenants/{tenant}/items/{item_id}/workflow", response_model=schemas.WorkflowOut, tags=["items"]
)
async def get_workflow(
    tenant: TenantName, item_id: ItemId, items: ItemsService, caller: Caller
) -> Response:
    """The graph of dependencies the item is part of: its ancestors, its descendants and
    itself, each with its state and its dependencies among them."""
    return respond(await items.workflow(caller, tenant, item_id))


@router.get(
    "/tenants/{tenant}/items/{item_id}/ledger", response_model=schemas.LedgerOut, tags=["items"]
)
async def get_ledger(
    tenant: TenantName, item_id: ItemId, items: ItemsService, caller: Caller
) -> Response:
    """Every transition of the item, in order."""
    return respond(await items.ledger(caller, tenant, item_id))


# -- leases (services.leases); acquire, heartbeat, complete and their batch forms are on
# the lean path too (api/hot.py: the same endpoints, without FastAPI's parameter machinery)


# Served on the lean path as well (api/hot.py's HOT_ENDPOINTS), FastAPI's machinery skipped.
@router.post(
    "/tenants/{tenant}/queues/{queue}/leases", response_model=schemas.LeasesOut, tags=["leases"]
)
async def acquire(
    request: Request,
    tenant: TenantName,
    queue: QueueName,
    body: schemas.AcquireIn,
    leases: LeasesService,
    caller: Caller,
) -> Response:
    """Lease up to `max_items` due items; long-poll up to `wait` seconds when none is due."""
    try:
        answer = await leases.acquire(
            caller,
            tenant,
            queue,
            worker=body.worker,
            lease_ttl=body.lease_ttl,
            max_items=body.max_items,
            wait=body.wait,
            client_gone=disconnect_probe(request),
        )
    except errors.ClientDisconnectedError as exc:
        # Nobody is listening; the status is for the access log and metrics only.
        return problem_response(
            errors.problem(
                exc, base_uri=request.app.state.settings.problem_base_uri, instance=request.url.path
            )
        )
    return respond(answer)


# Served on the lean path as well (api/hot.py's HOT_ENDPOINTS), FastAPI's machinery skipped.
@router.post(
    "/tenants/{tenant}/items/{item_id}/heartbeat",
    response_model=schemas.HeartbeatOut,
    tags=["leases"],
)
async def heartbeat(
    tenant: TenantName,
    item_id: ItemId,
    body: schemas.HeartbeatIn,
    leases: LeasesService,
    caller: Caller,
) -> Response:
    """Extend the lease (holder with the current fence, lease not expired)."""
    answer = await leases.heartbeat(
        caller, tenant, item_id, worker=body.worker, fence=body.fence, lease_ttl=body.lease_ttl
    )
    return respond(answer)


# Served on the lean path as well (api/hot.py's HOT_ENDPOINTS), FastAPI's machinery skipped.
@router.post(
    "/tenants/{tenant}/items/{item_id}/complete", response_model=schemas.ItemOut, tags=["leases"]
)
async def complete(
    request: Request,
    tenant: TenantName,
    item_id: ItemId,
    body: schemas.CompleteIn,
    leases: LeasesService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Complete the item with a result (holder with the current fence, lease not expired)."""
    idem = idempotency(request, idempotency_key, body, caller)
    answer = await leases.complete(
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


# Served on the lean path as well (api/hot.py's HOT_ENDPOINTS), FastAPI's machinery skipped.
@router.post(
    "/tenants/{tenant}/leases:heartbeat", response_model=schemas.HeartbeatsOut, tags=["leases"]
)
async def heartbeat_many(
    request: Request,
    tenant: TenantName,
    body: schemas.HeartbeatsIn,
    leases: LeasesService,
    caller: Caller,
) -> Response:
    """Extend up to 500 leases of one worker at once, each guarded by its own fence.

    Answers 200 with one result per entry: the new `lease_expires_at`, or the
    problem a single heartbeat would have answered (stale-fence, lease-expired, ...).
    """
    answer = await leases.heartbeat_many(
        caller,
        tenant,
        worker=body.worker,
        leases=[entry.model_dump() for entry in body.leases],
        lease_ttl=body.lease_ttl,
        instance=request.url.path,
    )
    return respond(answer)


# Served on the lean path as well (api/hot.py's HOT_ENDPOINTS), FastAPI's machinery skipped.
@router.post(
    "/tenants/{tenant}/completions", response_model=schemas.CompletionsOut, tags=["leases"]
)
async def complete_many(
    request: Request,
    tenant: TenantName,
    body: schemas.CompletionsIn,
    leases: LeasesService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Complete up to 500 items of one worker at once, each guarded by its own fence.

    Answers 200 with one result per entry: the completed item, or the problem a
    single complete would have answered (stale-fence, lease-expired, ...).
    """
    idem = idempotency(request, idempotency_key, body, caller)
    answer = await leases.complete_many(
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
    leases: LeasesService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Give the item back to the queue, due now or after `delay` seconds (at most the policy's
    backoff cap); the next acquire raises its fence."""
    idem = idempotency(request, idempotency_key, body, caller)
    answer = await leases.requeue(
        caller,
        tenant,
        item_id,
        idem,
        instance=request.url.path,
        worker=body.worker,
        fence=body.fence,
        reason=body.reason,
        delay=schemas.delay_seconds(body.delay),
        failure=body.failure.model_dump(by_alias=True, exclude_none=True) if body.failure else None,
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
    leases: LeasesService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Record a failure and requeue or quarantine the item (holder with the current fence,
    lease not expired). Refused triage is still ledgered as `triage_rejected`, by any key of
    the tenant: an operator's key holds no lease, so its triage is always refused (409)."""
    idem = idempotency(request, idempotency_key, body, caller)
    answer = await leases.triage(
        caller,
        tenant,
        item_id,
        idem,
        instance=request.url.path,
        worker=body.worker,
        fence=body.fence,
        failure=body.failure.model_dump(by_alias=True, exclude_none=True),
        quarantine=body.decision == "quarantine",
        delay=schemas.delay_seconds(body.delay),
    )
    return respond(answer)
