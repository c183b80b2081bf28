"""Items: one item with its payload, result, last failure and its ledger as a timeline."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from queue_server.console import web

router = APIRouter(prefix=f"{web.PREFIX}/tenants/{{tenant}}", route_class=web.ConsoleRoute)
NAV_ENTRY = None


@router.get("/items/{item_id}")
async def show(request: Request, tenant: str, item_id: str) -> Response:
    session = await web.current_session(request)
    items = web.services(request).items
    item = web.answer_body(await items.get_item(session.principal, tenant, item_id))
    ledger = web.answer_body(await items.ledger(session.principal, tenant, item_id))
    return web.render(
        request, "item.html", session, tenant=tenant, item=item, events=ledger["events"]
    )
