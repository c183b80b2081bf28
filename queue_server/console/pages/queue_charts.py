"""A queue's charts over the last hour or day: completed and failed per step, ready items,
the oldest ready item's age and the mean acquire-to-complete time, drawn on the server as
inline SVG from the sweeper's samples; its script redraws them every two seconds."""

from __future__ import annotations

from fastapi import APIRouter, Request
from markupsafe import Markup
from starlette.responses import JSONResponse, Response

from queue_server import errors
from queue_server.console import charts, web
from queue_server.models import NAME_RE
from queue_server.services.queues import History

router = APIRouter(
    prefix=f"{web.PREFIX}/tenants/{{tenant}}", route_class=web.ConsoleRoute, include_in_schema=False
)
NAV_ENTRY = None

SPAN_LABELS = {"1h": "1 h", "24h": "24 h"}


@router.get("/queues/{queue}/charts")
async def queue_charts(request: Request, tenant: str, queue: str, span: str = "1h") -> Response:
    session = await web.current_session(request)
    history = await _history(request, session, tenant, queue, span)
    return web.render(
        request,
        "queue_charts.html",
        session,
        tenant=tenant,
        queue=queue,
        span=span,
        spans=SPAN_LABELS,
        figures=figures(history),
        values=values(history),
    )


@router.get("/queues/{queue}/charts/live")
async def queue_charts_live(
    request: Request, tenant: str, queue: str, span: str = "1h"
) -> Response:
    """The page's numbers and figures, for its script to put in place (console.js)."""
    session = await web.current_session(request)
    history = await _history(request, session, tenant, queue, span)
    body = {"values": values(history), "figures": {k: str(v) for k, v in figures(history).items()}}
    return JSONResponse(body, headers={"Cache-Control": "no-store"})


async def _history(
    request: Request, session: web.Session, tenant: str, queue: str, span: str
) -> History:
    if not NAME_RE.match(queue):
        raise errors.InvalidRequestError("The queue name is not valid.")
    return await web.services(request).queues.history(session.principal, tenant, queue, span)


def _step(history: History) -> str:
    return "minute" if history.span.name == "1h" else "15 minutes"


def _latest(latency: list[float | None]) -> float | None:
    return next((v for v in reversed(latency) if v is not None), None)


def values(history: History) -> dict[str, str]:
    """The numbers above the figures, by their elements' data-live keys."""
    return {
        "ready": web.num(history.ready[-1]),
        "oldest_ready_age": charts.seconds_text(history.oldest_ready_age[-1] or None),
        "completed": web.num(sum(history.completed)),
        "failed": web.num(sum(history.failed)),
        "latency": charts.seconds_text(_latest(history.latency)),
        "span": "hour" if history.span.name == "1h" else "day",
        "step": "minute" if history.span.name == "1h" else "quarter hour",
    }


def figures(history: History) -> dict[str, Markup]:
    """The four figures of the queue's page, by their data-figure keys."""
    span = history.span.name
    per = _step(history)
    done, failed = history.completed, history.failed
    latest = _latest(history.latency)
    age = history.oldest_ready_age[-1]
    return {
        "throughput": charts.figure(
            "throughput",
            f"Completed and failed per {per}",
            [charts.Line("done", "completed", done), charts.Line("failed", "failed", failed)],
            span=span,
            summary=f"{done[-1]:,} completed and {failed[-1]:,} failed in this {per} so far;"
            f" {sum(done):,} and {sum(failed):,} in all.",
        ),
        "ready": charts.figure(
            "ready",
            "Ready items",
            [charts.Line("ready", "ready", history.ready)],
            span=span,
            summary=f"{history.ready[-1]:,} now, at most {max(history.ready):,}.",
        ),
        "age": charts.figure(
            "age",
            "Oldest ready item's wait",
            [charts.Line("age", "waiting", history.oldest_ready_age)],
            span=span,
            summary=(f"{charts.seconds_text(age)} now." if age else "no item waiting now.")
            + f" Longest {charts.seconds_text(max(history.oldest_ready_age))}.",
            seconds=True,
        ),
        "latency": charts.figure(
            "latency",
            f"Acquire to complete, mean per {per}",
            [charts.Line("latency", "mean", history.latency)],
            span=span,
            summary=(
                f"{charts.seconds_text(latest)} in the latest {per} with a completion."
                if latest is not None
                else "no completion in this span."
            ),
            seconds=True,
        ),
    }
