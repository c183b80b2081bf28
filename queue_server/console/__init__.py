"""The web console at /console: server-rendered pages (Jinja2, plain HTML forms) over the same
service code as the REST API.

Adding a page: write a module under `queue_server.console.pages` with a `router`
(`APIRouter(route_class=ConsoleRoute, include_in_schema=False)`, paths under
/console/tenants/{tenant}/...) and a `NAV_ENTRY` (or None), then list it in `PAGES` below;
its templates extend `base.html`.
Every effect goes through the service method of the REST route it mirrors, with the
Idempotency of that REST request (see `web.idempotency_for`).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from fastapi import FastAPI
from starlette.staticfiles import StaticFiles

from queue_server.console import web
from queue_server.console.pages import (
    dead_letters,
    items,
    queue_charts,
    queues,
    runs,
    schedules,
    session,
    spend,
    watchers,
)

# In navigation order.
PAGES: list[ModuleType] = [
    session,
    queues,
    queue_charts,
    items,
    dead_letters,
    watchers,
    schedules,
    spend,
    runs,
]


def install(app: FastAPI) -> None:
    """Serve the console's pages and its stylesheet from this package."""
    # Failed sign-ins: 10 a minute per client address and per key id, in each API process.
    app.state.sign_in_limiter = web.SignInLimiter(limit=10, window=60.0)
    web.NAV.clear()
    for page in PAGES:
        entry = getattr(page, "NAV_ENTRY", None)
        if entry is not None:
            web.NAV.append(entry)
        # The routes as their router built them at import: `include_router` would build
        # every route's parameters again for each new app, on its first request (20 ms).
        app.router.routes.extend(page.router.routes)
    app.mount(
        f"{web.PREFIX}/static",
        StaticFiles(directory=Path(__file__).parent / "static"),
        name="console-static",
    )
