"""Schedules: the list with each schedule's next fire times and counters; pause, resume and
trigger (one run now), each through the REST route's service call."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Request
from starlette.responses import Response

from queue_server import errors
from queue_server.api import schemas
from queue_server.console import web
from queue_server.services.schedules import MAX_PAGE

router = APIRouter(
    prefix=f"{web.PREFIX}/tenants/{{tenant}}", route_class=web.ConsoleRoute, include_in_schema=False
)
NAV_ENTRY = web.NavEntry("schedules", "Schedules")

# Fire times the list shows per schedule.
SHOWN_FIRES = 3


@router.get("/schedules")
async def list_page(request: Request, tenant: str) -> Response:
    session = await web.current_session(request)
    answer = await web.services(request).schedules.list(
        session.principal, tenant, limit=MAX_PAGE, cursor=None
    )
    body = web.answer_body(answer)
    return web.render(
        request,
        "schedules.html",
        session,
        tenant=tenant,
        schedules=body["schedules"],
        more=body["next_cursor"] is not None,
        shown_fires=SHOWN_FIRES,
    )


@router.post("/schedules/{name}/{action}")
async def act(
    request: Request, tenant: str, name: str, action: Literal["pause", "resume", "trigger"]
) -> Response:
    """`POST /v1/tenants/{tenant}/schedules/{name}/{action}`, from a form."""
    session = await web.current_session(request)
    form = await web.check_form(request, session)
    rest_path = f"/v1/tenants/{tenant}/schedules/{name}/{action}"
    idem = web.idempotency_for(
        session.principal.key_id, form, rest_path=rest_path, body=schemas.Body().model_dump()
    )
    schedules = web.services(request).schedules
    target = web.back(request, form, web.tenant_path(tenant, "schedules"))
    if action == "trigger":
        try:
            answer = await schedules.trigger(
                session.principal, tenant, name, idem, instance=rest_path
            )
        except errors.BacklogCapReachedError as exc:
            # Not kept as a receipt: the same form may be sent again once there is room.
            return web.redirect(request, target, f"{exc.title}: {exc.detail}", "error")
    else:
        answer = await schedules.change(
            session.principal, tenant, name, idem, instance=rest_path, pause=action == "pause"
        )
    if answer.problem:
        return web.redirect(request, target, web.problem_text(answer), "error")
    if action == "trigger":
        item = web.answer_body(answer)["item"]
        return web.redirect(request, target, f"Enqueued item {item['item_id']} on {item['queue']}.")
    done = "Paused" if action == "pause" else "Resumed"
    return web.redirect(request, target, f"{done} {name}.")
