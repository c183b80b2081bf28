"""`queue-server dead-letters`: list, show, replay and discard dead letters."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from queue_server.cli.common import (
    CLI,
    CommandError,
    DataDir,
    Json,
    Key,
    Quiet,
    Tenant,
    Url,
    Wide,
    confirm,
    console,
    counted,
    err_console,
    fail,
    failure_text,
    fields,
    ids,
    print_json,
    resolve_id,
    table,
    tenant_session,
)
from queue_server.cli.items import item_fields, ledger_table
from queue_server.client import QueueClient, new_idempotency_key
from queue_server.client.errors import BacklogCapReachedError
from queue_server.client.models import DeadLetter, Item
from queue_server.client.watchers import Delivery, WatcherClient

app = CLI(help="Triage dead letters: list, show, replay, discard.", no_args_is_help=True)


# No short flag: -q is --quiet, as in every command that prints ids.
Queue = Annotated[str | None, typer.Option("--queue", help="Only this queue.")]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]


def _dead_letter_rows(rows: list[DeadLetter]) -> list[tuple[object, ...]]:
    return [
        (
            d.dead_letter_id,
            d.queue,
            d.reason,
            failure_text(d.last_failure),
            d.created_at,
            d.resolution or "open",
        )
        for d in rows
    ]


@app.command("list")
def dead_list(
    queue: Queue = None,
    kind: Annotated[str | None, typer.Option(help="item or delivery.")] = None,
    state: Annotated[str, typer.Option("--status", help="open, closed or all.")] = "open",
    limit: Annotated[int, typer.Option(help="At most this many (0: all).")] = 50,
    everything: Annotated[
        bool, typer.Option("--all", help="Every one that matches, however many (--limit 0).")
    ] = False,
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
    quiet: Quiet = False,
    wide: Wide = False,
) -> None:
    """Dead letters, oldest first: the first 50 unless --limit or --all says otherwise.

    Example: [bold]queue-server dead-letters list --queue emails --all[/bold]
    """
    if kind not in (None, "item", "delivery") or state not in ("open", "closed", "all"):
        fail("Invalid filter", "--kind is item or delivery; --status is open, closed or all")
    if everything:
        limit = 0
    with tenant_session(url, key, data_dir, tenant) as qs:
        rows: list[DeadLetter] = []
        for dead in qs.iter_dead_letters(
            queue=queue,
            kind=kind,  # type: ignore[arg-type]
            status=state,  # type: ignore[arg-type]
            page_size=min(limit, 500) if limit else 500,
        ):
            rows.append(dead)
            if limit and len(rows) >= limit:
                break
    if json:
        print_json(rows)
        return
    if quiet:
        ids([d.dead_letter_id for d in rows])
        return
    table(
        counted(len(rows), "dead letter"),
        ["dead letter", "queue", "reason", "last failure", "created", "status"],
        _dead_letter_rows(rows),
        drop=["status", "created", "reason"],
        wide=wide,
    )


@app.command("show")
def dead_show(
    dead_letter_id: Annotated[
        str, typer.Argument(help="Dead letter id, or a prefix of exactly one.")
    ],
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """A dead letter with its item and the item's whole ledger.

    Example: [bold]queue-server dead-letters show 0190f3c2-...[/bold]
    """
    with tenant_session(url, key, data_dir, tenant) as qs:
        detail = qs.show_dead_letter(dead_letter_of(qs, dead_letter_id))
    if json:
        print_json(detail)
        return
    d = detail.dead_letter
    fields(
        f"dead letter {d.dead_letter_id}",
        [
            ("kind", d.kind),
            ("queue", d.queue),
            ("reason", d.reason),
            ("last failure", failure_text(d.last_failure)),
            ("created", d.created_at),
            ("status", d.resolution or "open"),
        ],
    )
    if detail.item is not None:
        item_fields(detail.item)
        ledger_table(detail.item.item_id, detail.events)


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=err_console,
        transient=True,
    )


def _ids_or_queue(ids: list[str], queue: str | None, everything: bool) -> None:
    if ids and (queue or everything):
        fail("Ambiguous", "name dead letters by id, or use --queue/--all, not both")
    if not ids and not queue and not everything:
        fail("Nothing chosen", "name dead letters by id, or use --queue Q or --all")


def dead_letter_of(qs: QueueClient, given: str) -> str:
    """A dead letter id, or a prefix of exactly one (open ones first, then all)."""

    def candidates(status: str) -> list[str]:
        return [d.dead_letter_id for d in qs.iter_dead_letters(status=status)]  # type: ignore[arg-type]

    try:
        return resolve_id(given, "dead letter", lambda: candidates("open"))
    except CommandError:
        return resolve_id(given, "dead letter", lambda: candidates("all"))


def _collect(qs: QueueClient, queue: str | None) -> list[DeadLetter]:
    return [d for d in qs.iter_dead_letters(queue=queue, kind="item")]


def _replay_one(
    qs: QueueClient, dead_letter_id: str, max_acquisitions: int | None, descendants: bool = False
) -> Item | Delivery:
    """An item dead letter brings its item back; a delivery one resends under the same key."""
    if qs.show_dead_letter(dead_letter_id).dead_letter.kind == "delivery":
        return WatcherClient(qs).replay(dead_letter_id)
    return qs.replay(dead_letter_id, max_acquisitions=max_acquisitions, descendants=descendants)


@app.command("replay")
def dead_replay(
    ids: Annotated[list[str] | None, typer.Argument(help="Dead letter ids (or prefixes).")] = None,
    queue: Queue = None,
    everything: Annotated[bool, typer.Option("--all", help="Every open item dead letter.")] = False,
    max_acquisitions: Annotated[
        int | None, typer.Option(help="The renewed acquisition budget (default: the item's).")
    ] = None,
    descendants: Annotated[
        bool,
        typer.Option(
            "--descendants",
            help="With dead letters named by id: go on with each one's workflow from it (the"
            " items below it that its failure cancelled wait for it again).",
        ),
    ] = False,
    yes: Yes = False,
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Put quarantined items back in their queue with a renewed budget.

    Name dead letters by id, or replay a whole queue's (in bounded batches, each item
    atomically) with --queue. Asks before replaying more than one unless --yes.
    Replayed items count in the backlog: at the tenant's cap, what does not fit is
    left open and reported, and the command exits 1.

    Examples: [bold]queue-server dead-letters replay 0190f3c2-...[/bold]
              [bold]queue-server dead-letters replay --queue emails --yes[/bold]
    """
    ids = ids or []
    _ids_or_queue(ids, queue, everything)
    if descendants and not ids:
        fail("--descendants is for dead letters named by id", "name the failed step's")
    with tenant_session(url, key, data_dir, tenant) as qs:
        if ids:
            if len(ids) > 1:
                confirm(f"Replay {len(ids)} dead letters?", yes)
            answers: list[Item | Delivery] = []
            with _progress() as progress:
                task = progress.add_task("replaying", total=len(ids))
                for given in ids:
                    dead_letter_id = dead_letter_of(qs, given)
                    answers.append(_replay_one(qs, dead_letter_id, max_acquisitions, descendants))
                    progress.advance(task)
            if json:
                print_json(answers)
            else:
                for done in answers:
                    if isinstance(done, Delivery):
                        console.print(f"replayed delivery {done.delivery_key} -> {done.state}")
                    else:
                        console.print(f"replayed {done.item_id} ({done.queue}) -> {done.state}")
            return
        queues = [queue] if queue else sorted({d.queue for d in _collect(qs, None) if d.queue})
        pending = {q: len(_collect(qs, q)) for q in queues}
        total = sum(pending.values())
        if total == 0:
            if json:
                print_json({"replayed": 0, "skipped": 0})
            else:
                console.print("no open dead letters to replay")
            return
        confirm(f"Replay {total} dead letters in {', '.join(queues)}?", yes or total == 1)
        replayed = skipped = 0
        at_cap = False
        with _progress() as progress:
            task = progress.add_task("replaying", total=total)
            for q in queues:
                base = new_idempotency_key()
                for call in range(10_000):
                    try:
                        batch = qs.replay_queue(
                            q, max_acquisitions=max_acquisitions, idempotency_key=f"{base}-{call}"
                        )
                    except BacklogCapReachedError:
                        at_cap = True
                        break
                    replayed += batch.replayed
                    skipped += batch.skipped
                    progress.advance(task, batch.replayed + batch.skipped)
                    at_cap = batch.over_cap > 0
                    if at_cap or batch.replayed == 0 or batch.remaining == 0:
                        break
                if at_cap:  # the cap is the tenant's: no other queue fits either
                    break
    left = total - replayed - skipped if at_cap else 0
    if json:
        print_json({"replayed": replayed, "skipped": skipped, "over_cap": left})
    else:
        console.print(f"replayed {replayed}, skipped {skipped}")
    if at_cap:
        err_console.print(
            f"{left} left open: the tenant's backlog cap is reached"
            " (complete or discard work, or raise the cap, then replay again)"
        )
        raise typer.Exit(code=1)


@app.command("discard")
def dead_discard(
    ids: Annotated[list[str] | None, typer.Argument(help="Dead letter ids (or prefixes).")] = None,
    queue: Queue = None,
    everything: Annotated[bool, typer.Option("--all", help="Every open item dead letter.")] = False,
    reason: Annotated[str, typer.Option(help="Why; kept in the item's ledger.")] = "",
    yes: Yes = False,
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Cancel quarantined items for good and close their dead letters.

    Asks before discarding more than one unless --yes.

    Example: [bold]queue-server dead-letters discard --queue emails --reason "bad batch" --yes[/bold]
    """
    ids = ids or []
    _ids_or_queue(ids, queue, everything)
    with tenant_session(url, key, data_dir, tenant) as qs:
        if not ids:
            ids = [d.dead_letter_id for d in _collect(qs, queue)]
        if not ids:
            if json:
                print_json([])
            else:
                console.print("no open dead letters to discard")
            return
        if len(ids) > 1:
            confirm(f"Discard {len(ids)} dead letters? Their items are cancelled.", yes)
        items = []
        with _progress() as progress:
            task = progress.add_task("discarding", total=len(ids))
            for given in ids:
                items.append(qs.discard(dead_letter_of(qs, given), reason=reason))
                progress.advance(task)
    if json:
        print_json(items)
    else:
        for item in items:
            console.print(f"discarded {item.item_id} ({item.queue}) -> {item.state}")
