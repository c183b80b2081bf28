"""Every error answer is an RFC 9457 problem (`application/problem+json`) with a stable `code`."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from opentelemetry import trace
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.routing import Match

from queue_server import errors, tracecontext, views
from queue_server.api.deps import caller_of

log = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"


def problem_response(body: dict[str, Any], headers: dict[str, str] | None = None) -> Response:
    return Response(
        views.dumps(body), status_code=body["status"], media_type=PROBLEM_JSON, headers=headers
    )


def _base(request: Request) -> str:
    base: str = request.app.state.settings.problem_base_uri
    return base


def _flatten(routes: Iterable[Any]) -> Iterator[Any]:
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            yield from _flatten(included.routes)
        else:
            yield route


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this path (Starlette names only the first route's)."""
    scope = {**request.scope, "method": "__none__"}
    methods: set[str] = set()
    for route in _flatten(request.app.routes):
        match, _ = route.matches(scope)
        if match is not Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


def domain_error_response(request: Request, exc: errors.QueueServerError) -> Response:
    """The answer to a domain error: its problem, with the headers its status calls for."""
    body = errors.problem(exc, base_uri=_base(request), instance=request.url.path)
    headers = {"Retry-After": "1"} if exc.status in (429, 503) else None
    if exc.status == 401:  # RFC 9110: a 401 names the scheme that would authenticate
        headers = {"WWW-Authenticate": 'Bearer realm="queue-server"'}
    return problem_response(body, headers)


def _trace_note(request: Request) -> str:
    """` trace_id=...` of the request: its span's when tracing is on, else the trace its
    caller's `traceparent` names; empty when neither exists."""
    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        return f" trace_id={trace.format_trace_id(context.trace_id)}"
    sent = tracecontext.from_headers(request.scope["headers"])
    return f" trace_id={sent.trace_id}" if sent is not None else ""


def _message(error: Any) -> str:
    """A validation error's message; a body that is not JSON also says why (api/body.py)."""
    message = str(error.get("msg", ""))
    if error.get("type") == "json_invalid" and "error" in error.get("ctx", {}):
        message = f"{message}: {error['ctx']['error']}"
    return message


def install(app: FastAPI) -> None:
    """One handler per family; Starlette finds handlers along the exception's MRO."""

    @app.exception_handler(errors.QueueServerError)
    async def domain_error(request: Request, exc: errors.QueueServerError) -> Response:
        return domain_error_response(request, exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        if "tenant" in request.path_params:
            # A body that is not JSON is refused before any dependency runs: the caller and
            # the tenant gate come first all the same (401, or 404 for another tenant's).
            try:
                await caller_of(request)
            except errors.QueueServerError as refused:
                return await domain_error(request, refused)
        if any(tuple(err.get("loc", ())) == ("header", "Idempotency-Key") for err in exc.errors()):
            key_error = errors.IdempotencyKeyRequiredError()
            body = errors.problem(key_error, base_uri=_base(request), instance=request.url.path)
            return problem_response(body)
        fields = [
            {"loc": list(err.get("loc", ())), "msg": _message(err), "type": err.get("type")}
            for err in exc.errors()
        ]
        names = ", ".join(".".join(str(p) for p in f["loc"]) for f in fields)
        exc_ = errors.InvalidRequestError(f"Invalid fields: {names}.", errors=fields)
        body = errors.problem(exc_, base_uri=_base(request), instance=request.url.path)
        return problem_response(body)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        phrase = HTTPStatus(exc.status_code).phrase
        body = {
            "type": "about:blank",
            "title": phrase,
            "status": exc.status_code,
            "detail": str(exc.detail),
            "code": phrase.lower().replace(" ", "-"),
            "instance": request.url.path,
        }
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(_allowed_methods(request))
        return problem_response(body, headers)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> Response:
        log.exception(
            "unhandled error on %s %s%s", request.method, request.url.path, _trace_note(request)
        )
        body = errors.problem(
            errors.QueueServerError(), base_uri=_base(request), instance=request.url.path
        )
        return problem_response(body)
