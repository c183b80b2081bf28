"""Durable confirmation receipts, and the reliability policy they implement (GET /v1/policy,
and the versions the server has run under: GET /v1/policy/history).

The receipt routes are naturally idempotent and carry their identity in the
resource itself (idempotency key + outcome reference), so they take no
`Idempotency-Key` header: a repeat of a claim or of the same settlement
returns the retained receipt with `Idempotent-Replayed: true`.
"""

from __future__ import annotations

import copy
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request
from pydantic import Field
from starlette.responses import Response

from queue_server import views, wire
from queue_server.api import schemas
from queue_server.api.body import JsonRoute
from queue_server.api.deps import (
    PROBLEMS,
    Caller,
    IdempotencyKey,
    PoliciesService,
    ReceiptsService,
    TenantName,
    idempotency,
    respond,
)
from queue_server.policy import ReliabilityPolicy
from queue_server.policy.v2 import OPERATION_RELIABILITY_V2

router = APIRouter(prefix="/v1", responses=PROBLEMS, route_class=JsonRoute)

REF_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:@+-]{0,254}$"
KEY_PATTERN = r"^[\x21-\x7e]{1,255}$"

OutcomeRef = Annotated[
    str, Path(pattern=REF_PATTERN, description="The receipt's stable outcome reference")
]


class ClaimIn(schemas.Body):
    model_config = schemas.example(
        {"idempotency_key": "refund-4711", "outcome_ref": "refund:4711", "claim_token": "c-81f2"}
    )

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
    model_config = schemas.example({"status": "succeeded", "outcome": {"refund_id": "re_123"}})

    status: Literal["succeeded", "failed"]
    outcome: schemas.Json = Field(description="What the mutation did, or why it failed")


def _publish_example() -> dict[str, Any]:
    """The built-in as acme.v3 with 25 acquisitions: what `policy set attempts 25` sends."""
    document = copy.deepcopy(OPERATION_RELIABILITY_V2)
    document["version"] = "acme.v3"
    document["classes"]["durable-leased-work"]["retry"]["max-acquisitions"] = 25
    return {"document": document, "reason": "imports retry for a day"}


class PolicyPublishIn(schemas.Body):
    """A policy version to publish and run: its whole document, and why."""

    model_config = schemas.example(_publish_example())

    document: dict[str, Any] = Field(
        description="The whole policy document, as `policy show --json` prints it."
    )
    reason: str = Field(min_length=1, max_length=1000, description="Why: kept in the history.")


class ResolveIn(schemas.Body):
    model_config = schemas.example(
        {
            "status": "succeeded",
            "outcome": {"refund_id": "re_123"},
            "reason": "the payment provider's dashboard shows the refund",
        }
    )

    status: Literal["succeeded", "failed"] = Field(
        description="What the mutation did: a dispatched effect is never reported cancelled"
    )
    outcome: schemas.Json = Field(description="What the operator found it did, or why it failed")
    reason: Annotated[schemas.Text, Field(min_length=1, max_length=1000)]


@router.post(
    "/tenants/{tenant}/receipts",
    response_model=wire.Receipt,
    status_code=201,
    tags=["receipts"],
    responses={
        200: {"model": wire.Receipt, "description": "The same identity again: the retained receipt"}
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


@router.put("/tenants/{tenant}/receipts/{ref}", response_model=wire.Receipt, tags=["receipts"])
async def settle_receipt(
    tenant: TenantName, ref: OutcomeRef, body: SettleIn, receipts: ReceiptsService, caller: Caller
) -> Response:
    """Settle a pending receipt once as `succeeded` or `failed` with its outcome; the same
    settlement again replays, a different one is 409 `receipt-conflict`."""
    answer = await receipts.settle(caller, tenant, ref, status=body.status, outcome=body.outcome)
    return respond(answer)


@router.get("/tenants/{tenant}/receipts", response_model=wire.ReceiptPage, tags=["receipts"])
async def list_receipts(
    tenant: TenantName,
    receipts: ReceiptsService,
    caller: Caller,
    state: Annotated[Literal["pending"], Query(description="Only pending receipts are listed")],
    older_than: Annotated[
        float | None,
        Query(
            ge=0,
            le=10 * 365 * 86400,
            description="Seconds since the claim; default: the"
            " confirmed-mutation deadline (stale receipts)",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
) -> Response:
    """Pending receipts claimed at least `older_than` seconds ago, oldest first (operator):
    those past the class deadline are `stale`, their claimant gone, and an operator may
    settle them (`:resolve`)."""
    return respond(
        await receipts.list_pending(
            caller, tenant, older_than=older_than, limit=limit, cursor=cursor
        )
    )


@router.post(
    "/tenants/{tenant}/receipts/{ref}:resolve", response_model=wire.Receipt, tags=["receipts"]
)
async def resolve_receipt(
    request: Request,
    tenant: TenantName,
    ref: OutcomeRef,
    body: ResolveIn,
    receipts: ReceiptsService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Settle a stale pending receipt as an operator (with what happened and why; both are
    recorded). 409 `receipt-not-stale` before the confirmed-mutation deadline, and
    `receipt-conflict` once settled."""
    answer = await receipts.resolve(
        caller,
        tenant,
        ref,
        idempotency(request, idempotency_key, body, caller),
        instance=request.url.path,
        status=body.status,
        outcome=body.outcome,
        reason=body.reason,
    )
    return respond(answer)


@router.get("/tenants/{tenant}/receipts/{ref}", response_model=wire.Receipt, tags=["receipts"])
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


@router.get("/policy/history", response_model=wire.PolicyHistory, tags=["policy"])
async def policy_history(policies: PoliciesService, caller: Caller) -> Response:
    """Every policy version the server has started under (admin), newest last start first:
    its sha256, source, first and last start, how many starts, and whether it is the one
    loaded now (`current`)."""
    return respond(await policies.history(caller))


PolicyVersionName = Annotated[
    str,
    Path(
        min_length=1,
        max_length=100,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,99}$",
        description="The version the document names itself.",
    ),
]


@router.put(
    "/policy/versions/{version}",
    response_model=wire.PolicyVersion,
    status_code=201,
    tags=["policy"],
)
async def publish_policy(
    version: PolicyVersionName,
    body: PolicyPublishIn,
    policies: PoliciesService,
    caller: Caller,
    idempotency_key: IdempotencyKey,
) -> Response:
    """Publish a policy version and run it (admin): the document is checked as `policy
    verify` checks a file, kept with its sha256, the publishing key and the reason, and
    activated; this server runs it at once, every other one started without --policy within
    its poll interval (QUEUE_SERVER_POLICY_POLL_INTERVAL, 5 s), and after a restart. 201 for
    a new version, 200 for the same document again (activated again: the idempotency key is
    only required, the content decides). 409 `policy-version-conflict` when the version is
    kept with other content; 409 `policy-pinned` when this server runs under a policy file;
    422 naming each cell that breaks a rule, or a class other than durable-leased-work
    changed (the others are loaded at each process's start)."""
    del idempotency_key  # publishing is idempotent by content: a version names one document
    return respond(await policies.publish(caller, version, body.document, body.reason))
