"""Dead letters: list (queue, kind, status filters; pages), one with its item and ledger, and
replay or discard of one or a selection after a confirmation page."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from queue_server import errors
from queue_server.api.dead_letters import BulkReplayIn, DiscardIn, ReplayIn
from queue_server.console import web
from queue_server.models import NAME_RE, is_uuid

router = APIRouter(
    prefix=f"{web.PREFIX}/tenants/{{tenant}}", route_class=web.ConsoleRoute, include_in_schema=False
)
NAV_ENTRY = web.NavEntry("dead-letters", "Dead letters")

PAGE_SIZE = 50
MAX_SELECTION = 100
ACTIONS = {"replay": "Replay", "discard": "Discard"}


@router.get("/dead-letters")
async def list_page(
    request: Request,
    tenant: str,
    queue: Annotated[str | None, Query(max_length=64)] = None,
    kind: Annotated[str | None, Query(max_length=16)] = None,
    status: Annotated[str | None, Query(max_length=16)] = None,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
) -> Response:
    session = await web.current_session(request)
    if queue and not NAME_RE.match(queue):
        raise errors.InvalidRequestError("The queue name is not valid.")
    queue = queue or None
    kind = web.choice("Kind", kind, ("item", "delivery"))
    status = web.choice("Status", status, ("open", "closed", "all")) or "open"
    answer = await web.services(request).dead_letters.list_dead_letters(
        session.principal,
        tenant,
        queue=queue,
        kind=kind,
        status=status,
        limit=PAGE_SIZE,
        cursor=cursor,
    )
    page = web.answer_body(answer)
    next_url = None
    if page["next_cursor"]:
        next_url = web.tenant_path(
            tenant,
            "dead-letters",
            queue=queue,
            kind=kind,
            status=status,
            cursor=page["next_cursor"],
        )
    return web.render(
        request,
        "dead_letters.html",
        session,
        tenant=tenant,
        dead_letters=page["dead_letters"],
        filters={"queue": queue or "", "kind": kind or "", "status": status},
        next_url=next_url,
    )


@router.get("/dead-letters/{dead_letter_id}")
async def show(request: Request, tenant: str, dead_letter_id: str) -> Response:
    session = await web.current_session(request)
    answer = await web.services(request).dead_letters.show_dead_letter(
        session.principal, tenant, dead_letter_id
    )
    detail = web.answer_body(answer)
    return web.render(request, "dead_letter.html", session, tenant=tenant, **detail)


def _selection(values: list[str]) -> list[str]:
    chosen = list(dict.fromkeys(v for v in values if isinstance(v, str) and is_uuid(v)))
    if not chosen:
        raise errors.InvalidRequestError("Select at least one dead letter.")
    if len(chosen) > MAX_SELECTION:
        raise errors.InvalidRequestError(f"Select at most {MAX_SELECTION} dead letters at once.")
    return chosen


@router.post("/dead-letters/confirm")
async def confirm(request: Request, tenant: str) -> Response:
    """The confirmation page of a replay or discard: what will happen to which dead letters."""
    session = await web.current_session(request)
    form = await web.check_form(request, session)
    action = web.form_text(form, "action")
    if action not in ACTIONS:
        raise errors.InvalidRequestError("Choose replay or discard.")
    chosen = _selection([str(v) for v in form.getlist("dead_letter_id")])
    operators = web.services(request).dead_letters
    rows = []
    for dead_letter_id in chosen:
        detail = web.answer_body(
            await operators.show_dead_letter(session.principal, tenant, dead_letter_id)
        )
        rows.append(detail["dead_letter"])
    return web.render(
        request,
        "dead_letters_confirm.html",
        session,
        tenant=tenant,
        action=action,
        action_label=ACTIONS[action],
        dead_letters=rows,
        next=web.back(request, form, web.tenant_path(tenant, "dead-letters")),
    )


@router.post("/queues/{queue}/dead-letters/replay")
async def replay_queue(request: Request, tenant: str, queue: str) -> Response:
    """Replay the queue's oldest open item dead letters (at most 100 a time), as
    `POST .../queues/{queue}/dead-letters:replay` does it."""
    session = await web.current_session(request)
    form = await web.check_form(request, session)
    body = BulkReplayIn()
    rest_path = f"/v1/tenants/{tenant}/queues/{queue}/dead-letters:replay"
    idem = web.idempotency_for(
        session.principal.key_id, form, rest_path=rest_path, body=body.model_dump(mode="json")
    )
    target = web.back(request, form, web.tenant_path(tenant, "dead-letters", queue=queue))
    try:
        answer = await web.services(request).dead_letters.replay_queue(
            session.principal,
            tenant,
            queue,
            idem,
            instance=rest_path,
            limit=body.limit,
            max_acquisitions=body.max_acquisitions,
        )
    except errors.BacklogCapReachedError as exc:
        return web.redirect(request, target, f"Nothing replayed: {exc.detail}", "error")
    if answer.problem:
        return web.redirect(request, target, web.problem_text(answer), "error")
    done = web.answer_body(answer)
    text = f"Replayed {done['replayed']} of {queue}'s dead letters"
    text += f", skipped {done['skipped']}; {done['remaining']} still open."
    if done["over_cap"]:
        text += f" {done['over_cap']} did not fit: the tenant's backlog cap is reached."
        return web.redirect(request, target, text, "error")
    return web.redirect(request, target, text)


@router.post("/dead-letters/{action}")
async def act(request: Request, tenant: str, action: Literal["replay", "discard"]) -> Response:
    """Replay or discard each selected dead letter through the REST route's service call,
    each with its own idempotency key derived from the confirmation page's."""
    session = await web.current_session(request)
    form = await web.check_form(request, session)
    chosen = _selection([str(v) for v in form.getlist("dead_letter_id")])
    operators = web.services(request).dead_letters
    done: list[str] = []
    refused: list[str] = []
    for dead_letter_id in chosen:
        rest_path = f"/v1/tenants/{tenant}/dead-letters/{dead_letter_id}/{action}"
        if action == "replay":
            replay_body = ReplayIn()
            idem = web.idempotency_for(
                session.principal.key_id,
                form,
                rest_path=rest_path,
                body=replay_body.model_dump(mode="json"),
                suffix=dead_letter_id,
            )
            try:
                answer = await operators.replay(
                    session.principal,
                    tenant,
                    dead_letter_id,
                    idem,
                    instance=rest_path,
                    max_acquisitions=replay_body.max_acquisitions,
                )
            except errors.BacklogCapReachedError as exc:
                refused.append(f"{dead_letter_id[:8]}… {exc.detail}")
                continue
        else:
            discard_body = web.body_of(DiscardIn, reason=web.form_text(form, "reason"))
            idem = web.idempotency_for(
                session.principal.key_id,
                form,
                rest_path=rest_path,
                body=discard_body.model_dump(mode="json"),
                suffix=dead_letter_id,
            )
            answer = await operators.discard(
                session.principal,
                tenant,
                dead_letter_id,
                idem,
                instance=rest_path,
                reason=discard_body.reason,
            )
        if answer.problem:
            refused.append(f"{dead_letter_id[:8]}… {web.problem_text(answer)}")
        else:
            done.append(dead_letter_id)
    verb = "Replayed" if action == "replay" else "Discarded"
    text = f"{verb} {len(done)} dead letter{'s' if len(done) != 1 else ''}."
    if refused:
        text += f" Refused {len(refused)}: " + "; ".join(refused)
    target = web.back(request, form, web.tenant_path(tenant, "dead-letters"))
    return web.redirect(request, target, text, "error" if refused else "ok")
