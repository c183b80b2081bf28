"""Sign-in (operator or admin key; a worker key is refused), sign-out, and the home page:
an operator goes to its tenant, an admin picks one."""

from __future__ import annotations

import contextlib
import hmac
import math
from typing import Annotated

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from queue_server import auth, errors
from queue_server.console import web
from queue_server.models import NAME_RE, Role

router = APIRouter(prefix=web.PREFIX, route_class=web.ConsoleRoute, include_in_schema=False)
NAV_ENTRY = None

TENANT_PAGE = 100


def _safe_next(target: str | None) -> str:
    if target and target.startswith(web.PREFIX + "/") and "//" not in target and "\\" not in target:
        return target
    return web.PREFIX


def _sign_in_page(
    request: Request, *, status: int = 200, error: str | None = None, next_path: str = ""
) -> Response:
    token = web.login_token()
    response = web.render(
        request,
        "sign_in.html",
        None,
        status_code=status,
        error=error,
        login_csrf=token,
        next=next_path,
    )
    web.set_cookie(request, response, web.LOGIN_COOKIE, token)
    return response


@router.get("/sign-in")
async def sign_in_form(
    request: Request, next: Annotated[str | None, Query(max_length=2048)] = None
) -> Response:
    return _sign_in_page(request, next_path=_safe_next(next))


@router.post("/sign-in")
async def sign_in(request: Request) -> Response:
    form = await request.form()
    token = web.form_text(form, "csrf")
    expected = request.cookies.get(web.LOGIN_COOKIE, "")
    next_path = _safe_next(web.form_text(form, "next"))
    if not token or not expected or not hmac.compare_digest(token, expected):
        return _sign_in_page(
            request,
            status=403,
            error="The sign-in form expired; please sign in again.",
            next_path=next_path,
        )
    secret = web.form_text(form, "api_key")
    # Failed sign-ins count against the client's address and the key id the secret names.
    who = [f"address:{request.client.host if request.client else '?'}"]
    with contextlib.suppress(errors.UnauthorizedError):
        who.append(f"key:{auth.parse_bearer(f'Bearer {secret}')}")
    limiter: web.SignInLimiter = request.app.state.sign_in_limiter
    wait = limiter.retry_after(*who)
    if wait is not None:
        response = _sign_in_page(
            request,
            status=429,
            error="Too many failed sign-ins: wait a minute and try again.",
            next_path=next_path,
        )
        response.headers["Retry-After"] = str(max(1, math.ceil(wait)))
        return response
    keys = web.services(request).keys
    try:
        principal = await keys.authenticate(f"Bearer {secret}")
    except errors.UnauthorizedError:
        limiter.failed(*who)
        return _sign_in_page(
            request, status=401, error="This API key is unknown or revoked.", next_path=next_path
        )
    if principal.role is Role.WORKER:
        return _sign_in_page(
            request,
            status=403,
            error="A worker key cannot sign in to the console: use an operator or admin key.",
            next_path=next_path,
        )
    ttl = request.app.state.settings.console_session_ttl
    token = await keys.open_session(principal, ttl=ttl)
    response = web.redirect(request, next_path, "Signed in.")
    web.set_cookie(request, response, web.SESSION_COOKIE, token, max_age=int(ttl))
    web.clear_cookie(request, response, web.LOGIN_COOKIE)
    return response


@router.post("/sign-out")
async def sign_out(request: Request) -> Response:
    session = await web.current_session(request)
    await web.check_form(request, session)
    await web.services(request).keys.end_session(session.token)
    response = web.redirect(request, f"{web.PREFIX}/sign-in", "Signed out.")
    web.clear_cookie(request, response, web.SESSION_COOKIE)
    return response


@router.get("")
async def home(
    request: Request,
    tenant: Annotated[str | None, Query(max_length=64)] = None,
    cursor: Annotated[str | None, Query(max_length=64)] = None,
) -> Response:
    """An operator's tenant, or for an admin the list of tenants (and a box to go to one)."""
    session = await web.current_session(request)
    principal = session.principal
    if principal.tenant is not None:
        return web.redirect(request, web.tenant_path(principal.tenant, "queues"))
    if tenant:
        if not NAME_RE.match(tenant):
            raise errors.TenantNotFoundError(tenant=tenant)
        return web.redirect(request, web.tenant_path(tenant, "queues"))
    if cursor is not None and not NAME_RE.match(cursor):
        cursor = None
    answer = await web.services(request).tenants.list_tenants(
        principal, after=cursor, limit=TENANT_PAGE
    )
    page = web.answer_body(answer)
    return web.render(
        request, "tenants.html", session, tenants=page["tenants"], next_cursor=page["next_cursor"]
    )
