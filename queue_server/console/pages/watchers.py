"""Watchers: the list with deliveries by state, pause and resume; one watcher's deliveries
(state filter, pages) with replay of a dead delivery."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from queue_server.api import schemas
from queue_server.api.dead_letters import ReplayIn
from queue_server.console import web

router = APIRouter(
    prefix=f"{web.PREFIX}/tenants/{{tenant}}", route_class=web.ConsoleRoute, include_in_schema=False
)
NAV_ENTRY = web.NavEntry("watchers", "Watchers")

PAGE_SIZE = 50
DELIVERY_STATES = ("pending", "delivered", "dead", "cancelled")


@router.get("/watchers")
async def list_page(request: Request, tenant: str) -> Response:
    session = await web.current_session(request)
    answer = await web.services(request).watchers.list(session.principal, tenant)
    return web.render(request, "watchers.html", session, tenant=tenant, **web.answer_body(answer))


@router.get("/watchers/{watcher_id}")
async def show(
    request: Request,
    tenant: str,
    watcher_id: str,
    state: Annotated[str | None, Query(max_length=16)] = None,
    cursor: Annotated[str | None, Query(max_length=32)] = None,
) -> Response:
    session = await web.current_session(request)
    state = web.choice("State", state, DELIVERY_STATES)
    watchers = web.services(request).watchers
    watcher = web.answer_body(await watchers.get(session.principal, tenant, watcher_id))
    page = web.answer_body(
        await watchers.deliveries(
            session.principal, tenant, watcher_id, state=state, limit=PAGE_SIZE, cursor=cursor
        )
    )
    next_url = None
    if page["next_cursor"]:
        next_url = web.tenant_path(
            tenant, "watchers", watcher_id, state=state, cursor=page["next_cursor"]
        )
    return web.render(
        request,
        "watcher.html",
        session,
        tenant=tenant,
        watcher=watcher,
        deliveries=page["deliveries"],
        state_filter=state or "",
        next_url=next_url,
    )


@router.post("/watchers/{watcher_id}/{action}")
async def change(
    request: Request, tenant: str, watcher_id: str, action: Literal["pause", "resume"]
) -> Response:
    """Pause or resume through the REST route's service call (`POST .../watchers/{id}/{action}`)."""
    session = await web.current_session(request)
    form = await web.check_form(request, session)
    rest_path = f"/v1/tenants/{tenant}/watchers/{watcher_id}/{action}"
    idem = web.idempotency_for(
        session.principal.key_id, form, rest_path=rest_path, body=schemas.Body().model_dump()
    )
    answer = await web.services(request).watchers.change(
        session.principal, tenant, watcher_id, idem, instance=rest_path, action=action
    )
    target = web.back(request, form, web.tenant_path(tenant, "watchers"))
    if answer.problem:
        return web.redirect(request, target, web.problem_text(answer), "error")
    done = "Paused" if action == "pause" else "Resumed"
    return web.redirect(request, target, f"{done} the watcher.")


@router.post("/deliveries/{delivery_id}/replay")
async def replay_delivery(request: Request, tenant: str, delivery_id: str) -> Response:
    """Send a dead delivery again: the replay of its dead letter, as
    `POST .../dead-letters/{id}/replay` does it."""
    session = await web.current_session(request)
    form = await web.check_form(request, session)
    operators = web.services(request).dead_letters
    dead_letter_id = await operators.dead_letter_of_delivery(session.principal, tenant, delivery_id)
    rest_path = f"/v1/tenants/{tenant}/dead-letters/{dead_letter_id}/replay"
    body = ReplayIn()
    idem = web.idempotency_for(
        session.principal.key_id, form, rest_path=rest_path, body=body.model_dump(mode="json")
    )
    answer = await operators.replay(
        session.principal,
        tenant,
        dead_letter_id,
        idem,
        instance=rest_path,
        max_acquisitions=body.max_acquisitions,
    )
    target = web.back(request, form, web.tenant_path(tenant, "watchers"))
    if answer.problem:
        return web.redirect(request, target, web.problem_text(answer), "error")
    return web.redirect(request, target, "The delivery is pending again.")
