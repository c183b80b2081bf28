"""Durable confirmation receipts, and the reliability policy they implement (GET /v1/policy).

The receipt routes are naturally idempotent and carry their identity in the
resource itself (idempotency key + outcome reference), so they take no
`Idempotency-Key` header: a repeat of a claim or of the same settlement
returns the retained receipt with `Idempotent-Replayed: true`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, Field
from starlette.responses import Response

from queue_server import views
from queue_server.api import schemas
from queue_server.api.deps import PROBLEMS, Caller, ReceiptsService, TenantName, respond
from queue_server.policy import ReliabilityPolicy

router = APIRouter(prefix="/v1", responses=PROBLEMS)

REF_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,254}$"
KEY_PATTERN = r"^[\x21-\x7e]{1,255}$"

OutcomeRef = Annotated[
    str, Path(pattern=REF_PATTERN, description="The receipt's stable outcome reference")
]


class ClaimIn(schemas.Body):
    idempotency_key: str = Field(
        pattern=KEY_PATTERN, description="1 to 255 printable ASCII characters"
    )
    outcome_ref: str = Field(
        pattern=REF_PATTERN, description="Stable reference the outcome is found by"
    )
    claim_token: str | None = Field(
        default=None,
        pattern=KEY_PATTERN,
        description="The claimant's own token: resending it with a lost claim is granted again",
    )


class SettleIn(schemas.Body):
    status: Literal["succeeded", "failed"]
    outcome: schemas.Json = Field(description="What the mutation did, or why it failed")


class ReceiptOut(BaseModel):
    outcome_ref: str
    idempotency_key: str
    status: Literal["pending", "succeeded", "failed"]
    outcome: Any
    created_at: datetime
    settled_at: datetime | None


@router.post(
    "/tenants/{tenant}/receipts",
    response_model=ReceiptOut,
    status_code=201,
    tags=["receipts"],
    responses={
        200: {"model": ReceiptOut, "description": "The same identity again: the retained receipt"}
    },
)
async def claim_receipt(
    tenant: TenantName, body: ClaimIn, receipts: ReceiptsService, caller: Caller
) -> Response:
    """Claim the one-shot receipt of a confirmed mutation: `pending`, 201. The same
    (idempotency key, outcome reference) again returns the retained receipt, 200; a
    reference or key already bound to the other half of another identity is 409."""
    answer = await receipts.claim(
        caller,
        tenant,
        idempotency_key=body.idempotency_key,
        outcome_ref=body.outcome_ref,
        claim_token=body.claim_token,
    )
    return respond(answer)


@router.put("/tenants/{tenant}/receipts/{ref}", response_model=ReceiptOut, tags=["receipts"])
async def settle_receipt(
    tenant: TenantName, ref: OutcomeRef, body: SettleIn, receipts: ReceiptsService, caller: Caller
) -> Response:
    """Settle a pending receipt once as `succeeded` or `failed` with its outcome; the same
    settlement again replays, a different one is 409 `receipt-conflict`."""
    answer = await receipts.settle(caller, tenant, ref, status=body.status, outcome=body.outcome)
    return respond(answer)


@router.get("/tenants/{tenant}/receipts/{ref}", response_model=ReceiptOut, tags=["receipts"])
async def get_receipt(
    tenant: TenantName, ref: OutcomeRef, receipts: ReceiptsService, caller: Caller
) -> Response:
    """The receipt as it is now: pending, or settled with its outcome."""
    return respond(await receipts.get(caller, tenant, ref))


@router.get("/policy", tags=["policy"])
async def get_policy(request: Request) -> Response:
    """The loaded reliability policy: six operation classes by ten dimensions, and under
    `loaded` its version, digest and source. Needs no key: it is the contract every
    client obeys, and holds no tenant data."""
    policy: ReliabilityPolicy = request.app.state.policy
    document = {**policy.as_document(), "loaded": policy.loaded()}
    return Response(views.dumps(document), media_type="application/json")
