"""Operator commands: tenants, keys, status, items, dead letters, spend, ledger verification."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from queue_server.cli.common import (
    CLI,
    DataDir,
    Json,
    Key,
    Tenant,
    Url,
    age,
    confirm,
    connect,
    console,
    err_console,
    fail,
    fields,
    print_json,
    table,
    tenant_session,
)
from queue_server.client import DEFAULT_URL, QueueClient, new_idempotency_key
from queue_server.client.models import DeadLetter, Item, LedgerEvent
from queue_server.client.watchers import Delivery, WatcherClient

tenants_app = CLI(help="Create and inspect tenants (admin).", no_args_is_help=True)
keys_app = CLI(help="Create and revoke API keys (admin).", no_args_is_help=True)
items_app = CLI(help="Inspect work items.", no_args_is_help=True)
dead_app = CLI(help="Triage dead letters: list, show, replay, discard.", no_args_is_help=True)
spend_app = CLI(help="Spend approvals: the concurrency a queue may use.", no_args_is_help=True)
ledger_app = CLI(help="Ledger checks.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(tenants_app, name="tenants")
    app.add_typer(keys_app, name="keys")
    app.command()(status)
    app.add_typer(items_app, name="items")
    app.add_typer(dead_app, name="dead-letters")
    app.add_typer(spend_app, name="spend")
    app.add_typer(ledger_app, name="ledger")


# -- tenants and keys --------------------------------------------------------------


@tenants_app.command("put")
def tenants_put(
    tenant: Annotated[str, typer.Argument(help="Tenant name.")],
    backlog_cap: Annotated[int, typer.Option(help="Most ready + leased items at once.")],
    default_max_acquisitions: Annotated[
        int, typer.Option(help="Acquisition budget of a new item.")
    ] = 5,
    default_lease_ttl: Annotated[float, typer.Option(help="Lease TTL in seconds.")] = 30.0,
    url: Url = DEFAULT_URL,
    key: Key = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Create a tenant or change its settings.

    Example: [bold]queue-server tenants put acme --backlog-cap 10000[/bold]
    """
    with connect(url, key, data_dir) as qs:
        row = qs.put_tenant(
            tenant,
            backlog_cap=backlog_cap,
            default_max_acquisitions=default_max_acquisitions,
            default_lease_ttl=default_lease_ttl,
        )
    if json:
        print_json(row)
        return
    console.print(f"tenant [bold]{row.tenant}[/bold] saved")
    fields(
        None,
        [
            ("backlog cap", row.backlog_cap),
            ("default max acquisitions", row.default_max_acquisitions),
            ("default lease TTL", f"{row.default_lease_ttl:g}s"),
        ],
    )


def _tenant_fields(qs: QueueClient, tenant: str) -> None:
    row = qs.get_tenant(tenant)
    fields(
        f"tenant {row.tenant}",
        [
            ("backlog", f"{row.backlog} of {row.backlog_cap}"),
            ("ready", row.ready),
            ("leased", row.leased),
            ("quarantined", row.quarantined),
            ("completed", row.completed),
            ("cancelled", row.cancelled),
            ("default max acquisitions", row.default_max_acquisitions),
            ("default lease TTL", f"{row.default_lease_ttl:g}s"),
            ("created", row.created_at),
        ],
    )


@tenants_app.command("show")
def tenants_show(
    tenant: Annotated[str | None, typer.Argument(help="Tenant name (default: the key's).")] = None,
    url: Url = DEFAULT_URL,
    key: Key = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Show a tenant's settings and its items by state.

    Example: [bold]queue-server tenants show acme[/bold]
    """
    with tenant_session(url, key, data_dir, tenant) as qs:
        if json:
            print_json(qs.get_tenant())
            return
        _tenant_fields(qs, qs.tenant or "")


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Argument(help="Tenant the key belongs to.")],
    role: Annotated[str, typer.Option(help="worker or operator.")] = "worker",
    url: Url = DEFAULT_URL,
    key: Key = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Create an API key; its secret is printed once.

    Example: [bold]queue-server keys create acme --role operator[/bold]
    """
    if role not in ("worker", "operator"):
        fail("Invalid role", "--role must be worker or operator")
    with connect(url, key, data_dir) as qs:
        created = qs.create_key("worker" if role == "worker" else "operator", tenant=tenant)
    if json:
        print_json(created)
        return
    console.print(f"{created.role} key [bold]{created.key_id}[/bold] for {created.tenant}")
    console.print("secret (shown once; store it now):")
    console.print(created.secret, soft_wrap=True)


@keys_app.command("revoke")
def keys_revoke(
    tenant: Annotated[str, typer.Argument(help="Tenant the key belongs to.")],
    key_id: Annotated[str, typer.Argument(help="The key id (not the secret).")],
    url: Url = DEFAULT_URL,
    key: Key = None,
    data_dir: DataDir = None,
) -> None:
    """Revoke an API key; it is refused from the next request on.

    Example: [bold]queue-server keys revoke acme 3f2a9c0d1e4b5a6f[/bold]
    """
    with connect(url, key, data_dir) as qs:
        qs.revoke_key(key_id, tenant=tenant)
    console.print(f"key {key_id} revoked")


# -- status ----------------------------------------------------------------------


def status(
    url: Url = DEFAULT_URL,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Per queue: ready, leased, quarantined, oldest ready age; the backlog against its cap.

    Example: [bold]queue-server status --tenant acme[/bold]
    """
    with tenant_session(url, key, data_dir, tenant) as qs:
        snapshot = qs.status()
    if json:
        print_json(snapshot)
        return
    table(
        f"tenant {snapshot.tenant}: backlog {snapshot.backlog} of {snapshot.backlog_cap},"
        f" {snapshot.open_dead_letters} open dead letters",
        ["queue", "ready", "due", "leased", "quarantined", "oldest ready", "concurrency"],
        [
            (
                q.queue,
                q.ready,
                q.due,
                q.leased,
                q.quarantined,
                age(q.oldest_ready_age),
                f"{q.active_leases}/{q.concurrency_limit}",
            )
            for q in snapshot.queues
        ],
    )


# -- items -----------------------------------------------------------------------


def _item_fields(item: Item) -> None:
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


def _ledger_table(item_id: str, events: list[LedgerEvent]) -> None:
    table(
        f"ledger of {item_id}",
        ["seq", "at", "kind", "fence", "actor", "data"],
        [(e.seq, e.at, e.kind, e.fence, e.actor, e.data) for e in events],
    )


@items_app.command("show")
def items_show(
    item_id: Annotated[str, typer.Argument(help="Item id.")],
    url: Url = DEFAULT_URL,
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
        _item_fields(item)


@items_app.command("ledger")
def items_ledger(
    item_id: Annotated[str, typer.Argument(help="Item id.")],
    url: Url = DEFAULT_URL,
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
        _ledger_table(item_id, events)


# -- dead letters ----------------------------------------------------------------

Queue = Annotated[str | None, typer.Option("--queue", "-q", help="Only this queue.")]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]


def _dead_letter_rows(rows: list[DeadLetter]) -> list[tuple[object, ...]]:
    return [
        (
            d.dead_letter_id,
            d.queue,
            d.reason,
            (d.last_failure or {}).get("message") if isinstance(d.last_failure, dict) else None,
            d.created_at,
            d.resolution or "open",
        )
        for d in rows
    ]


@dead_app.command("list")
def dead_list(
    queue: Queue = None,
    kind: Annotated[str | None, typer.Option(help="item or delivery.")] = None,
    state: Annotated[str, typer.Option("--status", help="open, closed or all.")] = "open",
    limit: Annotated[int, typer.Option(help="At most this many (0: all).")] = 50,
    url: Url = DEFAULT_URL,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Dead letters, oldest first.

    Example: [bold]queue-server dead-letters list --queue emails[/bold]
    """
    if kind not in (None, "item", "delivery") or state not in ("open", "closed", "all"):
        fail("Invalid filter", "--kind is item or delivery; --status is open, closed or all")
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
    table(
        f"{len(rows)} dead letters",
        ["dead letter", "queue", "reason", "last failure", "created", "status"],
        _dead_letter_rows(rows),
    )


@dead_app.command("show")
def dead_show(
    dead_letter_id: Annotated[str, typer.Argument(help="Dead letter id.")],
    url: Url = DEFAULT_URL,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """A dead letter with its item and the item's whole ledger.

    Example: [bold]queue-server dead-letters show 0190f3c2-...[/bold]
    """
    with tenant_session(url, key, data_dir, tenant) as qs:
        detail = qs.show_dead_letter(dead_letter_id)
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
            ("last failure", d.last_failure),
            ("created", d.created_at),
            ("status", d.resolution or "open"),
        ],
    )
    if detail.item is not None:
        _item_fields(detail.item)
        _ledger_table(detail.item.item_id, detail.events)


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


def _collect(qs: QueueClient, queue: str | None) -> list[DeadLetter]:
    return [d for d in qs.iter_dead_letters(queue=queue, kind="item")]


def _replay_one(
    qs: QueueClient, dead_letter_id: str, max_acquisitions: int | None
) -> Item | Delivery:
    """An item dead letter brings its item back; a delivery one resends under the same key."""
    if qs.show_dead_letter(dead_letter_id).dead_letter.kind == "delivery":
        return WatcherClient(qs).replay(dead_letter_id)
    return qs.replay(dead_letter_id, max_acquisitions=max_acquisitions)


@dead_app.command("replay")
def dead_replay(
    ids: Annotated[list[str] | None, typer.Argument(help="Dead letter ids.")] = None,
    queue: Queue = None,
    everything: Annotated[bool, typer.Option("--all", help="Every open item dead letter.")] = False,
    max_acquisitions: Annotated[
        int | None, typer.Option(help="The renewed acquisition budget (default: the item's).")
    ] = None,
    yes: Yes = False,
    url: Url = DEFAULT_URL,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Put quarantined items back in their queue with a renewed budget.

    Name dead letters by id, or replay a whole queue's (in bounded batches, each item
    atomically) with --queue. Asks before replaying more than one unless --yes.

    Examples: [bold]queue-server dead-letters replay 0190f3c2-...[/bold]
              [bold]queue-server dead-letters replay --queue emails --yes[/bold]
    """
    ids = ids or []
    _ids_or_queue(ids, queue, everything)
    with tenant_session(url, key, data_dir, tenant) as qs:
        if ids:
            if len(ids) > 1:
                confirm(f"Replay {len(ids)} dead letters?", yes)
            answers: list[Item | Delivery] = []
            with _progress() as progress:
                task = progress.add_task("replaying", total=len(ids))
                for dead_letter_id in ids:
                    answers.append(_replay_one(qs, dead_letter_id, max_acquisitions))
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
        with _progress() as progress:
            task = progress.add_task("replaying", total=total)
            for q in queues:
                base = new_idempotency_key()
                for call in range(10_000):
                    batch = qs.replay_queue(
                        q, max_acquisitions=max_acquisitions, idempotency_key=f"{base}-{call}"
                    )
                    replayed += batch.replayed
                    skipped += batch.skipped
                    progress.advance(task, batch.replayed + batch.skipped)
                    if batch.replayed == 0 or batch.remaining == 0:
                        break
    if json:
        print_json({"replayed": replayed, "skipped": skipped})
    else:
        console.print(f"replayed {replayed}, skipped {skipped}")


@dead_app.command("discard")
def dead_discard(
    ids: Annotated[list[str] | None, typer.Argument(help="Dead letter ids.")] = None,
    queue: Queue = None,
    everything: Annotated[bool, typer.Option("--all", help="Every open item dead letter.")] = False,
    reason: Annotated[str, typer.Option(help="Why; kept in the item's ledger.")] = "",
    yes: Yes = False,
    url: Url = DEFAULT_URL,
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
            for dead_letter_id in ids:
                items.append(qs.discard(dead_letter_id, reason=reason))
                progress.advance(task)
    if json:
        print_json(items)
    else:
        for item in items:
            console.print(f"discarded {item.item_id} ({item.queue}) -> {item.state}")


# -- spend -------------------------------------------------------------------------


def parse_expiry(text: str) -> datetime:
    """`2h`, `30m`, `7d`, `90s`, or an RFC 3339 time with a zone."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if text and text[-1] in units and text[:-1].replace(".", "", 1).isdigit():
        return datetime.now(UTC) + timedelta(seconds=float(text[:-1]) * units[text[-1]])
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        fail("Invalid --expires", "use a duration like 2h, 30m, 7d or an RFC 3339 time")
    if when.tzinfo is None:
        fail("Invalid --expires", "give the time zone, e.g. 2030-01-01T00:00:00Z")
    return when


@spend_app.command("approve")
def spend_approve(
    queue: Annotated[str, typer.Argument(help="Queue name.")],
    max_concurrency: Annotated[int, typer.Option(help="Leases at once (at least 2).")],
    expires: Annotated[str, typer.Option(help="Duration (2h, 7d) or RFC 3339 time.")],
    approved_by: Annotated[str, typer.Option(help="Who approves the spend.")],
    reason: Annotated[str, typer.Option(help="Why.")],
    url: Url = DEFAULT_URL,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Approve more than one concurrent lease on a queue until the approval expires.

    Example: [bold]queue-server spend approve emails --max-concurrency 8 --expires 7d
    --approved-by ana@example.com --reason "launch week"[/bold]
    """
    expires_at = parse_expiry(expires)
    with tenant_session(url, key, data_dir, tenant) as qs:
        approval = qs.approve_spend(
            queue,
            approved_by=approved_by,
            max_concurrency=max_concurrency,
            expires_at=expires_at,
            reason=reason,
        )
    if json:
        print_json(approval)
        return
    console.print(
        f"{approval.queue}: up to {approval.max_concurrency} leases until"
        f" {approval.expires_at:%Y-%m-%d %H:%M:%S %Z} (approved by {approval.approved_by})"
    )


@spend_app.command("show")
def spend_show(
    queue: Annotated[str, typer.Argument(help="Queue name.")],
    url: Url = DEFAULT_URL,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """The queue's concurrency limit, its active leases and the approval behind the limit.

    Example: [bold]queue-server spend show emails[/bold]
    """
    with tenant_session(url, key, data_dir, tenant) as qs:
        info = qs.concurrency(queue)
    if json:
        print_json(info)
        return
    approval = info.approval or {}
    fields(
        f"queue {info.queue}",
        [
            ("limit", info.limit),
            ("active leases", info.active_leases),
            ("approved by", approval.get("approved_by")),
            ("expires", approval.get("expires_at")),
            ("reason", approval.get("reason")),
        ],
    )


# -- ledger ------------------------------------------------------------------------


@ledger_app.command("verify")
def ledger_verify(
    url: Url = DEFAULT_URL,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Fold every item's ledger and compare it with the item; exit 1 on any mismatch.

    Runs on the server (GET /v1/.../ledger-verification), page by page. Without
    --tenant, an admin key checks every tenant and a tenant key its own tenant.

    Example: [bold]queue-server ledger verify --tenant acme[/bold]
    """
    with connect(url, key, data_dir) as qs:
        every = tenant is None and qs.whoami().tenant is None
        if not every:
            scope = tenant or qs.whoami().tenant
            qs.tenant = scope
        checked = 0
        mismatches = []
        cursor: str | None = None
        with err_console.status("verifying ledgers") as spinner:
            while True:
                page = qs.verify_ledgers(all_tenants=every, cursor=cursor)
                checked += page.checked
                mismatches += page.mismatches
                spinner.update(f"verified {checked} items, {len(mismatches)} mismatches")
                cursor = page.next_cursor
                if cursor is None:
                    break
    if json:
        print_json({"checked": checked, "mismatches": mismatches})
    else:
        if mismatches:
            table(
                f"{len(mismatches)} of {checked} items disagree with their ledger",
                ["tenant", "item", "problem"],
                [(m.tenant, m.item_id, "; ".join(m.problems)) for m in mismatches],
            )
        else:
            console.print(f"{checked} items verified: every ledger folds to its item")
    if mismatches:
        raise typer.Exit(code=1)
