"""Watcher routes: register, list, show, pause, resume, cancel, rotate the secret, and
list deliveries. Thin handlers over `queue_server.services.watchers`."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, Field
from starlette.responses import Response

from queue_server.api import schemas
from queue_server.api.body import JsonRoute
from queue_server.api.deps import (
    PROBLEMS,
    Caller,
    IdempotencyKey,
    TenantName,
    WatchersService,
    idempotency,
    respond,
)
from queue_server.models import NAME_PATTERN
from queue_server.services.watchers import MAX_DELIVERY_PAGE

router = APIRouter(prefix="/v1", responses=PROBLEMS, route_class=JsonRoute, tags=["watchers"])

WatcherId = Annotated[str, Path(max_length=64, description="Watcher id (a UUID)")]
Event = Literal[
    "item.enqueued",
    "item.completed",
    "item.requeued",
    "item.quarantined",
    "item.replayed",
    "item.cancelled",
]
QueueFilter = Annotated[str, Field(pattern=NAME_PATTERN)]


class WatcherIn(schemas.Body):
    model_config = schemas.example(
        {
            "url": "https://hooks.example.com/queue",
            "events": ["item.completed", "item.quarantined"],
            "queues": ["emails"],
        }
    )

    url: Annotated[str, Field(min_length=8, max_length=2048, pattern=r"^https?://")]
    events: Annotated[list[Event], Field(min_length=1, max_length=16)]
    queues: Annotated[
        list[QueueFilter] | None,
        Field(default=None, min_length=1, max_length=100, description="Default: every queue"),
    ] = None


class DeliveryCounts(BaseModel):
    pending: int
    delivered: int
    dead: int
    cancelled: int


class WatcherOut(BaseModel):
    watcher_id: str
    tenant: str
    url: str
    events: list[str]
    queues: list[str] | None
    state: Literal["active", "paused", "cancelled", "disabled"]
    disabled_reason: str | None
    backlogged: bool = Field(
        description="Past its outbox cap: new events get no delivery row until the deliverer"
        " writes them from the ledger"
    )
    backlogged_at: datetime | None = Field(description="Since when it is backlogged")
    backlog_from: datetime | None = Field(
        description="The ledger instant from which its events have no delivery row yet"
    )
    previous_secret_expires_at: datetime | None
    created_at: datetime
    updated_at: datetime
    deliveries: DeliveryCounts | None = None


class WatcherSecretOut(WatcherOut):
    secret: str | None = Field(
        description="The signing secret (whsec_...); shown in this answer only: a replay of"
        " the request's Idempotency-Key answers null (rotate the secret to get a new one)"
    )


class WatcherCancelledOut(WatcherOut):
    cancelled_deliveries: int


class WatcherList(BaseModel):
    watchers: list[WatcherOut]


class DeliveryOut(BaseModel):
    delivery_id: str
    delivery_key: str = Field(description="The `webhook-id` header of every attempt")
    watcher_id: str
    event: str
    item_id: str | None
    queue: str | None
    state: Literal["pending", "delivered", "dead", "cancelled"]
    attempts: int
    next_attempt_at: datetime | None
    last_attempt_at: datetime | None
    last_outcome: Any
    receipts: list[dict[str, Any]] = Field(description="Dispatch receipts, oldest first")
    receipts_omitted: int
    created_at: datetime
    delivered_at: datetime | None


class DeliveryPage(BaseModel):
    deliveries: list[DeliveryOut]
    next_cursor: str | None


@router.post("/tenants/{tenant}/watchers", status_code=201, response_model=WatcherSecretOut)
async def create_watcher(
    request: Request,
    tenant: TenantName,
    body: WatcherIn,
    watchers: WatchersService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Register a webhook. The URL must pass the SSRF policy; the secret is shown once."""
    idem = idempotency(request, idempotency_key, body, caller)
    answer = await watchers.create(
        caller,
        tenant,
        idem,
        instance=request.url.path,
        url=body.url,
        events=list(body.events),
        queues=body.queues,
    )
    return respond(answer)


@router.get("/tenants/{tenant}/watchers", response_model=WatcherList)
async def list_watchers(tenant: TenantName, watchers: WatchersService, caller: Caller) -> Response:
    """The tenant's watchers with their deliveries by state."""
    return respond(await watchers.list(caller, tenant))


@router.get("/tenants/{tenant}/watchers/{watcher_id}", response_model=WatcherOut)
async def show_watcher(
    tenant: TenantName, watcher_id: WatcherId, watchers: WatchersService, caller: Caller
) -> Response:
    """One watcher with its deliveries by state."""
    return respond(await watchers.get(caller, tenant, watcher_id))


async def _change(
    request: Request,
    tenant: str,
    watcher_id: str,
    watchers: WatchersService,
    caller: Caller,
    key: str | None,
    action: str,
) -> Response:
    idem = idempotency(request, key, schemas.Body(), caller)
    answer = await watchers.change(
        caller, tenant, watcher_id, idem, instance=request.url.path, action=action
    )
    return respond(answer)


@router.post("/tenants/{tenant}/watchers/{watcher_id}/pause", response_model=WatcherOut)
async def pause_watcher(
    request: Request,
    tenant: TenantName,
    watcher_id: WatcherId,
    watchers: WatchersService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Hold the watcher's deliveries; they wait, then resume in order."""
    return await _change(request, tenant, watcher_id, watchers, caller, idempotency_key, "pause")


@router.post("/tenants/{tenant}/watchers/{watcher_id}/resume", response_model=WatcherOut)
async def resume_watcher(
    request: Request,
    tenant: TenantName,
    watcher_id: WatcherId,
    watchers: WatchersService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Send the watcher's held deliveries again, oldest first."""
    return await _change(request, tenant, watcher_id, watchers, caller, idempotency_key, "resume")


@router.post("/tenants/{tenant}/watchers/{watcher_id}/cancel", response_model=WatcherCancelledOut)
async def cancel_watcher(
    request: Request,
    tenant: TenantName,
    watcher_id: WatcherId,
    watchers: WatchersService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Stop the watcher for good; its pending deliveries are cancelled."""
    return await _change(request, tenant, watcher_id, watchers, caller, idempotency_key, "cancel")


@router.post(
    "/tenants/{tenant}/watchers/{watcher_id}/rotate-secret", response_model=WatcherSecretOut
)
async def rotate_secret(
    request: Request,
    tenant: TenantName,
    watcher_id: WatcherId,
    watchers: WatchersService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """A new signing secret (shown once). Until `previous_secret_expires_at` every delivery
    is signed with both the new and the old secret."""
    idem = idempotency(request, idempotency_key, schemas.Body(), caller)
    answer = await watchers.rotate_secret(
        caller, tenant, watcher_id, idem, instance=request.url.path
    )
    return respond(answer)


@router.get("/tenants/{tenant}/watchers/{watcher_id}/deliveries", response_model=DeliveryPage)
async def list_deliveries(
    tenant: TenantName,
    watcher_id: WatcherId,
    watchers: WatchersService,
    caller: Caller,
    state: Literal["pending", "delivered", "dead", "cancelled"] | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_DELIVERY_PAGE)] = 50,
    cursor: Annotated[str | None, Query(max_length=32)] = None,
) -> Response:
    """The watcher's deliveries, oldest first: delivery key, attempts, the persisted next
    attempt time, the last outcome and the dispatch receipts."""
    answer = await watchers.deliveries(
        caller, tenant, watcher_id, state=state, limit=limit, cursor=cursor
    )
    return respond(answer)


@router.get("/tenants/{tenant}/deliveries/{delivery_id}", response_model=DeliveryOut)
async def show_delivery(
    tenant: TenantName,
    delivery_id: Annotated[str, Path(max_length=64)],
    watchers: WatchersService,
    caller: Caller,
) -> Response:
    """One delivery with its attempts, schedule, last outcome and receipts."""
    return respond(await watchers.delivery(caller, tenant, delivery_id))
