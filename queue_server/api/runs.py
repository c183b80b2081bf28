"""Artifact verification runs: start by run key, checkpoint items, write the terminal marker.

Every route but abandon is idempotent by its resource identity (run key, run +
item), so it takes no `Idempotency-Key` header; a repeat answers 200 with
`Idempotent-Replayed: true`. Abandon (an operator's decision) takes one.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from pydantic import AfterValidator, Field
from starlette.responses import Response

from queue_server import wire
from queue_server.api import schemas
from queue_server.api.body import JsonRoute
from queue_server.api.deps import (
    PROBLEMS,
    Caller,
    IdempotencyKey,
    RunsService,
    TenantName,
    idempotency,
    respond,
)

router = APIRouter(prefix="/v1", responses=PROBLEMS, route_class=JsonRoute)

MAX_ITEMS = 10_000

RunId = Annotated[str, Path(max_length=64, description="Verification run id (a UUID)")]
Version = Annotated[str, Field(min_length=1, max_length=255, pattern=r"^[\x21-\x7e]+$")]


def _item_name(value: str) -> str:
    if not value.strip() or value != value.strip():
        raise ValueError("must be non-empty without surrounding whitespace")
    return value


ItemName = Annotated[schemas.Text, Field(max_length=1024), AfterValidator(_item_name)]


class RunIn(schemas.Body):
    model_config = schemas.example(
        {
            "artifact_version": "build-2026.12.01",
            "verifier_version": "v3",
            "items": ["checksum", "signature"],
        }
    )

    artifact_version: Version
    verifier_version: Version
    items: list[ItemName] = Field(min_length=1, max_length=MAX_ITEMS)


class CheckpointIn(schemas.Body):
    model_config = schemas.example({"result": {"ok": True}})

    result: schemas.Json = Field(description="The item's verification result")


@router.post(
    "/tenants/{tenant}/verification-runs",
    response_model=wire.VerificationRun,
    status_code=201,
    tags=["verification"],
    responses={
        200: {
            "model": wire.VerificationRun,
            "description": "The same pair again: that run, with its checkpoints",
        }
    },
)
async def start_run(tenant: TenantName, body: RunIn, runs: RunsService, caller: Caller) -> Response:
    """Start the run of (artifact version, verifier version), 201; the same pair again
    returns that run with its checkpoints, 200. While another run of the tenant is
    running: 409 `verification-run-busy`. A failed or abandoned run blocks nothing: the
    same pair starts a new run that carries its checkpoints over."""
    answer = await runs.start(
        caller,
        tenant,
        artifact_version=body.artifact_version,
        verifier_version=body.verifier_version,
        items=body.items,
    )
    return respond(answer)


@router.get(
    "/tenants/{tenant}/verification-runs",
    response_model=wire.VerificationRunPage,
    tags=["verification"],
)
async def list_runs(
    tenant: TenantName,
    runs: RunsService,
    caller: Caller,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=64)] = None,
) -> Response:
    """The tenant's runs, newest first, with their item and checkpoint counts."""
    return respond(await runs.list_runs(caller, tenant, limit=limit, cursor=cursor))


@router.get(
    "/tenants/{tenant}/verification-runs/{run_id}",
    response_model=wire.VerificationRun,
    tags=["verification"],
)
async def get_run(tenant: TenantName, run_id: RunId, runs: RunsService, caller: Caller) -> Response:
    """The run, its checkpoints and the items that remain: where a verifier resumes."""
    return respond(await runs.get(caller, tenant, run_id))


@router.put(
    "/tenants/{tenant}/verification-runs/{run_id}/checkpoints/{item:path}",
    response_model=wire.Checkpoint,
    tags=["verification"],
    responses={201: {"model": wire.Checkpoint, "description": "The item's first checkpoint"}},
)
async def put_checkpoint(
    tenant: TenantName,
    run_id: RunId,
    item: Annotated[str, Path(max_length=1024, description="A declared item")],
    body: CheckpointIn,
    runs: RunsService,
    caller: Caller,
) -> Response:
    """Checkpoint one declared item, 201; the same result again, 200; another, 409."""
    return respond(await runs.checkpoint(caller, tenant, run_id, item, result=body.result))


@router.put(
    "/tenants/{tenant}/verification-runs/{run_id}/complete",
    response_model=wire.VerificationRun,
    tags=["verification"],
)
async def complete_run(
    tenant: TenantName, run_id: RunId, runs: RunsService, caller: Caller
) -> Response:
    """Write the terminal run-complete marker; 409 `verification-incomplete` (naming the
    missing items) until every declared item has a checkpoint."""
    return respond(await runs.complete(caller, tenant, run_id))


class AbandonIn(schemas.Body):
    model_config = schemas.example({"reason": "the verifier's host was retired mid-run"})

    reason: Annotated[schemas.Text, Field(min_length=1, max_length=1000)]


@router.post(
    "/tenants/{tenant}/verification-runs/{run_id}:abandon",
    response_model=wire.VerificationRun,
    tags=["verification"],
)
async def abandon_run(
    request: Request,
    tenant: TenantName,
    run_id: RunId,
    body: AbandonIn,
    runs: RunsService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Abandon a running run (operator): it ends `abandoned`, with who and why recorded,
    and no longer holds the tenant's one running run. 409 `verification-run-ended` once
    it has ended."""
    answer = await runs.abandon(
        caller,
        tenant,
        run_id,
        idempotency(request, idempotency_key, body, caller),
        instance=request.url.path,
        reason=body.reason,
    )
    return respond(answer)
