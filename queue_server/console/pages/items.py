"""Items: search (queue, state, created between, payload containment; pages, newest first or
sorted by a column), one item with its payload, result, last failure and its ledger as a
timeline; cancel, retry or delete of a selection, and retry or delete of every matching
item, each after a confirmation page."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from starlette.datastructures import FormData
from starlette.responses import Response

from queue_server import errors
from queue_server.api import schemas
from queue_server.console import charts, web
from queue_server.models import NAME_RE, ItemState, check_utc_offset, is_uuid
from queue_server.services.items import DELETABLE, RETRYABLE, SORTS, BulkPage, ItemFilter

router = APIRouter(
    prefix=f"{web.PREFIX}/tenants/{{tenant}}", route_class=web.ConsoleRoute, include_in_schema=False
)
NAV_ENTRY = web.NavEntry("items", "Items")

PAGE_SIZE = 50
MAX_SELECTION = 100
CANCELLABLE = ("waiting", "ready", "leased")
# One item, from its own page: a quarantined one too (its open dead letter closes with it).
ITEM_CANCELLABLE = (*CANCELLABLE, "quarantined")
STATES = tuple(s.value for s in ItemState)
BULK_STATES = frozenset((*RETRYABLE, *DELETABLE))
BULK_PAGE = 100  # items per request of a bulk retry or delete
FILTER_FIELDS = ("queue", "state", "created_after", "created_before", "payload")
DONE = {"retry": "retried", "delete": "deleted"}
# The list's order: newest first unless a column heading chose another.
DEFAULT_SORT = "-created"
# The columns a reader sorts by: the column's label and its key in GET /items's `sort`.
SORTABLE = {"created": "Created", "priority": "Priority", "attempts": "Tries"}
# The filter form's order control (the same orders as the column headings).
SORT_CHOICES = (
    ("-created", "newest first"),
    ("created", "oldest first"),
    ("-priority", "highest priority first"),
    ("priority", "lowest priority first"),
    ("-attempts", "most tries first"),
    ("attempts", "fewest tries first"),
)


def _instant(name: str, value: str | None) -> datetime | None:
    """A `datetime-local` field (no zone: UTC) or an RFC 3339 time; 422 page otherwise."""
    if not value:
        return None
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise errors.InvalidRequestError(f"{name} is not a date and time.") from None
    try:
        return check_utc_offset(at) if at.tzinfo else at.replace(tzinfo=UTC)
    except ValueError as exc:
        raise errors.InvalidRequestError(f"{name} {exc}.") from None


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
    sort: Annotated[str | None, Query(max_length=32)] = None,
) -> Response:
    session = await web.current_session(request)
    filters = {
        "queue": queue or "",
        "state": state or "",
        "created_after": created_after or "",
        "created_before": created_before or "",
        "payload": payload or "",
    }
    order = sort if sort in SORTS else DEFAULT_SORT
    page: dict[str, Any] = {"items": [], "next_cursor": None}
    problem = None
    bulk: dict[str, Any] | None = None
    try:
        if sort and sort not in SORTS:
            raise errors.InvalidRequestError(f"Sort must be one of: {', '.join(SORTS)}.")
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
                session.principal,
                tenant,
                filter=match,
                limit=PAGE_SIZE,
                cursor=cursor,
                sort=order,
            )
        )
        if state in BULK_STATES:
            count = await web.services(request).items.count_items(session.principal, tenant, match)
            bulk = {"count": count, "retry": state in RETRYABLE, "delete": state in DELETABLE}
    except errors.InvalidRequestError as exc:
        # Said above the form, which keeps every filter as typed: one wrong field is
        # corrected in place, not typed again with all the others.
        problem = exc.detail
    # The order the page was drawn in is kept by its pager; the default is left out of links.
    kept = None if order == DEFAULT_SORT else order
    next_url = None
    if page["next_cursor"]:
        next_url = web.tenant_path(
            tenant, "items", **filters, sort=kept, cursor=page["next_cursor"]
        )
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
        bulk=bulk,
        states=STATES,
        next_url=next_url,
        sort=order,
        sort_kept=kept,
        sort_choices=SORT_CHOICES,
        columns=_sort_columns(tenant, filters, order),
    )


def _sort_columns(tenant: str, filters: dict[str, str], order: str) -> dict[str, dict[str, Any]]:
    """Each sortable column's heading: its link (the filters kept, the first page), whether
    the list is sorted by it and which way (`aria-sort`). A column sorts descending first;
    clicking the column the list is sorted by turns its direction."""
    columns = {}
    for key, label in SORTABLE.items():
        current = order.lstrip("-") == key
        descending = order.startswith("-")
        target = key if current and descending else f"-{key}"
        columns[key] = {
            "label": label,
            "href": web.tenant_path(
                tenant, "items", **filters, sort=None if target == DEFAULT_SORT else target
            ),
            "aria_sort": ("descending" if descending else "ascending") if current else None,
            "arrow": ("▼" if descending else "▲") if current else "",
        }
    return columns


def _bulk_filter(form: FormData) -> tuple[str, ItemFilter, dict[str, str]]:
    """A bulk action's form: the action, its filter as the services take it, and the
    filter's fields as typed (carried to the next page)."""
    action = web.choice("Action", web.form_text(form, "action"), ("retry", "delete"))
    if action is None:
        raise errors.InvalidRequestError("Choose retry or delete.")
    fields = {name: web.form_text(form, name) for name in FILTER_FIELDS}
    allowed = RETRYABLE if action == "retry" else DELETABLE
    if fields["state"] not in allowed:
        raise errors.InvalidRequestError(
            f"Only {' or '.join(allowed)} items can be {DONE[action]}: filter on one of them."
        )
    if fields["queue"] and not NAME_RE.match(fields["queue"]):
        raise errors.InvalidRequestError("The queue name is not valid.")
    match = ItemFilter(
        queue=fields["queue"] or None,
        state=fields["state"],
        created_after=_instant("Created after", fields["created_after"]),
        created_before=_instant("Created before", fields["created_before"]),
        payload=fields["payload"] or None,
    )
    return action, match, fields


@router.post("/items/bulk/confirm")
async def confirm_bulk(request: Request, tenant: str) -> Response:
    """How many items a retry or delete of every matching item covers, and what it does."""
    session = await web.current_session(request)
    form = await web.check_form(request, session)
    action, match, fields = _bulk_filter(form)
    count = await web.services(request).items.count_items(session.principal, tenant, match)
    return web.render(
        request,
        "items_bulk_confirm.html",
        session,
        tenant=tenant,
        action=action,
        count=count,
        filters=fields,
        next=web.back(request, form, web.tenant_path(tenant, "items")),
    )


@router.post("/items/bulk")
async def bulk(request: Request, tenant: str) -> Response:
    """Retry or delete every matching item through `POST .../items:retry` or `:delete`'s
    service call, a page at a time, each page under its own idempotency key derived from
    the confirmation page's (a resubmitted form replays). A retry stops at the cap."""
    session = await web.current_session(request)
    form = await web.check_form(request, session)
    action, match, fields = _bulk_filter(form)
    items = web.services(request).items
    rest_path = f"/v1/tenants/{tenant}/items:{action}"
    run = items.retry_many if action == "retry" else items.delete_many
    done, cursor, number, stopped = 0, None, 0, ""
    while True:
        body = {"filter": {k: v for k, v in fields.items() if v}, "limit": BULK_PAGE}
        idem = web.idempotency_for(
            session.principal.key_id,
            form,
            rest_path=rest_path,
            body={**body, "cursor": cursor},
            suffix=f"page-{number}",
        )
        answer = await run(
            session.principal, tenant, idem, BulkPage(rest_path, match, BULK_PAGE, cursor)
        )
        if answer.problem:
            stopped = web.problem_text(answer)
            break
        page = web.answer_body(answer)
        done += page["retried" if action == "retry" else "deleted"]
        cursor = page["next_cursor"]
        if page.get("over_cap"):
            stopped = (
                f"the backlog is at its cap of {page['backlog_cap']:,}; the rest are as they were"
            )
            break
        if cursor is None:
            break
        number += 1
    text = f"{DONE[action].capitalize()} {done:,} item{'s' if done != 1 else ''}."
    if stopped:
        text += f" Stopped: {stopped}."
    target = web.back(request, form, web.tenant_path(tenant, "items"))
    return web.redirect(request, target, text, "error" if stopped else "ok")


def _selection_action(form: FormData) -> str:
    action = web.choice("Action", web.form_text(form, "action"), ("retry", "delete"))
    if action is None:
        raise errors.InvalidRequestError("Choose retry or delete.")
    return action


async def _selected_items(
    request: Request, session: web.Session, tenant: str, chosen: list[str]
) -> list[dict[str, Any]]:
    """The selected items as they are now (one gone since the list was drawn is left out)."""
    items = web.services(request).items
    rows = []
    for item_id in chosen:
        try:
            rows.append(web.answer_body(await items.get_item(session.principal, tenant, item_id)))
        except errors.ItemNotFoundError:
            continue
    return rows


@router.post("/items/selection/confirm")
async def confirm_selection(request: Request, tenant: str) -> Response:
    """Which of the selected items a retry or delete covers (and which it leaves)."""
    session = await web.current_session(request)
    form = await web.check_form(request, session)
    action = _selection_action(form)
    chosen = _selection([str(v) for v in form.getlist("item_id")])
    allowed = RETRYABLE if action == "retry" else DELETABLE
    rows = await _selected_items(request, session, tenant, chosen)
    return web.render(
        request,
        "items_selection_confirm.html",
        session,
        tenant=tenant,
        action=action,
        allowed=allowed,
        covered=[r for r in rows if r["state"] in allowed],
        left=[r for r in rows if r["state"] not in allowed],
        next=web.back(request, form, web.tenant_path(tenant, "items")),
    )


def _confirmed(form: FormData, allowed: tuple[str, ...]) -> dict[str, list[str]]:
    """The confirmation page's selection, `state:item_id` each, by state: the states the
    page was drawn with, so a resubmitted form sends the same requests (and replays)."""
    by_state: dict[str, list[str]] = {}
    for value in dict.fromkeys(str(v) for v in form.getlist("selected")):
        state, _, item_id = value.partition(":")
        if state not in allowed or not is_uuid(item_id):
            raise errors.InvalidRequestError("The selection is not one this console drew.")
        by_state.setdefault(state, []).append(item_id)
    count = sum(len(ids) for ids in by_state.values())
    if not count:
        raise errors.InvalidRequestError("Select at least one item.")
    if count > MAX_SELECTION:
        raise errors.InvalidRequestError(f"Select at most {MAX_SELECTION} items at once.")
    return by_state


@router.post("/items/selection")
async def act_on_selection(request: Request, tenant: str) -> Response:
    """Retry or delete the confirmed items through `POST .../items:retry` or `:delete`'s
    service call with `item_ids`, one call per state among them, each under its own
    idempotency key derived from the confirmation page's (a resubmitted form replays); an
    item no longer in the state it was confirmed in is left as it is. A retry stops at the
    backlog cap."""
    session = await web.current_session(request)
    form = await web.check_form(request, session)
    action = _selection_action(form)
    allowed = RETRYABLE if action == "retry" else DELETABLE
    by_state = _confirmed(form, allowed)
    items = web.services(request).items
    run = items.retry_many if action == "retry" else items.delete_many
    rest_path = f"/v1/tenants/{tenant}/items:{action}"
    done, stopped = 0, ""
    for state, ids in sorted(by_state.items()):
        body = {"filter": {"state": state, "item_ids": ids}, "limit": len(ids)}
        answer = await run(
            session.principal,
            tenant,
            web.idempotency_for(
                session.principal.key_id,
                form,
                rest_path=rest_path,
                body=body,
                suffix=f"selected-{state}",
            ),
            BulkPage(rest_path, ItemFilter(state=state, item_ids=tuple(ids)), len(ids)),
        )
        if answer.problem:
            stopped = web.problem_text(answer)
            break
        page = web.answer_body(answer)
        done += page["retried" if action == "retry" else "deleted"]
        if page.get("over_cap"):
            stopped = (
                f"the backlog is at its cap of {page['backlog_cap']:,}; the rest are as they were"
            )
            break
    text = f"{DONE[action].capitalize()} {done:,} item{'s' if done != 1 else ''}."
    left = sum(len(ids) for ids in by_state.values()) - done
    if stopped:
        text += f" Stopped: {stopped}."
    elif left:
        text += f" Left {left:,} as {'it was' if left == 1 else 'they were'}: no longer"
        text += f" {' or '.join(allowed)}."
    target = web.back(request, form, web.tenant_path(tenant, "items"))
    return web.redirect(request, target, text, "error" if stopped else "ok")


# The items an item's page lists of those it depends on (the rest: a count and the CLI).
LISTED_DEPENDENCIES = 50


@router.get("/items/{item_id}")
async def show(request: Request, tenant: str, item_id: str) -> Response:
    session = await web.current_session(request)
    items = web.services(request).items
    item = web.answer_body(await items.get_item(session.principal, tenant, item_id))
    ledger = web.answer_body(await items.ledger(session.principal, tenant, item_id))
    # The graph it is part of (what it waits for, what waits for it), drawn when there is
    # one; the first of the items it waits for itself, listed, and how many it depends on in
    # all (a fan-in's callback: up to 10,000) and still waits for.
    graph = web.answer_body(await items.workflow(session.principal, tenant, str(item["item_id"])))
    mine = web.answer_body(
        await items.dependencies(
            session.principal, tenant, str(item["item_id"]), LISTED_DEPENDENCIES, None
        )
    )
    drawn = None
    if len(graph["nodes"]) > 1:
        drawn = charts.workflow_svg(
            graph["nodes"], str(item["item_id"]), web.tenant_path(tenant, "items", "{id}")
        )
    dead_letter = None
    if item["state"] == "quarantined":
        dead_letter = await web.services(request).dead_letters.open_dead_letter_of_item(
            session.principal, tenant, str(item["item_id"])
        )
    return web.render(
        request,
        "item.html",
        session,
        tenant=tenant,
        item=item,
        events=ledger["events"],
        dependencies=mine["items"],
        dependencies_total=mine["total"],
        waiting_for=mine["waiting_for"],
        workflow=drawn,
        workflow_size=len(graph["nodes"]),
        workflow_complete=graph["complete"],
        # What an operator may do with it from here, each through its confirmation page.
        cancellable=item["state"] in ITEM_CANCELLABLE,
        retryable=item["state"] in RETRYABLE,
        deletable=item["state"] in DELETABLE,
        dead_letter=dead_letter,
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
    body = web.body_of(
        schemas.CancelIn,
        reason=web.form_text(form, "reason"),
        descendants=form.get("descendants") == "1",
    )
    items = web.services(request).items
    done: list[str] = []
    refused: list[str] = []
    for item_id in chosen:
        rest_path = f"/v1/tenants/{tenant}/items/{item_id}/cancel"
        idem = web.idempotency_for(
            session.principal.key_id,
            form,
            rest_path=rest_path,
            body=body.model_dump(mode="json"),
            suffix=item_id,
        )
        answer = await items.cancel(
            session.principal,
            tenant,
            item_id,
            idem,
            instance=rest_path,
            reason=body.reason,
            descendants=body.descendants,
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
