"""The lean path of the lease routes: the same endpoints, without FastAPI's per-request
parameter machinery.

A worker's acquire, heartbeat and complete are most of what the server answers. For
them FastAPI's routing, dependency solving and validation cost more CPU than the
endpoint's own work (profiled: about a fifth of each request). This middleware
recognises a well-formed request to one of those routes, authenticates it, validates
its body with the route's own model and calls the route's own endpoint function with
what FastAPI would have passed; nothing of the endpoint is written twice.

Anything not plainly well-formed falls through, untouched, to FastAPI: a path
parameter outside its pattern, a content type other than JSON, a body that is not JSON
or not valid for its model, a missing, unknown or revoked key. FastAPI then answers
exactly as it always does (its 401 and 422), so the lean path only answers what the
full one would have. The endpoint itself refuses another tenant's route (404) and a
missing or malformed `Idempotency-Key` (400) on both paths; a domain error it raises is
rendered by the same handler FastAPI uses. `tests/api/test_lean_path.py` holds the two
paths to the same answers.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from queue_server import errors
from queue_server.api import problems, routes, schemas
from queue_server.api.body import loads
from queue_server.api.deps import ITEM_ID_MAX_LENGTH
from queue_server.api.middleware import Replay
from queue_server.models import NAME_PATTERN

_NAME = re.compile(NAME_PATTERN)
_PREFIX = "/v1/tenants/"


@dataclass(frozen=True, slots=True)
class _Hot:
    route: APIRoute
    endpoint: Callable[..., Awaitable[Any]]
    body: type[BaseModel]
    keyed: bool  # the route takes an Idempotency-Key
    wants_request: bool


#: The routes on the lean path: each endpoint with its body model.
HOT_ENDPOINTS: tuple[tuple[Callable[..., Awaitable[Any]], type[BaseModel], bool], ...] = (
    (routes.acquire, schemas.AcquireIn, False),
    (routes.heartbeat, schemas.HeartbeatIn, False),
    (routes.complete, schemas.CompleteIn, True),
    (routes.heartbeat_many, schemas.HeartbeatsIn, False),
    (routes.complete_many, schemas.CompletionsIn, True),
)


def _path_params_ok(params: dict[str, str]) -> bool:
    """The path parameters FastAPI would accept (TenantName, QueueName, ItemId)."""
    for name, value in params.items():
        if name == "item_id":
            if len(value) > ITEM_ID_MAX_LENGTH:
                return False
        elif _NAME.fullmatch(value) is None:
            return False
    return True


class LeasePath:
    """ASGI middleware: well-formed lease requests go straight to their endpoint."""

    def __init__(self, app: ASGIApp, *, routes_of: list[Any]) -> None:
        self.app = app
        by_endpoint = {route.endpoint: route for route in routes_of if isinstance(route, APIRoute)}
        self._hot = [
            _Hot(
                by_endpoint[endpoint],
                endpoint,
                body,
                keyed,
                "request" in inspect.signature(endpoint).parameters,
            )
            for endpoint, body, keyed in HOT_ENDPOINTS
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "POST"
            or not scope["path"].startswith(_PREFIX)
        ):
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        for hot in self._hot:
            match = hot.route.path_regex.match(path)
            if match is not None:
                break
        else:
            await self.app(scope, receive, send)
            return
        message = await receive()
        if not await self._serve(hot, match.groupdict(), message, scope, receive, send):
            await self.app(scope, Replay(message, receive), send)

    async def _serve(
        self,
        hot: _Hot,
        params: dict[str, str],
        message: Message,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> bool:
        """Answer the request; False (nothing sent) when FastAPI should answer it instead."""
        if message["type"] != "http.request" or message.get("more_body", False):
            return False
        if not _path_params_ok(params):
            return False
        headers = _headers(scope)
        if headers is None:
            return False
        authorization, content_type, key = headers
        if content_type is not None and content_type.split(";", 1)[0].strip() != (
            "application/json"
        ):
            return False
        try:
            body = hot.body.model_validate(loads(message.get("body", b""), content_type))
        except (ValueError, RecursionError, ValidationError):
            return False
        app = scope["app"]
        services = app.state.services
        try:
            caller = await services.keys.authenticate(authorization)
        except errors.QueueServerError:
            return False
        scope["route"] = hot.route
        scope["path_params"] = params
        request = Request(scope, receive, send)
        kwargs: dict[str, Any] = {
            **params,
            "body": body,
            "leases": services.leases,
            "caller": caller,
        }
        if hot.wants_request:
            kwargs["request"] = request
        if hot.keyed:
            kwargs["idempotency_key"] = key
        try:
            response = await hot.endpoint(**kwargs)
        except errors.QueueServerError as exc:
            response = problems.domain_error_response(request, exc)
        await response(scope, receive, send)
        return True


def _headers(scope: Scope) -> tuple[str | None, str | None, str | None] | None:
    """Authorization, Content-Type and Idempotency-Key, each at most once (else None)."""
    authorization = content_type = key = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            if authorization is not None:
                return None
            authorization = value.decode("latin-1")
        elif name == b"content-type":
            if content_type is not None:
                return None
            content_type = value.decode("latin-1").lower()
        elif name == b"idempotency-key":
            if key is not None:
                return None
            key = value.decode("latin-1")
    return authorization, content_type, key
