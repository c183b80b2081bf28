"""Ledger verification: fold pages of item ledgers and compare each with its item row."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel
from starlette.responses import Response

from queue_server.api.body import JsonRoute
from queue_server.api.deps import PROBLEMS, Caller, Cursor, LedgersService, TenantName, respond
from queue_server.services.ledgers import MAX_VERIFY_PAGE

router = APIRouter(prefix="/v1", responses=PROBLEMS, route_class=JsonRoute)


class MismatchOut(BaseModel):
    tenant: str
    item_id: str
    problems: list[str]


class VerificationOut(BaseModel):
    checked: int
    mismatches: list[MismatchOut]
    next_cursor: str | None


VerifyLimit = Annotated[int, Query(ge=1, le=MAX_VERIFY_PAGE)]


@router.get(
    "/tenants/{tenant}/ledger-verification", response_model=VerificationOut, tags=["operators"]
)
async def verify_tenant_ledgers(
    tenant: TenantName,
    ledgers: LedgersService,
    caller: Caller,
    limit: VerifyLimit = 500,
    cursor: Cursor = None,
) -> Response:
    """Fold one page of the tenant's item ledgers and compare each with its item row."""
    answer = await ledgers.verify(caller, tenant, limit=limit, cursor=cursor)
    return respond(answer)


@router.get("/ledger-verification", response_model=VerificationOut, tags=["operators"])
async def verify_all_ledgers(
    ledgers: LedgersService, caller: Caller, limit: VerifyLimit = 500, cursor: Cursor = None
) -> Response:
    """Fold one page of every tenant's item ledgers (admin)."""
    answer = await ledgers.verify(caller, None, limit=limit, cursor=cursor)
    return respond(answer)
