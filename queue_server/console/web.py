"""What every console page shares: the session cookie, CSRF, idempotent form actions, flash
messages, HTML error pages and template rendering.

The session cookie holds a random session id, never the key: its sha256 is a row of
`console_sessions` with the key it was opened with and its expiry (QUEUE_SERVER_CONSOLE_SESSION_TTL,
12 h). The cookie is HttpOnly, SameSite=Strict, Path=/console, Secure when the request came over
TLS, and expires with the session. Every request reads the row, so sign-out, expiry and a
revoked key end the session at once in every API process. The CSRF token of a session is an
HMAC of a fixed label keyed by the session id: only a page the server rendered for this
session can carry it. Failed sign-ins are limited per client address and per key id
(`SignInLimiter`): past the limit, 429 with Retry-After.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode

import orjson
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from fastapi.templating import Jinja2Templates
from markupsafe import Markup
from pydantic import BaseModel, ValidationError
from starlette.datastructures import FormData
from starlette.responses import RedirectResponse, Response

from queue_server import auth, errors
from queue_server.console import ledger
from queue_server.idempotency import Answer, Idempotency
from queue_server.models import Role
from queue_server.services import Services

B = TypeVar("B", bound=BaseModel)

PREFIX = "/console"
SESSION_COOKIE = "qs_console"
LOGIN_COOKIE = "qs_console_login"
FLASH_COOKIE = "qs_console_flash"
_CSRF_LABEL = b"queue-server console csrf v1"

templates = Jinja2Templates(directory=Path(__file__).parent / "templates")


def _when(value: Any) -> str | Markup:
    """An RFC 3339 time (the API's are UTC): a past one as `3 min ago`, the exact time
    (`2026-11-30 16:50:03 UTC`) on hover; a future one as that exact time, `in 4 min` on
    hover (when it will happen is what one plans by)."""
    if not value:
        return "—"
    try:
        at = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return str(value)
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    exact = at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    seconds = (datetime.now(UTC) - at).total_seconds()
    if seconds < -1:
        shown, hover = exact, "in " + _span(-seconds)
    else:
        shown, hover = ("just now" if seconds < 5 else _span(seconds) + " ago"), exact
    return Markup('<time datetime="{}" title="{}">{}</time>').format(at.isoformat(), hover, shown)


def _span(seconds: float) -> str:
    """`12 s`, `3 min`, `5 h`, `2 d`: a duration at a glance."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min"
    if seconds < 86400:
        return f"{seconds // 3600:.0f} h"
    return f"{seconds // 86400:,.0f} d"


def _age(seconds: Any) -> str:
    if seconds is None:
        return "—"
    left = int(float(seconds))
    if left < 60:
        return f"{left}s"
    if left < 3600:
        return f"{left // 60}m {left % 60}s"
    if left < 86400:
        return f"{left // 3600}h {left % 3600 // 60}m"
    return f"{left // 86400}d {left % 86400 // 3600}h"


def num(value: Any) -> str:
    """A count with thousands separators: 12,345."""
    return f"{value:,}" if isinstance(value, int) else ("—" if value is None else str(value))


def _pretty(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()


# A ledger event's data shows this many entries of a list at most (a fan-in's callback
# names up to 10,000 dependencies; the ledger over REST has them all).
LISTED_IN_EVENTS = 20


def _shortened(value: Any) -> Any:
    if isinstance(value, list) and len(value) > LISTED_IN_EVENTS:
        more = len(value) - LISTED_IN_EVENTS
        return [*map(_shortened, value[:LISTED_IN_EVENTS]), f"... and {more:,} more"]
    if isinstance(value, list):
        return [_shortened(v) for v in value]
    if isinstance(value, dict):
        return {k: _shortened(v) for k, v in value.items()}
    return value


def _brief(value: Any) -> str:
    """An event's data, pretty, each long list shortened to its first entries."""
    return _pretty(_shortened(value))


templates.env.filters.update(
    when=_when, age=_age, pretty=_pretty, brief=_brief, gap=ledger.gap, num=num
)
templates.env.globals.update(timeline=ledger.timeline)


@dataclass(frozen=True, slots=True)
class NavEntry:
    """One link of the console's navigation: `path` is appended to /console/tenants/{tenant}."""

    path: str
    label: str


# The navigation, in order. A page module appends its entry here when it is registered
# (see queue_server.console.PAGES).
NAV: list[NavEntry] = []


class SignInRequiredError(Exception):
    """No valid session: the browser is sent to the sign-in page."""


@dataclass(frozen=True, slots=True)
class Session:
    """A signed-in operator or admin: who they are and the CSRF token of their pages."""

    principal: auth.Principal
    csrf: str
    token: str = ""

    @property
    def is_admin(self) -> bool:
        return self.principal.role is Role.ADMIN


def csrf_token(secret: str) -> str:
    return hmac.new(secret.encode(), _CSRF_LABEL, hashlib.sha256).hexdigest()


def services(request: Request) -> Services:
    """The services the app built once at start: the same objects the REST routes call."""
    built: Services = request.app.state.services
    return built


def is_tls(request: Request) -> bool:
    return request.url.scheme == "https"


def set_cookie(
    request: Request, response: Response, name: str, value: str, max_age: int | None = None
) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=PREFIX,
        httponly=True,
        samesite="strict",
        secure=is_tls(request),
    )


def clear_cookie(request: Request, response: Response, name: str) -> None:
    response.delete_cookie(
        name, path=PREFIX, httponly=True, samesite="strict", secure=is_tls(request)
    )


async def current_session(request: Request) -> Session:
    """The session of this request, or SignInRequiredError (the page redirects to sign-in)."""
    token = request.cookies.get(SESSION_COOKIE)
    if not token:
        raise SignInRequiredError()
    try:
        principal = await services(request).keys.session_principal(token)
    except errors.UnauthorizedError:
        raise SignInRequiredError() from None
    if principal.role is Role.WORKER:
        raise SignInRequiredError()
    return Session(principal=principal, csrf=csrf_token(token), token=token)


class SignInLimiter:
    """Failed sign-ins in the last `window` seconds, per client address and per key id: at
    `limit` of either, further sign-ins are refused (429) until the oldest leaves the window.
    Kept by each API process (a process counts the attempts it answers)."""

    def __init__(self, limit: int = 10, window: float = 60.0) -> None:
        self.limit = limit
        self.window = window
        self._failures: dict[str, deque[float]] = {}

    def _recent(self, name: str, now: float) -> deque[float]:
        times = self._failures.setdefault(name, deque())
        while times and now - times[0] >= self.window:
            times.popleft()
        if not times:
            del self._failures[name]
        return times

    def retry_after(self, *names: str) -> float | None:
        """Seconds until one more attempt from these (address, key id) is allowed; None now."""
        now = time.monotonic()
        waits = [
            self.window - (now - times[0])
            for name in names
            if len(times := self._recent(name, now)) >= self.limit
        ]
        return max(waits) if waits else None

    def failed(self, *names: str) -> None:
        now = time.monotonic()
        for name in names:
            self._failures.setdefault(name, deque()).append(now)
        if len(self._failures) > 100_000:  # a flood of addresses: keep memory bounded
            self._failures.clear()


class FormNotUtf8Error(errors.QueueServerError):
    """The form's fields are not valid UTF-8 (the REST routes refuse such text too)."""

    status = 400
    code = "malformed-request"
    title = "Bad form"


def _strict_utf8(body: bytes) -> None:
    """Starlette decodes a form's fields with replacement characters: refuse instead, as
    the REST routes refuse a body that is not UTF-8."""
    try:
        parse_qsl(body.decode("utf-8"), encoding="utf-8", errors="strict")
    except UnicodeDecodeError:
        raise FormNotUtf8Error("The form's fields are not valid UTF-8.") from None


async def check_form(request: Request, session: Session) -> FormData:
    """The submitted form, once its CSRF token matched this session's."""
    if request.headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        _strict_utf8(await request.body())
    form = await request.form()
    token = form.get("csrf")
    if not isinstance(token, str) or not hmac.compare_digest(token, session.csrf):
        raise CsrfRefusedError()
    return form


class CsrfRefusedError(errors.QueueServerError):
    """The form's CSRF token is missing or not this session's; reload the page and try again."""

    status = 403
    code = "csrf-refused"
    title = "Form refused"


def choice(name: str, value: str | None, allowed: tuple[str, ...]) -> str | None:
    """A filter's select box: empty is "any"; anything else must be one of `allowed`."""
    if not value:
        return None
    if value not in allowed:
        raise errors.InvalidRequestError(f"{name} must be one of: {', '.join(allowed)}.")
    return value


def form_text(form: FormData, name: str, default: str = "") -> str:
    value = form.get(name, default)
    return value.strip() if isinstance(value, str) else default


def idempotency_for(
    caller: str, form: FormData, *, rest_path: str, body: Any, suffix: str = ""
) -> Idempotency:
    """The Idempotency of the REST request this form stands for, by the session's key
    `caller`: the key the page was rendered with (a resubmitted form replays its first
    answer), fingerprinted as the REST route does."""
    key = form_text(form, "idempotency_key")
    if suffix:
        key = f"{key}:{suffix}"
    return Idempotency.of(key or None, caller=caller, method="POST", path=rest_path, body=body)


def body_of(model: type[B], **fields: Any) -> B:
    """The REST route's request body built from form fields; invalid fields are a 422 page."""
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        names = ", ".join(".".join(str(p) for p in err["loc"]) for err in exc.errors())
        raise errors.InvalidRequestError(f"Check these fields: {names}.") from None


def new_idempotency_key() -> str:
    return f"console-{uuid.uuid4().hex}"


def answer_body(answer: Answer) -> Any:
    return orjson.loads(answer.body)


def problem_text(answer: Answer) -> str:
    body = answer_body(answer)
    return f"{body.get('title', 'Refused')}: {body.get('detail', '')}"


# -- flash messages ------------------------------------------------------------------


def flash(request: Request, response: Response, text: str, kind: str = "ok") -> None:
    value = base64.urlsafe_b64encode(orjson.dumps({"kind": kind, "text": text[:600]})).decode()
    set_cookie(request, response, FLASH_COOKIE, value)


def _read_flash(request: Request) -> dict[str, str] | None:
    raw = request.cookies.get(FLASH_COOKIE)
    if not raw:
        return None
    try:
        value = orjson.loads(base64.urlsafe_b64decode(raw.encode()))
    except (ValueError, orjson.JSONDecodeError):
        return None
    if isinstance(value, dict) and isinstance(value.get("text"), str):
        return {"kind": str(value.get("kind", "ok")), "text": value["text"]}
    return None


def redirect(request: Request, to: str, text: str | None = None, kind: str = "ok") -> Response:
    response = RedirectResponse(to, status_code=303)
    if text:
        flash(request, response, text, kind)
    return response


def back(request: Request, form: FormData, default: str) -> str:
    """Where an action returns: the page's own `next` path when it is one of ours."""
    target = form_text(form, "next")
    if target.startswith(PREFIX + "/") and "//" not in target and "\\" not in target:
        return target
    return default


# -- rendering -----------------------------------------------------------------------


def tenant_path(tenant: str, *parts: str, **query: Any) -> str:
    path = "/".join([PREFIX, "tenants", tenant, *parts])
    kept = {k: v for k, v in query.items() if v not in (None, "")}
    return f"{path}?{urlencode(kept)}" if kept else path


def render(
    request: Request,
    template: str,
    session: Session | None,
    status_code: int = 200,
    **context: Any,
) -> Response:
    context.setdefault("tenant", None)
    response = templates.TemplateResponse(
        request,
        template,
        {
            "session": session,
            "nav": NAV,
            "flash": _read_flash(request),
            "path": request.url.path,
            "full_path": request.url.path + (f"?{request.url.query}" if request.url.query else ""),
            **context,
        },
        status_code=status_code,
    )
    if request.cookies.get(FLASH_COOKIE):
        clear_cookie(request, response, FLASH_COOKIE)
    return response


templates.env.globals.update(prefix=PREFIX, tenant_path=tenant_path, new_key=new_idempotency_key)


def error_page(request: Request, status: int, title: str, detail: str) -> Response:
    return render(request, "error.html", None, status_code=status, title=title, detail=detail)


# Pages load nothing but their own stylesheet, run no script, are never framed (no
# clickjacking of an operator's buttons) and are not cached (they show another tenant's
# data to nobody, but a shared machine's cache should not keep them either).
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self';"
        # The live pages' script is a file of ours (console.js), never inline, and it asks
        # this server only.
        " script-src 'self'; connect-src 'self';"
        " frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


class ConsoleRoute(APIRoute):
    """Console handlers answer HTML: domain errors become an error page with their status
    (another tenant's item is a 404 page), and a missing session goes to sign-in."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            response = await answer(request)
            response.headers.update(SECURITY_HEADERS)
            return response

        async def answer(request: Request) -> Response:
            try:
                return await handler(request)
            except SignInRequiredError:
                target = request.url.path
                if request.method == "GET" and request.url.query:
                    target += f"?{request.url.query}"
                response = RedirectResponse(
                    f"{PREFIX}/sign-in?{urlencode({'next': target})}", status_code=303
                )
                if request.cookies.get(SESSION_COOKIE):
                    clear_cookie(request, response, SESSION_COOKIE)
                return response
            except errors.QueueServerError as exc:
                return error_page(request, exc.status, exc.title, exc.detail)
            except RequestValidationError as exc:
                names = ", ".join(
                    str(err.get("loc", ("",))[-1]) for err in exc.errors() if err.get("loc")
                )
                return error_page(request, 422, "Invalid request", f"Check: {names}.")

        return handle


def login_token() -> str:
    return secrets.token_urlsafe(24)
