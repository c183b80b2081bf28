"""What every router shares: path parameters, the caller, the services, and the answer."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import Depends, Header, Path, Query, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.responses import Response
from starlette.types import Message

from queue_server.api import schemas
from queue_server.auth import Principal
from queue_server.idempotency import Answer, Idempotency
from queue_server.models import NAME_PATTERN
from queue_server.services import (
    ConfirmationReceipts,
    DeadLetters,
    Items,
    Keys,
    Leases,
    Ledgers,
    PolicyHistory,
    Queues,
    QueueSettings,
    Schedules,
    Tenants,
    VerificationRuns,
    Watchers,
)

TenantName = Annotated[str, Path(pattern=NAME_PATTERN, description="Tenant name")]
QueueName = Annotated[str, Path(pattern=NAME_PATTERN, description="Queue name")]
ITEM_ID_MAX_LENGTH = 64
ItemId = Annotated[str, Path(max_length=ITEM_ID_MAX_LENGTH, description="Item id (a UUID)")]
Cursor = Annotated[
    str | None, Query(max_length=512, description="`next_cursor` of the previous page")
]
IdempotencyKey = Annotated[
    str,
    Header(
        alias="Idempotency-Key",
        pattern=r"^[!-~]{1,255}$",
        description="1 to 255 printable ASCII characters; a retry of the same request reuses it."
        " Missing or malformed: 400 `idempotency-key-required`.",
    ),
]

# The error responses every route may give, for the OpenAPI document, which points each at
# the `Problem` schema (queue_server/api/openapi.py). No `model` here: FastAPI would build a
# validator of `Problem` for each status of each route (about 700 of them, a tenth of the
# app's import) that nothing but the document reads.
PROBLEMS: dict[int | str, dict[str, Any]] = {
    status: {"content": {"application/problem+json": {}}}
    for status in (400, 401, 403, 404, 409, 413, 422, 429, 503)
}


def _service(name: str) -> Callable[[Request], Awaitable[Any]]:
    """The dependency on one of the services the app built once (`app.state.services`).

    Async: FastAPI runs a plain `def` dependency in a thread.
    """

    async def dependency(request: Request) -> Any:
        return getattr(request.app.state.services, name)

    return dependency


KeysService = Annotated[Keys, Depends(_service("keys"))]
TenantsService = Annotated[Tenants, Depends(_service("tenants"))]
ItemsService = Annotated[Items, Depends(_service("items"))]
LeasesService = Annotated[Leases, Depends(_service("leases"))]
QueuesService = Annotated[Queues, Depends(_service("queues"))]
QueueSettingsService = Annotated[QueueSettings, Depends(_service("queue_settings"))]
DeadLettersService = Annotated[DeadLetters, Depends(_service("dead_letters"))]
LedgersService = Annotated[Ledgers, Depends(_service("ledgers"))]
WatchersService = Annotated[Watchers, Depends(_service("watchers"))]
ReceiptsService = Annotated[ConfirmationReceipts, Depends(_service("receipts"))]
RunsService = Annotated[VerificationRuns, Depends(_service("runs"))]
SchedulesService = Annotated[Schedules, Depends(_service("schedules"))]
PoliciesService = Annotated[PolicyHistory, Depends(_service("policies"))]


# Declares the scheme in the OpenAPI document (Swagger UI's "Authorize"); the key itself is
# checked by the keys service, which answers the precise 401.
BEARER = HTTPBearer(
    scheme_name="apiKey",
    bearerFormat="qsk_<key id>_<secret>",
    description="An API key: `Authorization: Bearer qsk_...`. A key belongs to one tenant with"
    " the role worker or operator, or is an admin key (every tenant).",
    auto_error=False,
)


async def caller_of(request: Request) -> Principal:
    """The request's principal, refused (404) on a route of a tenant it cannot see.

    The tenant gate runs here, before FastAPI validates the query and the body, so that
    another tenant's route answers 404 however malformed the request is.
    """
    keys: Keys = request.app.state.services.keys
    caller = await keys.authenticate(request.headers.get("authorization"))
    tenant = request.path_params.get("tenant")
    if tenant is not None:
        caller.require_visible(tenant)
    return caller


async def principal(
    request: Request, _: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)]
) -> Principal:
    return await caller_of(request)


Caller = Annotated[Principal, Depends(principal)]


def disconnect_probe(request: Request) -> Callable[[], Awaitable[bool]]:
    """Whether the client has gone, asked as often as needed for the price of one task.

    Starlette's `Request.is_disconnected` enters and cancels a scope on each call (about
    0.1 ms); this listens once, for the request's next message, and then only looks.
    After the body the next message is `http.disconnect`: when the client leaves, or once
    the answer is sent (the listener then ends by itself).
    """
    listening: asyncio.Future[Message] | None = None

    async def gone() -> bool:
        nonlocal listening
        if listening is None:
            listening = asyncio.ensure_future(request.receive())
            await asyncio.sleep(0)  # let it read what already arrived
        if not listening.done():
            return False
        if listening.cancelled() or listening.exception() is not None:
            return True
        if listening.result()["type"] == "http.disconnect":
            return True
        listening = None  # a late body chunk: listen again
        return False

    return gone


def respond(answer: Answer) -> Response:
    headers = {"Idempotent-Replayed": "true"} if answer.replayed else None
    media = "application/problem+json" if answer.problem else "application/json"
    return Response(answer.body, status_code=answer.status, media_type=media, headers=headers)


def idempotency(
    request: Request, key: str | None, body: schemas.Body, caller: Principal
) -> Idempotency:
    """The request's key, its caller's: another key's receipts never answer it."""
    return Idempotency.of(
        key,
        caller=caller.key_id,
        method=request.method,
        path=request.url.path,
        body=body.model_dump(mode="json"),
    )
