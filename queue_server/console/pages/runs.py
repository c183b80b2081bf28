"""Verification runs: the list (newest first, pages) and one run with its checkpoints and the
items that remain."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from queue_server.console import web

router = APIRouter(
    prefix=f"{web.PREFIX}/tenants/{{tenant}}", route_class=web.ConsoleRoute, include_in_schema=False
)
NAV_ENTRY = web.NavEntry("verification-runs", "Verification runs")

PAGE_SIZE = 50


@router.get("/verification-runs")
async def list_page(
    request: Request, tenant: str, cursor: Annotated[str | None, Query(max_length=64)] = None
) -> Response:
    session = await web.current_session(request)
    page = web.answer_body(
        await web.services(request).runs.list_runs(
            session.principal, tenant, limit=PAGE_SIZE, cursor=cursor
        )
    )
    next_url = None
    if page["next_cursor"]:
        next_url = web.tenant_path(tenant, "verification-runs", cursor=page["next_cursor"])
    return web.render(
        request, "runs.html", session, tenant=tenant, runs=page["runs"], next_url=next_url
    )


@router.get("/verification-runs/{run_id}")
async def show(request: Request, tenant: str, run_id: str) -> Response:
    session = await web.current_session(request)
    run = web.answer_body(await web.services(request).runs.get(session.principal, tenant, run_id))
    return web.render(request, "run.html", session, tenant=tenant, run=run)
