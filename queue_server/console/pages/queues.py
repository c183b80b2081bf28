"""The queues overview: per queue its items by state, oldest ready age, leases and limit."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from queue_server.console import web

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
