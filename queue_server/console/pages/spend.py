"""Spend approvals and concurrency: each queue's limit, what sets it, active leases and live
approval (with a warning while it is about to expire), the form that records a new approval
(`POST .../queues/{queue}/spend-approvals`) and the one that sets a queue's concurrency
(`PUT .../queues/{queue}/concurrency`)."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from queue_server import errors
from queue_server.api import schemas
from queue_server.console import web
from queue_server.models import NAME_PATTERN, NAME_RE

router = APIRouter(
    prefix=f"{web.PREFIX}/tenants/{{tenant}}", route_class=web.ConsoleRoute, include_in_schema=False
)
NAV_ENTRY = web.NavEntry("spend", "Spend & concurrency")


@router.get("/spend")
async def overview(
    request: Request,
    tenant: str,
    queue: Annotated[str | None, Query(pattern=NAME_PATTERN)] = None,
) -> Response:
    session = await web.current_session(request)
    queues = web.services(request).queues
    status = web.answer_body(await queues.status(session.principal, tenant))
    names = [q["queue"] for q in status["queues"]]
    if queue and queue not in names:
        names.append(queue)
    rows = [
        web.answer_body(await queues.concurrency(session.principal, tenant, name)) for name in names
    ]
    return web.render(
        request, "spend.html", session, tenant=tenant, queues=rows, chosen=queue or ""
    )


@router.post("/spend")
async def approve(request: Request, tenant: str) -> Response:
    session = await web.current_session(request)
    form = await web.check_form(request, session)
    queue = web.form_text(form, "queue")
    if not NAME_RE.match(queue):
        raise errors.InvalidRequestError("The queue name is not valid.")
    expires = web.form_text(form, "expires_at")
    with contextlib.suppress(ValueError):  # not a time: the schema's 422 page says so
        at = datetime.fromisoformat(expires.replace("Z", "+00:00"))
        # Typed without a zone, as the field asks: UTC, as its label says.
        expires = (at if at.tzinfo else at.replace(tzinfo=UTC)).isoformat()
    max_concurrency = web.form_text(form, "max_concurrency")
    body = web.body_of(
        schemas.SpendApprovalIn,
        # Digits only, and few enough for int() (Python refuses over 4,300 digits): anything
        # else goes to the schema as text, which refuses it with a 422 page.
        max_concurrency=int(max_concurrency)
        if max_concurrency.isascii() and max_concurrency.isdigit() and len(max_concurrency) <= 18
        else max_concurrency,
        expires_at=expires,
        reason=web.form_text(form, "reason"),
    )
    rest_path = f"/v1/tenants/{tenant}/queues/{queue}/spend-approvals"
    idem = web.idempotency_for(
        session.principal.key_id, form, rest_path=rest_path, body=body.model_dump(mode="json")
    )
    answer = await web.services(request).queues.approve_spend(
        session.principal,
        tenant,
        queue,
        idem,
        instance=rest_path,
        approved_by=None,  # the signed-in key approves
        max_concurrency=body.max_concurrency,
        expires_at=body.expires_at,
        reason=body.reason,
    )
    target = web.tenant_path(tenant, "spend", queue=queue)
    if answer.problem:
        return web.redirect(request, target, web.problem_text(answer), "error")
    return web.redirect(
        request, target, f"Approved {body.max_concurrency} concurrent leases on {queue}."
    )


@router.post("/spend/concurrency")
async def set_concurrency(request: Request, tenant: str) -> Response:
    session = await web.current_session(request)
    form = await web.check_form(request, session)
    queue = web.form_text(form, "queue")
    if not NAME_RE.match(queue):
        raise errors.InvalidRequestError("The queue name is not valid.")
    given = web.form_text(form, "concurrency").strip()
    body = web.body_of(
        schemas.ConcurrencyIn,
        # Empty: follow the approved limit. Digits only, as for max_concurrency above.
        concurrency=None
        if not given
        else int(given)
        if given.isascii() and given.isdigit() and len(given) <= 18
        else given,
        reason=web.form_text(form, "reason"),
    )
    rest_path = f"/v1/tenants/{tenant}/queues/{queue}/concurrency"
    idem = web.idempotency_for(
        session.principal.key_id, form, rest_path=rest_path, body=body.model_dump(mode="json")
    )
    answer = await web.services(request).queues.set_concurrency(
        session.principal,
        tenant,
        queue,
        idem,
        instance=rest_path,
        concurrency=body.concurrency,
        reason=body.reason,
    )
    target = web.tenant_path(tenant, "spend", queue=queue)
    if answer.problem:
        return web.redirect(request, target, web.problem_text(answer), "error")
    limit = web.answer_body(answer)["limit"]
    return web.redirect(request, target, f"{queue} now leases at most {limit} at a time.")
