"""The queues overview: per queue its items by state, ages, leases against the limit, open
dead letters, completions and failures over the last minute and hour, and pause/resume."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from starlette.responses import Response

from queue_server import errors
from queue_server.api import schemas
from queue_server.console import web
from queue_server.models import NAME_RE

router = APIRouter(prefix=f"{web.PREFIX}/tenants/{{tenant}}", route_class=web.ConsoleRoute)
NAV_ENTRY = web.NavEntry("queues", "Queues")


@router.get("")
async def tenant_home(request: Request, tenant: str) -> Response:
    await web.current_session(request)
    return web.redirect(request, web.tenant_path(tenant, "queues"))


@router.get("/queues")
async def overview(request: Request, tenant: str) -> Response:
    session = await web.current_session(request)
    answer = await web.services(request).queues.status(session.principal, tenant)
    status = web.answer_body(answer)
    return web.render(request, "queues.html", session, tenant=tenant, status=status)


@router.post("/queues/{queue}/pause/confirm")
async def confirm_pause(request: Request, tenant: str, queue: str) -> Response:
    """What pausing does, with a field for the reason the ledger keeps."""
    session = await web.current_session(request)
    form = await web.check_form(request, session)
    if not NAME_RE.match(queue):
        raise errors.InvalidRequestError("The queue name is not valid.")
    return web.render(
        request,
        "queue_pause_confirm.html",
        session,
        tenant=tenant,
        queue=queue,
        next=web.back(request, form, web.tenant_path(tenant, "queues")),
    )


@router.post("/queues/{queue}/{action}")
async def change(
    request: Request, tenant: str, queue: str, action: Literal["pause", "resume"]
) -> Response:
    """Pause or resume through `POST .../queues/{queue}/{action}`'s service call."""
    session = await web.current_session(request)
    form = await web.check_form(request, session)
    body = web.body_of(schemas.PauseIn, reason=web.form_text(form, "reason"))
    rest_path = f"/v1/tenants/{tenant}/queues/{queue}/{action}"
    idem = web.idempotency_for(form, rest_path=rest_path, body=body.model_dump(mode="json"))
    queues = web.services(request).queues
    run = queues.pause if action == "pause" else queues.resume
    answer = await run(
        session.principal, tenant, queue, idem, instance=rest_path, reason=body.reason
    )
    target = web.back(request, form, web.tenant_path(tenant, "queues"))
    if answer.problem:
        return web.redirect(request, target, web.problem_text(answer), "error")
    if action == "pause":
        return web.redirect(
            request, target, f"Paused {queue}: it hands out no lease until resumed."
        )
    return web.redirect(request, target, f"Resumed {queue}.")
