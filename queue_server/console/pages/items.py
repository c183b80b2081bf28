"""Items: search (queue, state, created between, payload containment; pages), one item with
its payload, result, last failure and its ledger as a timeline, and cancel of one or a
selection after a confirmation page."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from queue_server import errors
from queue_server.api import schemas
from queue_server.console import web
from queue_server.models import NAME_RE, ItemState, is_uuid
from queue_server.services.items import ItemFilter

router = APIRouter(prefix=f"{web.PREFIX}/tenants/{{tenant}}", route_class=web.ConsoleRoute)
NAV_ENTRY = web.NavEntry("items", "Items")

PAGE_SIZE = 50
MAX_SELECTION = 100
CANCELLABLE = ("ready", "leased")
STATES = tuple(s.value for s in ItemState)


def _instant(name: str, value: str | None) -> datetime | None:
    """A `datetime-local` field (no zone: UTC) or an RFC 3339 time; 422 page otherwise."""
    if not value:
        return None
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise errors.InvalidRequestError(f"{name} is not a date and time.") from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


@router.get("/items")
async def list_page(
    request: Request,
    tenant: str,
    queue: Annotated[str | None, Query(max_length=64)] = None,
    state: Annotated[str | None, Query(max_length=32)] = None,
    created_after: Annotated[str | None, Query(max_length=64)] = None,
    created_before: Annotated[str | None, Query(max_length=64)] = None,
    payload: Annotated[str | None, Query(max_length=4096)] = None,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
) -> Response:
    session = await web.current_session(request)
    filters = {
        "queue": queue or "",
        "state": state or "",
        "created_after": created_after or "",
        "created_before": created_before or "",
        "payload": payload or "",
    }
    page: dict[str, Any] = {"items": [], "next_cursor": None}
    problem = None
    try:
        if queue and not NAME_RE.match(queue):
            raise errors.InvalidRequestError("The queue name is not valid.")
        match = ItemFilter(
            queue=queue or None,
            state=web.choice("State", state, STATES),
            created_after=_instant("Created after", created_after),
            created_before=_instant("Created before", created_before),
            payload=payload or None,
        )
        page = web.answer_body(
            await web.services(request).items.list_items(
                session.principal, tenant, filter=match, limit=PAGE_SIZE, cursor=cursor
            )
        )
    except errors.InvalidRequestError as exc:
        # Said above the form, which keeps every filter as typed: one wrong field is
        # corrected in place, not typed again with all the others.
        problem = exc.detail
    next_url = None
    if page["next_cursor"]:
        next_url = web.tenant_path(tenant, "items", **filters, cursor=page["next_cursor"])
    return web.render(
        request,
        "items.html",
        session,
        status_code=422 if problem else 200,
        tenant=tenant,
        items=page["items"],
        filters=filters,
        filtered=any(filters.values()),
        problem=problem,
        states=STATES,
        next_url=next_url,
    )


@router.get("/items/{item_id}")
async def show(request: Request, tenant: str, item_id: str) -> Response:
    session = await web.current_session(request)
    items = web.services(request).items
    item = web.answer_body(await items.get_item(session.principal, tenant, item_id))
    ledger = web.answer_body(await items.ledger(session.principal, tenant, item_id))
    return web.render(
        request,
        "item.html",
        session,
        tenant=tenant,
        item=item,
        events=ledger["events"],
        cancellable=True,
    )


def _selection(values: list[str]) -> list[str]:
    chosen = list(dict.fromkeys(v for v in values if is_uuid(v)))
    if not chosen:
        raise errors.InvalidRequestError("Select at least one item.")
    if len(chosen) > MAX_SELECTION:
        raise errors.InvalidRequestError(f"Select at most {MAX_SELECTION} items at once.")
    return chosen


@router.post("/items/cancel/confirm")
async def confirm_cancel(request: Request, tenant: str) -> Response:
    """What cancelling the selected items will do, with a field for the reason."""
    session = await web.current_session(request)
    form = await web.check_form(request, session)
    chosen = _selection([str(v) for v in form.getlist("item_id")])
    items = web.services(request).items
    rows = [
        web.answer_body(await items.get_item(session.principal, tenant, item_id))
        for item_id in chosen
    ]
    return web.render(
        request,
        "items_cancel_confirm.html",
        session,
        tenant=tenant,
        items=rows,
        next=web.back(request, form, web.tenant_path(tenant, "items")),
    )


@router.post("/items/cancel")
async def cancel(request: Request, tenant: str) -> Response:
    """Cancel each selected item through `POST .../items/{id}/cancel`'s service call, each
    with its own idempotency key derived from the confirmation page's."""
    session = await web.current_session(request)
    form = await web.check_form(request, session)
    chosen = _selection([str(v) for v in form.getlist("item_id")])
    body = web.body_of(schemas.CancelIn, reason=web.form_text(form, "reason"))
    items = web.services(request).items
    done: list[str] = []
    refused: list[str] = []
    for item_id in chosen:
        rest_path = f"/v1/tenants/{tenant}/items/{item_id}/cancel"
        idem = web.idempotency_for(
            form, rest_path=rest_path, body=body.model_dump(mode="json"), suffix=item_id
        )
        answer = await items.cancel(
            session.principal, tenant, item_id, idem, instance=rest_path, reason=body.reason
        )
        if answer.problem:
            refused.append(f"{item_id[:8]}… {web.problem_text(answer)}")
        else:
            done.append(item_id)
    text = f"Cancelled {len(done)} item{'s' if len(done) != 1 else ''}."
    if refused:
        text += f" Refused {len(refused)}: " + "; ".join(refused)
    target = web.back(request, form, web.tenant_path(tenant, "items"))
    return web.redirect(request, target, text, "error" if refused else "ok")
