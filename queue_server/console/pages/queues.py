"""The queues overview: per queue its items by state, ages, leases against the limit, open
dead letters, completions and failures over the last minute and hour, and pause/resume, under
a warning while an old snapshot holds the database's horizon back; and each queue's settings
page (lease TTL, deadline, budget, backoff), shown and edited."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from queue_server import errors, views
from queue_server.api import schemas
from queue_server.console import charts, web
from queue_server.models import NAME_RE, Role

router = APIRouter(
    prefix=f"{web.PREFIX}/tenants/{{tenant}}", route_class=web.ConsoleRoute, include_in_schema=False
)
NAV_ENTRY = web.NavEntry("queues", "Queues")


@router.get("")
async def tenant_home(request: Request, tenant: str) -> Response:
    await web.current_session(request)
    return web.redirect(request, web.tenant_path(tenant, "queues"))


@router.get("/queues")
async def overview(request: Request, tenant: str) -> Response:
    session = await web.current_session(request)
    status, drawn = await _figures(request, session, tenant)
    held = await web.services(request).figures.held_horizon()
    return web.render(
        request, "queues.html", session, tenant=tenant, status=status, charts=drawn, held=held
    )


@router.get("/queues/live")
async def live(request: Request, tenant: str) -> Response:
    """The overview's numbers and charts, for its script to put in place (console.js)."""
    session = await web.current_session(request)
    status, drawn = await _figures(request, session, tenant)
    held = await web.services(request).figures.held_horizon()
    banner = web.templates.env.get_template("_held_horizon.html").render(held=held)
    return JSONResponse(
        {"values": _values(status), "charts": drawn, "figures": {"held-horizon": banner}},
        headers={"Cache-Control": "no-store"},
    )


async def _figures(
    request: Request, session: web.Session, tenant: str
) -> tuple[dict[str, Any], dict[str, dict[str, object]]]:
    queues = web.services(request).queues
    status = web.answer_body(await queues.status(session.principal, tenant))
    activity = await queues.activity(session.principal, tenant)
    drawn = {name: charts.chart(a.completed, a.failed) for name, a in activity.items()}
    return status, drawn


def _values(status: dict[str, Any]) -> dict[str, str]:
    """Each number of the overview as the page shows it, by its element's data-live key."""
    values = {
        "backlog": web.num(status["backlog"]),
        "open_dead_letters": web.num(status["open_dead_letters"]),
    }
    for q in status["queues"]:
        name = q["queue"]
        for state in ("ready", "leased", "completed", "quarantined", "cancelled"):
            values[f"{name}|{state}"] = web.num(q["states"].get(state, 0))
        values[f"{name}|active_leases"] = web.num(q["active_leases"])
        values[f"{name}|done_minute"] = web.num(q["completions"]["last_minute"])
        values[f"{name}|failed_minute"] = web.num(q["failures"]["last_minute"])
        values[f"{name}|done_hour"] = web.num(q["completions"]["last_hour"])
        values[f"{name}|failed_hour"] = web.num(q["failures"]["last_hour"])
    return values


@router.post("/queues/{queue}/pause/confirm")
async def confirm_pause(request: Request, tenant: str, queue: str) -> Response:
    """What pausing does, with a field for the reason the ledger keeps."""
    session = await web.current_session(request)
    form = await web.check_form(request, session)
    session.principal.require(tenant, Role.OPERATOR)  # another tenant's queue: a 404 page
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


def _settings_fields(settings: dict[str, Any]) -> list[tuple[str, str, dict[str, Any], str]]:
    retry = settings["retry"]
    return [
        ("lease_ttl", "Lease TTL, seconds", settings["lease_ttl"], "any"),
        ("deadline", "Lease deadline, seconds", settings["deadline"], "any"),
        ("max_acquisitions", "Acquisition budget", settings["max_acquisitions"], "1"),
        ("retry_base", "Backoff: first delay, seconds", retry["base"], "any"),
        ("retry_cap", "Backoff: longest delay, seconds", retry["cap"], "any"),
    ]


@router.get("/queues/{queue}/settings")
async def settings_page(request: Request, tenant: str, queue: str) -> Response:
    """The queue's settings: each effective value and its source, and the form that sets them."""
    session = await web.current_session(request)
    if not NAME_RE.match(queue):
        raise errors.InvalidRequestError("The queue name is not valid.")
    services = web.services(request)
    answer = await services.queue_settings.get(session.principal, tenant, queue)
    settings = web.answer_body(answer)
    detail = web.answer_body(await services.queues.get_queue(session.principal, tenant, queue))
    return web.render(
        request,
        "queue_settings.html",
        session,
        tenant=tenant,
        queue=queue,
        settings=settings,
        fields=_settings_fields(settings),
        events=[{**e, "what": views.queue_event_text(e)} for e in detail["events"]],
    )


def _number(form: Any, name: str) -> float | int | str | None:
    text = web.form_text(form, name)
    if not text:
        return None
    try:
        number = float(text)
    except ValueError:
        return text  # refused by the body's validation, naming the field
    whole = name in ("max_acquisitions", "rate_limit")
    return int(number) if whole and number.is_integer() else number


@router.post("/queues/{queue}/settings")
async def save_settings(request: Request, tenant: str, queue: str) -> Response:
    """Replace the queue's settings through `PUT .../queues/{queue}/settings`'s service call."""
    session = await web.current_session(request)
    form = await web.check_form(request, session)
    if not NAME_RE.match(queue):
        raise errors.InvalidRequestError("The queue name is not valid.")
    body = web.body_of(
        schemas.QueueSettingsIn,
        lease_ttl=_number(form, "lease_ttl"),
        deadline=_number(form, "deadline"),
        max_acquisitions=_number(form, "max_acquisitions"),
        retry={
            "base": _number(form, "retry_base"),
            "cap": _number(form, "retry_cap"),
            "jitter": True if web.form_text(form, "retry_jitter") == "on" else None,
        },
        ordering_dead_letters="hold" if web.form_text(form, "ordering_hold") == "on" else None,
        fairness="partition_key" if web.form_text(form, "fair") == "on" else None,
        rate_limit=(
            {
                "limit": _number(form, "rate_limit"),
                "per": _number(form, "rate_per"),
                "partitioned": web.form_text(form, "rate_partitioned") == "on",
            }
            if web.form_text(form, "rate_limit")
            else None
        ),
    )
    rest_path = f"/v1/tenants/{tenant}/queues/{queue}/settings"
    idem = web.idempotency_for(
        session.principal.key_id, form, rest_path=rest_path, body=body.model_dump(mode="json")
    )
    answer = await web.services(request).queue_settings.put(
        session.principal, tenant, queue, body.given(), idem, instance=rest_path
    )
    target = web.tenant_path(tenant, "queues", queue, "settings")
    if answer.problem:
        return web.redirect(request, target, web.problem_text(answer), "error")
    return web.redirect(request, target, f"Saved the settings of {queue}.")


@router.post("/queues/{queue}/{action}")
async def change(
    request: Request, tenant: str, queue: str, action: Literal["pause", "resume"]
) -> Response:
    """Pause or resume through `POST .../queues/{queue}/{action}`'s service call."""
    session = await web.current_session(request)
    form = await web.check_form(request, session)
    body = web.body_of(schemas.PauseIn, reason=web.form_text(form, "reason"))
    rest_path = f"/v1/tenants/{tenant}/queues/{queue}/{action}"
    idem = web.idempotency_for(
        session.principal.key_id, form, rest_path=rest_path, body=body.model_dump(mode="json")
    )
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
