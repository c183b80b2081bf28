"""`queue-server items`: list and filter items, one item as it is now, its ledger; cancel,
retry and delete them."""

from __future__ import annotations

import json as jsonlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

import typer

from queue_server.cli.common import (
    CLI,
    EXIT_REFUSED,
    DataDir,
    Json,
    Key,
    Quiet,
    Tenant,
    Url,
    Wide,
    confirm,
    counted,
    err_console,
    fail,
    fields,
    ids,
    print_json,
    table,
    tenant_session,
)
from queue_server.client import QueueClient
from queue_server.client.errors import BacklogCapReachedError
from queue_server.client.models import DeletedItems, Item, LedgerEvent, RetriedItems
from queue_server.models import is_uuid

app = CLI(help="List, inspect, cancel, retry and delete work items.", no_args_is_help=True)

# The orders of `items list` (GET .../items?sort=).
SORTS = ("created", "-created", "priority", "-priority", "attempts", "-attempts")

# No short flag: -q is --quiet, as in every command that prints ids.
Queue = Annotated[str | None, typer.Option("--queue", help="Only this queue.")]
State = Annotated[
    str | None,
    typer.Option(
        help="Only this state: waiting, ready, leased, completed, quarantined or cancelled."
    ),
]
# A time with its offset, as items show theirs (e.g. 2026-12-01T09:00:00+00:00).
TIMES = ["%Y-%m-%dT%H:%M:%S%z", "%Y-%m-%dT%H:%M:%S.%f%z"]
After = Annotated[
    datetime | None,
    typer.Option(
        "--created-after",
        formats=TIMES,
        help="Only items created after this time, e.g. 2026-12-01T09:00:00+00:00.",
    ),
]
Before = Annotated[
    datetime | None,
    typer.Option("--created-before", formats=TIMES, help="Only items created before this time."),
]
# A selection for retry and delete: only these items, each still matching the filter.
Selected = Annotated[
    list[str] | None,
    typer.Argument(
        help="Only these items (ids, or the start or end of exactly one's each); each must"
        " still match the filter. None: every matching item."
    ),
]
Payload = Annotated[
    str | None,
    typer.Option(help="Only items whose payload contains this JSON, e.g. '{\"customer\": 42}'."),
]
Reason = Annotated[str, typer.Option(help="Why: kept in each item's ledger.")]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]


def _filters(
    queue: str | None,
    state: str | None,
    created_after: datetime | None,
    created_before: datetime | None,
    payload: str | None,
) -> dict[str, Any]:
    chosen: dict[str, Any] = {
        "queue": queue,
        "state": state,
        "created_after": created_after,
        "created_before": created_before,
    }
    if payload is not None:
        try:
            chosen["payload"] = jsonlib.loads(payload)
        except ValueError:
            fail("Invalid --payload", "it must be JSON, e.g. '{\"customer\": 42}'")
    return chosen


def item_fields(item: Item) -> None:
    """An item as a table of its fields (also under a dead letter)."""
    fields(
        f"item {item.item_id}",
        [
            ("queue", item.queue),
            ("state", item.state),
            ("fence", item.fence),
            ("acquisitions", f"{item.acquisition_count} of {item.max_acquisitions}"),
            ("priority", item.priority),
            ("available at", item.available_at),
            ("lease holder", item.lease_holder),
            ("lease expires", item.lease_expires_at),
            ("payload", item.payload),
            ("result", item.result),
            ("last failure", item.last_failure),
            ("created", item.created_at),
            ("updated", item.updated_at),
        ],
    )


def ledger_table(item_id: str, events: list[LedgerEvent]) -> None:
    """An item's ledger, one row per transition."""
    table(
        f"ledger of {item_id}",
        ["seq", "at", "kind", "fence", "actor", "data"],
        [(e.seq, e.at, e.kind, e.fence, _actor(e), e.data) for e in events],
    )


def _actor(event: LedgerEvent) -> str:
    """Who acted: `key:<id>`, with the key's name before it when it has one."""
    return f"{event.actor_name} ({event.actor})" if event.actor_name else event.actor


def item_of(qs: QueueClient, given: str) -> str:
    """The whole id of the item `given` names: the server resolves a unique start or end
    of an id (as `items show` does), so an action never runs on a guess."""
    return given if is_uuid(given) else qs.get_item(given).item_id


def _selected(qs: QueueClient, given: list[str] | None) -> list[str] | None:
    """The whole ids of the items given (at most 1,000), or None: every matching item."""
    if not given:
        return None
    if len(given) > 1000:
        fail("Too many items", "give at most 1,000 ids at once, or a filter")
    return list(dict.fromkeys(item_of(qs, one) for one in given))


@app.command("show")
def items_show(
    item_id: Annotated[str, typer.Argument(help="Item id, or the start or end of exactly one's.")],
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Show one item as it is now.

    Example: [bold]queue-server items show 0190f3c2-...[/bold]
    """
    with tenant_session(url, key, data_dir, tenant) as qs:
        item = qs.get_item(item_id)
    if json:
        print_json(item)
    else:
        item_fields(item)


@app.command("workflow")
def items_workflow(
    item_id: Annotated[str, typer.Argument(help="Item id, or the start or end of exactly one's.")],
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """The graph of dependencies an item is part of: what it waits for, directly or not, what
    waits for it, and itself, each with its state, in the order they can run.

    Example: [bold]queue-server items workflow 0190f3c2-...[/bold]
    """
    with tenant_session(url, key, data_dir, tenant) as qs:
        graph = qs.get_workflow(item_of(qs, item_id))
    if json:
        print_json(graph)
        return
    # Each after every item it depends on: by the longest chain of dependencies before it.
    deps = {n.item_id: n.depends_on for n in graph.nodes}
    depth: dict[str, int] = {}

    def step(node: str) -> int:
        if node not in depth:
            depth[node] = 1 + max((step(d) for d in deps.get(node, [])), default=-1)
        return depth[node]

    ordered = sorted(graph.nodes, key=lambda n: (step(n.item_id), n.item_id))
    table(
        f"{len(graph.nodes)} items" + ("" if graph.complete else " (the first 200)"),
        ["step", "item", "queue", "state", "waits for"],
        [
            (str(step(n.item_id) + 1), n.item_id, n.queue, n.state, str(len(n.depends_on)))
            for n in ordered
        ],
    )


@app.command("dependencies")
def items_dependencies(
    item_id: Annotated[str, typer.Argument(help="Item id, or the start or end of exactly one's.")],
    state: State = None,
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
    wide: Wide = False,
    quiet: Quiet = False,
) -> None:
    """The items an item waits for (a fan-in's callback: every item of its batches), each as
    it is now, with its result or last failure; first, how many are in each state.

    Reads them all, 500 a time (a fan-in names up to 10,000), saying how many so far.
    --state shows only those in that state (e.g. [bold]--state quarantined[/bold]: the ones
    that failed for good).

    Example: [bold]queue-server items dependencies 0190f3c2-... --state quarantined[/bold]
    """
    found: list[Item] = []
    with tenant_session(url, key, data_dir, tenant) as qs:
        callback = item_of(qs, item_id)
        cursor: str | None = None
        while True:
            page = qs.list_dependencies(callback, limit=500, cursor=cursor)
            found += page.items
            waiting_for = page.waiting_for
            cursor = page.next_cursor
            if cursor is None:
                break
            if not (json or quiet):
                err_console.print(f"read {len(found):,} dependencies...")
    shown = [i for i in found if state is None or i.state == state]
    if json:
        print_json(shown)
        return
    if quiet:
        ids([i.item_id for i in shown])
        return
    states: dict[str, int] = {}
    for one in found:
        states[one.state] = states.get(one.state, 0) + 1
    tally = ", ".join(f"{n:,} {name}" for name, n in sorted(states.items()))
    title = f"{len(found):,} " + ("dependency" if len(found) == 1 else "dependencies")
    waits = f"; it waits for {waiting_for:,} of them" if waiting_for else ""
    table(
        f"{title}: {tally or 'none'}{waits}" + (f" (shown: {state})" if state else ""),
        ["item", "queue", "state", "result or last failure"],
        [
            (i.item_id, i.queue, i.state, i.result if i.state == "completed" else i.last_failure)
            for i in shown
        ],
        drop=["result or last failure"],
        wide=wide,
    )


@app.command("ledger")
def items_ledger(
    item_id: Annotated[str, typer.Argument(help="Item id, or the start or end of exactly one's.")],
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Every transition of an item, in order.

    Example: [bold]queue-server items ledger 0190f3c2-... --json[/bold]
    """
    with tenant_session(url, key, data_dir, tenant) as qs:
        events = qs.ledger(item_id)
    if json:
        print_json(events)
    else:
        ledger_table(item_id, events)


@app.command("list")
def items_list(
    queue: Queue = None,
    state: State = None,
    created_after: After = None,
    created_before: Before = None,
    payload: Payload = None,
    limit: Annotated[int, typer.Option(help="At most this many (0: all).")] = 50,
    sort: Annotated[
        str,
        typer.Option(
            help="The order: created, priority or attempts, each then by creation; a"
            " leading - descends. Default -created: newest first."
        ),
    ] = "-created",
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
    quiet: Quiet = False,
    wide: Wide = False,
) -> None:
    """Items, newest first (or in --sort's order), filtered (an operator or admin key).

    Example: [bold]queue-server items list --queue emails --state ready --payload '{"customer": 42}'[/bold]
    Example: [bold]queue-server items list --state quarantined --sort -attempts[/bold]
    """
    if sort not in SORTS:
        fail("Invalid --sort", f"use one of {', '.join(SORTS)}")
    chosen = _filters(queue, state, created_after, created_before, payload)
    rows: list[Item] = []
    with tenant_session(url, key, data_dir, tenant) as qs:
        pages = qs.iter_items(page_size=min(limit, 500) if limit else 500, sort=sort, **chosen)
        for item in pages:
            rows.append(item)
            if limit and len(rows) >= limit:
                break
    if json:
        print_json(rows)
        return
    if quiet:
        ids([i.item_id for i in rows])
        return
    table(
        counted(len(rows), "item"),
        ["item", "queue", "state", "priority", "tries", "fence", "payload", "created"],
        [
            (
                i.item_id,
                i.queue,
                i.state,
                i.priority,
                f"{i.acquisition_count}/{i.max_acquisitions}",
                i.fence,
                i.payload,
                i.created_at,
            )
            for i in rows
        ],
        drop=["fence", "priority", "tries", "created", "payload"],
        wide=wide,
    )


@app.command("cancel")
def items_cancel(
    item_ids: Annotated[
        list[str], typer.Argument(help="Item ids, or the start or end of exactly one's each.")
    ],
    reason: Reason = "",
    descendants: Annotated[
        bool,
        typer.Option(
            "--descendants",
            help="Cancel every unfinished item that depends on each too, directly or not"
            " (a workflow stopped as a whole).",
        ),
    ] = False,
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Cancel waiting, ready, leased or quarantined items; a leased item's holder is refused
    from then on.

    Example: [bold]queue-server items cancel 0190f3c2-... --reason "customer asked"[/bold]
    """
    done: list[Item] = []
    with tenant_session(url, key, data_dir, tenant) as qs:
        for item_id in item_ids:
            done.append(
                qs.cancel_item(item_of(qs, item_id), reason=reason, descendants=descendants)
            )
    if json:
        print_json(done)
        return
    table(
        f"{len(done)} cancelled",
        ["item", "queue", "state"],
        [(i.item_id, i.queue, i.state) for i in done],
    )


@app.command("cancel-matching")
def items_cancel_matching(
    queue: Queue = None,
    state: Annotated[
        str | None, typer.Option(help="Only ready, leased or quarantined items.")
    ] = None,
    created_after: After = None,
    created_before: Before = None,
    payload: Payload = None,
    reason: Reason = "",
    batch: Annotated[int, typer.Option(min=1, max=1000, help="Items per request.")] = 100,
    yes: Yes = False,
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Cancel every ready, leased and quarantined item the filter matches, a batch at a time.

    Example: [bold]queue-server items cancel-matching --queue emails --payload '{"batch": 7}' --yes[/bold]
    """
    chosen = _filters(queue, state, created_after, created_before, payload)
    with tenant_session(url, key, data_dir, tenant) as qs:
        confirm(f"Cancel every item of tenant {qs.tenant} matching this filter?", yes)
        total = 0
        cursor: str | None = None
        while True:
            page = qs.cancel_items(**chosen, reason=reason, limit=batch, cursor=cursor)
            total += page.cancelled
            if not json:
                err_console.print(f"cancelled {total} so far")
            cursor = page.next_cursor
            if cursor is None:
                break
    if json:
        print_json({"cancelled": total})
    else:
        typer.echo(f"{counted(total, 'item')} cancelled")


@dataclass(frozen=True)
class _Action:
    """`items retry` or `items delete`: the states each takes and how its pages are asked."""

    verb: str  # as the prompts say it: Retry, Delete
    done: str  # the answer's count of items changed
    states: tuple[str, str]
    ask: Callable[[QueueClient], Callable[..., RetriedItems | DeletedItems]]


_ACTIONS = {
    "retry": _Action("Retry", "retried", ("quarantined", "cancelled"), lambda qs: qs.retry_items),
    "delete": _Action("Delete", "deleted", ("completed", "cancelled"), lambda qs: qs.delete_items),
}
_RETRY_HELP = """Make every quarantined (or cancelled) item the filter matches ready now, its
    acquisition budget whole again, as a replay does: back in the backlog, under its cap,
    a batch at a time. At the cap it stops and says how many are left (exit 4).

    Example: [bold]queue-server items retry --state quarantined --queue emails --yes[/bold]
    Example: [bold]queue-server items retry --state quarantined 0190f3c2-... 9be41d07 --yes[/bold]
    """
_DELETE_HELP = """Delete every completed (or cancelled) item the filter matches, with its ledger, a
    batch at a time; each queue's ledger keeps who deleted which.

    Example: [bold]queue-server items delete --state completed --queue emails --yes[/bold]
    Example: [bold]queue-server items delete --state cancelled 0190f3c2-... --yes[/bold]
    """


@app.command("delete", help=_DELETE_HELP)  # registered second: listed after retry
@app.command("retry", help=_RETRY_HELP)
def items_retry_or_delete(
    ctx: typer.Context,
    state: Annotated[
        str,
        typer.Option(
            help="The items to act on: quarantined or cancelled to retry, completed or"
            " cancelled to delete."
        ),
    ],
    queue: Queue = None,
    created_after: After = None,
    created_before: Before = None,
    payload: Payload = None,
    item_ids: Selected = None,
    batch: Annotated[int, typer.Option(min=1, max=1000, help="Items per request.")] = 100,
    yes: Yes = False,
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """`items retry` and `items delete`, one command under the name it is called by: a
    page of matching items at a time until none is left (or, retrying, the cap is met)."""
    name = str(ctx.info_name)
    action = _ACTIONS[name]
    if state not in action.states:
        fail("Invalid --state", f"{name} takes {' or '.join(action.states)} items")
    chosen = _filters(queue, state, created_after, created_before, payload)
    with tenant_session(url, key, data_dir, tenant) as qs:
        selected = _selected(qs, item_ids)
        if selected is None:
            confirm(
                f"{action.verb} every {state} item of tenant {qs.tenant} matching this filter?",
                yes,
            )
        else:
            confirm(f"{action.verb} the {counted(len(selected), 'item')} given if {state}?", yes)
        ask = action.ask(qs)
        total, cursor, left = 0, None, 0
        while True:
            try:
                page = ask(**chosen, item_ids=selected, limit=batch, cursor=cursor)
            except BacklogCapReachedError:
                left = -1  # the cap had no room at all for the next batch
                break
            total += getattr(page, action.done)
            if not json:
                err_console.print(f"{action.done} {total} so far")
            cursor = page.next_cursor
            if isinstance(page, RetriedItems) and page.over_cap:
                left = page.over_cap
                break
            if cursor is None:
                break
    if json:
        done: dict[str, Any] = {action.done: total}
        if name == "retry":
            done["stopped_at_the_cap"] = left != 0
        print_json(done)
    else:
        typer.echo(f"{counted(total, 'item')} {action.done}")
    if left:
        fail(
            "The backlog is at its cap",
            "the rest are as they were; run the same command again when there is room",
            code=EXIT_REFUSED,
        )
