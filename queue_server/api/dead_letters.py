"""Operator routes: dead letters (list, show, replay, discard, bulk replay), queue status,
ledger verification, and `whoami`. Thin handlers over `queue_server.services.dead_letters`."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, Field
from starlette.responses import Response

from queue_server import wire
from queue_server.api import schemas
from queue_server.api.body import JsonRoute
from queue_server.api.deps import (
    PROBLEMS,
    Caller,
    Cursor,
    DeadLettersService,
    IdempotencyKey,
    QueueName,
    TenantName,
    idempotency,
    respond,
)
from queue_server.models import NAME_PATTERN
from queue_server.services.dead_letters import MAX_BULK_REPLAY

router = APIRouter(prefix="/v1", responses=PROBLEMS, route_class=JsonRoute)

DeadLetterId = Annotated[str, Path(max_length=64, description="Dead letter id (a UUID)")]
Budget = Annotated[int | None, Field(default=None, ge=1, le=100)]


# -- wire format -----------------------------------------------------------------


DeadLetterOut = wire.DeadLetter


class DeadLetterPage(BaseModel):
    dead_letters: list[DeadLetterOut]
    next_cursor: str | None


class DeadLetterDetail(BaseModel):
    dead_letter: DeadLetterOut
    item: schemas.ItemOut | None
    events: list[schemas.EventOut]


class ReplayIn(schemas.Body):
    model_config = schemas.example({"max_acquisitions": 3})

    max_acquisitions: Budget = Field(
        default=None, description="The renewed acquisition budget; default: the item's own"
    )
    descendants: bool = Field(
        default=False,
        description="Go on with the workflow from this step: the items below it that its"
        " failure cancelled are back, each `waiting` for what it depends on.",
    )


class DiscardIn(schemas.Body):
    model_config = schemas.example({"reason": "the input cannot be fixed"})

    reason: schemas.Text = ""


class BulkReplayIn(schemas.Body):
    model_config = schemas.example({"limit": 100, "max_acquisitions": 3})

    limit: int = Field(default=MAX_BULK_REPLAY, ge=1, le=MAX_BULK_REPLAY)
    max_acquisitions: Budget = None


class BulkReplayOut(BaseModel):
    queue: str
    replayed: int
    skipped: int
    remaining: int
    item_ids: list[str]
    skipped_dead_letter_ids: list[str]


# -- dead letters ----------------------------------------------------------------


@router.get("/tenants/{tenant}/dead-letters", response_model=DeadLetterPage, tags=["dead letters"])
async def list_dead_letters(
    tenant: TenantName,
    dead_letters: DeadLettersService,
    caller: Caller,
    queue: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
    kind: Literal["item", "delivery"] | None = None,
    status: Annotated[
        Literal["open", "closed", "all"], Query(description="Default: open only")
    ] = "open",
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Cursor = None,
) -> Response:
    """Dead letters, oldest first (created_at, dead_letter_id); pass `next_cursor` for more."""
    answer = await dead_letters.list_dead_letters(
        caller, tenant, queue=queue, kind=kind, status=status, limit=limit, cursor=cursor
    )
    return respond(answer)


@router.get(
    "/tenants/{tenant}/dead-letters/{dead_letter_id}",
    response_model=DeadLetterDetail,
    tags=["dead letters"],
)
async def show_dead_letter(
    tenant: TenantName,
    dead_letter_id: DeadLetterId,
    dead_letters: DeadLettersService,
    caller: Caller,
) -> Response:
    """The dead letter with its item as it is now and the item's whole ledger."""
    return respond(await dead_letters.show_dead_letter(caller, tenant, dead_letter_id))


@router.post(
    "/tenants/{tenant}/dead-letters/{dead_letter_id}/replay",
    response_model=schemas.ItemOut,
    tags=["dead letters"],
)
async def replay(
    request: Request,
    tenant: TenantName,
    dead_letter_id: DeadLetterId,
    dead_letters: DeadLettersService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
    body: ReplayIn | None = None,
) -> Response:
    """Put the quarantined item back in `ready` with a renewed budget; the next acquire
    raises its fence. The dead letter is closed."""
    body = body or ReplayIn()
    idem = idempotency(request, idempotency_key, body, caller)
    answer = await dead_letters.replay(
        caller,
        tenant,
        dead_letter_id,
        idem,
        instance=request.url.path,
        max_acquisitions=body.max_acquisitions,
        descendants=body.descendants,
    )
    return respond(answer)


@router.post(
    "/tenants/{tenant}/dead-letters/{dead_letter_id}/discard",
    response_model=schemas.ItemOut,
    tags=["dead letters"],
)
async def discard(
    request: Request,
    tenant: TenantName,
    dead_letter_id: DeadLetterId,
    dead_letters: DeadLettersService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
    body: DiscardIn | None = None,
) -> Response:
    """Cancel the item for good; the dead letter is closed."""
    body = body or DiscardIn()
    idem = idempotency(request, idempotency_key, body, caller)
    answer = await dead_letters.discard(
        caller, tenant, dead_letter_id, idem, instance=request.url.path, reason=body.reason
    )
    return respond(answer)


@router.post(
    "/tenants/{tenant}/queues/{queue}/dead-letters:replay",
    response_model=BulkReplayOut,
    tags=["dead letters"],
)
async def replay_queue(
    request: Request,
    tenant: TenantName,
    queue: QueueName,
    dead_letters: DeadLettersService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
    body: BulkReplayIn | None = None,
) -> Response:
    """Replay up to `limit` (at most 100) of the queue's oldest open item dead letters.

    Each item is replayed atomically on its own; one that is no longer quarantined is
    skipped. Call again while `remaining` is above zero and the last call replayed any.
    """
    body = body or BulkReplayIn()
    idem = idempotency(request, idempotency_key, body, caller)
    answer = await dead_letters.replay_queue(
        caller,
        tenant,
        queue,
        idem,
        instance=request.url.path,
        limit=body.limit,
        max_acquisitions=body.max_acquisitions,
    )
    return respond(answer)
