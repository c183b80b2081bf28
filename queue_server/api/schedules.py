"""Schedule routes (operator): put, list, show, delete, pause, resume, trigger. Thin handlers
over `queue_server.services.schedules`."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, Field, model_validator
from starlette.responses import Response

from queue_server import tracecontext
from queue_server.api import schemas
from queue_server.api.body import JsonRoute
from queue_server.api.deps import (
    PROBLEMS,
    Caller,
    IdempotencyKey,
    SchedulesService,
    TenantName,
    idempotency,
    respond,
)
from queue_server.models import NAME_PATTERN
from queue_server.services.schedules import MAX_PAGE, ScheduleSpec
from queue_server.services.ticks import CatchUp

router = APIRouter(prefix="/v1", responses=PROBLEMS, route_class=JsonRoute, tags=["schedules"])

ScheduleName = Annotated[str, Path(pattern=NAME_PATTERN, description="Schedule name")]


class ScheduleIn(schemas.Body):
    model_config = schemas.example(
        {
            "queue": "reports",
            "payload": {"report": "daily"},
            "cron": "0 6 * * *",
            "timezone": "Europe/Berlin",
        }
    )

    queue: schemas.Name
    payload: schemas.Json = None
    priority: int = Field(default=0, ge=-1_000_000, le=1_000_000, strict=True)
    max_acquisitions: int | None = Field(default=None, ge=1, le=100, strict=True)
    cron: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="Five-field cron expression (or @hourly, @daily...), in `timezone`",
        examples=["*/5 * * * *"],
    )
    every: int | None = Field(
        default=None,
        ge=1,
        le=366 * 24 * 3600,
        strict=True,
        description="Seconds between ticks; ticks fall on multiples of it in Unix time",
    )
    timezone: str = Field(default="UTC", min_length=1, max_length=64, examples=["Europe/Berlin"])
    catch_up: Literal["skip", "latest", "all-bounded"] = Field(
        default="skip",
        description="Ticks missed while no server ran: dropped, only the latest, or each"
        " (up to catch_up_limit)",
    )
    catch_up_limit: int = Field(default=100, ge=1, le=1000, strict=True)
    paused: bool = False

    @model_validator(mode="after")
    def _cron_or_every(self) -> ScheduleIn:
        if (self.cron is None) == (self.every is None):
            raise ValueError("give exactly one of `cron` and `every`")
        return self


class FireOut(BaseModel):
    tick_at: datetime
    kind: Literal["tick", "trigger"]
    outcome: Literal["enqueued", "refused", "dropped"]
    item_id: str | None
    attempts: int
    at: datetime
    detail: dict[str, Any] | None


class ScheduleOut(BaseModel):
    schedule: str
    tenant: str
    schedule_id: str
    queue: str
    payload: Any
    priority: int
    max_acquisitions: int | None
    cron: str | None
    every: int | None
    timezone: str
    catch_up: str
    catch_up_limit: int
    paused: bool
    next_fires: list[datetime] = Field(description="The next few tick instants (none while paused)")
    fires: int = Field(description="Items enqueued by ticks")
    refusals: int = Field(description="Ticks refused at the backlog cap (each attempt)")
    skipped: int = Field(description="Due ticks dropped by the catch-up rule")
    created_at: datetime
    updated_at: datetime


class ScheduleDetailOut(ScheduleOut):
    recent_fires: list[FireOut] = Field(description="The newest fires, newest first")


class SchedulePage(BaseModel):
    schedules: list[ScheduleOut]
    next_cursor: str | None


class TriggerOut(BaseModel):
    schedule: str
    tick_at: datetime
    item: schemas.ItemOut


@router.put(
    "/tenants/{tenant}/schedules/{name}",
    response_model=ScheduleOut,
    responses={201: {"model": ScheduleOut, "description": "Created"}},
)
async def put_schedule(
    request: Request,
    tenant: TenantName,
    name: ScheduleName,
    body: ScheduleIn,
    schedules: SchedulesService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Create (201) or replace (200) a schedule. A new timing (or unpausing) starts at the
    first tick after now; other changes keep the ticks already due."""
    idem = idempotency(request, idempotency_key, body, caller)
    spec = ScheduleSpec(
        queue=body.queue,
        payload=body.payload,
        priority=body.priority,
        max_acquisitions=body.max_acquisitions,
        cron=body.cron,
        every=body.every,
        timezone=body.timezone,
        catch_up=CatchUp(body.catch_up),
        catch_up_limit=body.catch_up_limit,
        paused=body.paused,
        trace=tracecontext.from_headers(request.scope["headers"]),
    )
    return respond(await schedules.put(caller, tenant, name, spec, idem, instance=request.url.path))


@router.get("/tenants/{tenant}/schedules", response_model=SchedulePage)
async def list_schedules(
    tenant: TenantName,
    schedules: SchedulesService,
    caller: Caller,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    cursor: Annotated[str | None, Query(max_length=64)] = None,
) -> Response:
    """The tenant's schedules by name, each with its next fire times."""
    return respond(await schedules.list(caller, tenant, limit=limit, cursor=cursor))


@router.get("/tenants/{tenant}/schedules/{name}", response_model=ScheduleDetailOut)
async def show_schedule(
    tenant: TenantName, name: ScheduleName, schedules: SchedulesService, caller: Caller
) -> Response:
    """One schedule: its next fire times, counters and newest fires (refusals included)."""
    return respond(await schedules.get(caller, tenant, name))


@router.delete("/tenants/{tenant}/schedules/{name}", status_code=204, response_class=Response)
async def delete_schedule(
    request: Request,
    tenant: TenantName,
    name: ScheduleName,
    schedules: SchedulesService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Delete the schedule; the items it enqueued stay."""
    idem = idempotency(request, idempotency_key, schemas.Body(), caller)
    return respond(await schedules.delete(caller, tenant, name, idem, instance=request.url.path))


async def _change(
    request: Request,
    tenant: str,
    name: str,
    schedules: SchedulesService,
    caller: Caller,
    key: str | None,
    pause: bool,
) -> Response:
    idem = idempotency(request, key, schemas.Body(), caller)
    answer = await schedules.change(
        caller, tenant, name, idem, instance=request.url.path, pause=pause
    )
    return respond(answer)


@router.post("/tenants/{tenant}/schedules/{name}/pause", response_model=ScheduleOut)
async def pause_schedule(
    request: Request,
    tenant: TenantName,
    name: ScheduleName,
    schedules: SchedulesService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Stop firing until resumed."""
    return await _change(request, tenant, name, schedules, caller, idempotency_key, True)


@router.post("/tenants/{tenant}/schedules/{name}/resume", response_model=ScheduleOut)
async def resume_schedule(
    request: Request,
    tenant: TenantName,
    name: ScheduleName,
    schedules: SchedulesService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Fire again from the first tick after now (the paused ticks are not caught up)."""
    return await _change(request, tenant, name, schedules, caller, idempotency_key, False)


@router.post(
    "/tenants/{tenant}/schedules/{name}/trigger", status_code=201, response_model=TriggerOut
)
async def trigger_schedule(
    request: Request,
    tenant: TenantName,
    name: ScheduleName,
    schedules: SchedulesService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Enqueue one run now (also while paused), under the backlog cap like any enqueue. The
    item carries this request's W3C `traceparent`, else the one the schedule was put with."""
    idem = idempotency(request, idempotency_key, schemas.Body(), caller)
    trace = tracecontext.from_headers(request.scope["headers"])
    return respond(
        await schedules.trigger(caller, tenant, name, idem, instance=request.url.path, trace=trace)
    )
