"""What every router shares: path parameters, the caller, the services, and the answer."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Header, Path, Query, Request
from starlette.responses import Response

from queue_server.api import schemas
from queue_server.auth import Principal
from queue_server.idempotency import Answer, Idempotency
from queue_server.models import NAME_PATTERN
from queue_server.services import (
    ConfirmationReceipts,
    DeadLetters,
    Items,
    Keys,
    Ledgers,
    Queues,
    Services,
    Tenants,
    VerificationRuns,
    Watchers,
)

TenantName = Annotated[str, Path(pattern=NAME_PATTERN, description="Tenant name")]
QueueName = Annotated[str, Path(pattern=NAME_PATTERN, description="Queue name")]
ItemId = Annotated[str, Path(max_length=64, description="Item id (a UUID)")]
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

PROBLEMS: dict[int | str, dict[str, Any]] = {
    status: {"model": schemas.Problem, "content": {"application/problem+json": {}}}
    for status in (400, 401, 403, 404, 409, 413, 422, 429, 503)
}


def _services(request: Request) -> Services:
    """The services the app built once at start (`app.state.services`)."""
    built: Services = request.app.state.services
    return built


# One dependency per service, each reading `app.state` directly (async: FastAPI runs a
# plain `def` dependency in a thread).


async def _keys(request: Request) -> Keys:
    return _services(request).keys


async def _tenants(request: Request) -> Tenants:
    return _services(request).tenants


async def _items(request: Request) -> Items:
    return _services(request).items


async def _queues(request: Request) -> Queues:
    return _services(request).queues


async def _dead_letters(request: Request) -> DeadLetters:
    return _services(request).dead_letters


async def _ledgers(request: Request) -> Ledgers:
    return _services(request).ledgers


async def _watchers(request: Request) -> Watchers:
    return _services(request).watchers


async def _receipts(request: Request) -> ConfirmationReceipts:
    return _services(request).receipts


async def _runs(request: Request) -> VerificationRuns:
    return _services(request).runs


KeysService = Annotated[Keys, Depends(_keys)]
TenantsService = Annotated[Tenants, Depends(_tenants)]
ItemsService = Annotated[Items, Depends(_items)]
QueuesService = Annotated[Queues, Depends(_queues)]
DeadLettersService = Annotated[DeadLetters, Depends(_dead_letters)]
LedgersService = Annotated[Ledgers, Depends(_ledgers)]
WatchersService = Annotated[Watchers, Depends(_watchers)]
ReceiptsService = Annotated[ConfirmationReceipts, Depends(_receipts)]
RunsService = Annotated[VerificationRuns, Depends(_runs)]


async def principal(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> Principal:
    return await _services(request).keys.authenticate(authorization)


Caller = Annotated[Principal, Depends(principal)]


def respond(answer: Answer) -> Response:
    headers = {"Idempotent-Replayed": "true"} if answer.replayed else None
    media = "application/problem+json" if answer.problem else "application/json"
    return Response(answer.body, status_code=answer.status, media_type=media, headers=headers)


def idempotency(request: Request, key: str | None, body: schemas.Body) -> Idempotency:
    return Idempotency.of(
        key, method=request.method, path=request.url.path, body=body.model_dump(mode="json")
    )
