"""`queue-server watchers ...` (webhook subscriptions and their deliveries) and
`queue-server deliver` (the process that sends them)."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import Annotated, Literal

import typer

from queue_server.cli.common import (
    CLI,
    EXIT_UNAVAILABLE,
    DataDir,
    Json,
    Key,
    PolicyFile,
    Quiet,
    Tenant,
    Url,
    Wide,
    console,
    fail,
    failure_text,
    fields,
    ids,
    print_json,
    process_policy,
    resolve_id,
    settings_from_env,
    table,
    tenant_session,
)
from queue_server.client.watchers import Delivery, Watcher, WatcherClient
from queue_server.infra import tracing

watchers_app = CLI(
    help="Webhooks: register, list, pause, resume, cancel, rotate secrets, see deliveries.",
    no_args_is_help=True,
)

EVENTS = (
    "item.enqueued",
    "item.completed",
    "item.requeued",
    "item.quarantined",
    "item.replayed",
    "item.cancelled",
)
WatcherId = Annotated[str, typer.Argument(help="Watcher id, or a prefix of exactly one.")]


def watcher_of(hooks: WatcherClient, given: str) -> str:
    return resolve_id(given, "watcher", lambda: [w.watcher_id for w in hooks.list_watchers()])


def register(app: typer.Typer) -> None:
    app.add_typer(watchers_app, name="watchers")
    app.command("deliver")(deliver)


def _watcher_fields(w: Watcher) -> None:
    pairs: list[tuple[str, object]] = [
        ("watcher", w.watcher_id),
        ("url", w.url),
        ("events", ", ".join(w.events)),
        ("queues", ", ".join(w.queues) if w.queues else "every queue"),
        ("state", w.state),
    ]
    if w.disabled_reason:
        pairs.append(("disabled", w.disabled_reason))
    if w.backlogged:
        pairs.append(("backlogged", f"since {w.backlogged_at}, events from {w.backlog_from} on"))
    if w.deliveries is not None:
        d = w.deliveries
        pairs.append(
            (
                "deliveries",
                f"{d.pending} pending, {d.delivered} delivered, {d.dead} dead,"
                f" {d.cancelled} cancelled",
            )
        )
    if w.previous_secret_expires_at is not None:
        pairs.append(("old secret signs until", w.previous_secret_expires_at))
    if w.cancelled_deliveries is not None:
        pairs.append(("cancelled deliveries", w.cancelled_deliveries))
    fields(None, pairs)


def _show_secret(w: Watcher) -> None:
    if w.secret:
        console.print("[yellow]Signing secret (shown once; verify webhook-signature with it):[/]")
        console.print(f"  {w.secret}")


@watchers_app.command("create")
def create(
    target: Annotated[str, typer.Argument(help="The receiver's http(s) URL.")],
    event: Annotated[
        list[str] | None,
        typer.Option("--event", "-e", help=f"Event to send (repeat). One of: {', '.join(EVENTS)}."),
    ] = None,
    queue: Annotated[
        list[str] | None, typer.Option("--queue", "-q", help="Only these queues (repeat).")
    ] = None,
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Register a webhook; prints its signing secret once.

    Example: [bold]queue-server watchers create http://127.0.0.1:9999/hook -e item.completed[/bold]
    """
    events = event or ["item.completed"]
    unknown = sorted(set(events) - set(EVENTS))
    if unknown:
        fail("Unknown event", ", ".join(unknown))
    with tenant_session(url, key, data_dir, tenant) as qs:
        created = WatcherClient(qs).create(target, events, queues=queue)
    if json:
        print_json(created)
        return
    _watcher_fields(created)
    _show_secret(created)


@watchers_app.command("list")
def list_watchers(
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
    quiet: Quiet = False,
    wide: Wide = False,
) -> None:
    """The tenant's watchers with their deliveries by state (a watcher past its outbox cap
    shows as backlogged)."""
    with tenant_session(url, key, data_dir, tenant) as qs:
        found = WatcherClient(qs).list_watchers()
    if json:
        print_json(found)
        return
    if quiet:
        ids([w.watcher_id for w in found])
        return
    table(
        "watchers",
        ["watcher", "state", "url", "events", "pending", "delivered", "dead"],
        [
            (
                w.watcher_id,
                # Past the outbox cap: shown with the state, which it qualifies.
                f"{w.state}, backlogged" if w.backlogged else w.state,
                w.url,
                ", ".join(w.events),
                w.deliveries.pending if w.deliveries else 0,
                w.deliveries.delivered if w.deliveries else 0,
                w.deliveries.dead if w.deliveries else 0,
            )
            for w in found
        ],
        drop=["events", "pending", "delivered", "dead", "url"],
        wide=wide,
    )


@watchers_app.command("show")
def show(
    watcher_id: WatcherId,
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """One watcher."""
    with tenant_session(url, key, data_dir, tenant) as qs:
        hooks = WatcherClient(qs)
        found = hooks.get(watcher_of(hooks, watcher_id))
    if json:
        print_json(found)
    else:
        _watcher_fields(found)


def _act(
    action: Literal["pause", "resume", "cancel", "rotate-secret"],
    watcher_id: str,
    url: str | None,
    key: str | None,
    tenant: str | None,
    data_dir: Path | None,
    json: bool,
) -> None:
    with tenant_session(url, key, data_dir, tenant) as qs:
        hooks = WatcherClient(qs)
        watcher_id = watcher_of(hooks, watcher_id)
        done = {
            "pause": hooks.pause,
            "resume": hooks.resume,
            "cancel": hooks.cancel,
            "rotate-secret": hooks.rotate_secret,
        }[action](watcher_id)
    if json:
        print_json(done)
        return
    _watcher_fields(done)
    _show_secret(done)


@watchers_app.command("pause")
def pause(
    watcher_id: WatcherId,
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Hold the watcher's pending deliveries until it is resumed."""
    _act("pause", watcher_id, url, key, tenant, data_dir, json)


@watchers_app.command("resume")
def resume(
    watcher_id: WatcherId,
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Send the held deliveries again, oldest first."""
    _act("resume", watcher_id, url, key, tenant, data_dir, json)


@watchers_app.command("cancel")
def cancel(
    watcher_id: WatcherId,
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Stop the watcher for good; its pending deliveries are cancelled."""
    _act("cancel", watcher_id, url, key, tenant, data_dir, json)


@watchers_app.command("rotate-secret")
def rotate_secret(
    watcher_id: WatcherId,
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """A new signing secret (shown once); the old one also signs during the grace period."""
    _act("rotate-secret", watcher_id, url, key, tenant, data_dir, json)


def _last(d: Delivery) -> str:
    return failure_text(d.last_outcome) or "-"


@watchers_app.command("deliveries")
def deliveries(
    watcher_id: WatcherId,
    state: Annotated[
        str | None, typer.Option(help="pending, delivered, dead or cancelled.")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, max=500)] = 50,
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
    wide: Wide = False,
) -> None:
    """The watcher's deliveries: key, attempts, next attempt, last outcome, receipts."""
    if state not in (None, "pending", "delivered", "dead", "cancelled"):
        fail("Unknown state", str(state))
    with tenant_session(url, key, data_dir, tenant) as qs:
        hooks = WatcherClient(qs)
        page = hooks.deliveries(
            watcher_of(hooks, watcher_id),
            state=state,  # type: ignore[arg-type]
            limit=limit,
        )
    if json:
        print_json(page)
        return
    table(
        "deliveries",
        ["delivery key", "event", "state", "attempts", "next attempt", "last outcome", "receipts"],
        [
            (
                d.delivery_key,
                d.event,
                d.state,
                d.attempts,
                d.next_attempt_at,
                _last(d),
                len(d.receipts) + d.receipts_omitted,
            )
            for d in page.deliveries
        ],
        drop=["receipts", "event", "next attempt"],
        wide=wide,
    )


@watchers_app.command("replay")
def replay(
    dead_letter_id: Annotated[
        str, typer.Argument(help="Dead letter id (kind delivery), or a prefix of one.")
    ],
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Send a dead delivery again: same delivery key, a fresh budget of attempts."""
    with tenant_session(url, key, data_dir, tenant) as qs:
        from queue_server.cli.dead_letters import dead_letter_of

        delivery = WatcherClient(qs).replay(dead_letter_of(qs, dead_letter_id))
    if json:
        print_json(delivery)
    else:
        console.print(f"replayed {delivery.delivery_key} ({delivery.event}) -> {delivery.state}")


# -- the delivery process -------------------------------------------------------------


def deliver(
    once: Annotated[bool, typer.Option("--once", help="One delivery run, then exit.")] = False,
    poll_interval: Annotated[
        float | None, typer.Option(help="Seconds between polls when idle.", show_default=False)
    ] = None,
    batch_size: Annotated[
        int | None, typer.Option(help="Rows claimed per delivery run.", show_default=False)
    ] = None,
    allow: Annotated[
        list[str] | None,
        typer.Option(
            "--allow",
            help="Also allow this host or network (e.g. 127.0.0.1) although it is private.",
        ),
    ] = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            envvar="QUEUE_SERVER_DATA_DIR",
            help="The embedded server's data directory (used without a database URL).",
        ),
    ] = None,
    policy_file: PolicyFile = None,
) -> None:
    """Send due webhook deliveries from the outbox (run as many as you like).

    Uses QUEUE_SERVER_DATABASE_URL, or the running embedded server's database in the
    data directory. Keeps running while the database is away (logging each retry) and
    resumes by itself. SIGTERM or Ctrl-C lets the deliveries in flight finish; a second
    one returns them to the outbox. Settings: QUEUE_SERVER_TRANSPORT_ALLOW (JSON list),
    QUEUE_SERVER_DELIVERY_BACKOFF_SCALE, QUEUE_SERVER_DELIVERY_ATTEMPT_TIMEOUT, ...
    With OTEL_EXPORTER_OTLP_ENDPOINT set, each attempt is an OpenTelemetry span
    (docs/observability.md).

    Example: [bold]queue-server deliver --allow 127.0.0.1[/bold]
    """
    from queue_server.background.deliverer import Deliverer

    settings = settings_from_env()
    update: dict[str, object] = {}
    if data_dir is not None:
        update["data_dir"] = data_dir
    if poll_interval is not None:
        update["delivery_poll_interval"] = poll_interval
    if batch_size is not None:
        update["delivery_batch_size"] = batch_size
    if allow:
        update["transport_allow"] = [*settings.transport_allow, *allow]
    settings = settings.model_copy(update=update)
    policy = process_policy(policy_file)
    settings.bounded_by(policy)
    database_url = settings.database_url or _embedded_url(settings.data_dir)
    # With OTEL_EXPORTER_OTLP_ENDPOINT set: a span per delivery attempt, exported over OTLP.
    tracing.configure("queue-server-deliver")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger(__name__).info("policy %s", policy.describe())
    # Each attempt is logged by delivery key and outcome; never a secret or a URL path.
    logging.getLogger("httpx").setLevel(logging.WARNING)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        main = asyncio.current_task()

        def on_signal() -> None:
            # The first signal lets the deliveries in flight finish (each is bounded by the
            # attempt timeout); a second one stops them: back to the outbox, due at once.
            if stop.is_set() and main is not None:
                main.cancel()
            stop.set()

        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, on_signal)
        deliverer = Deliverer(settings, database_url, policy=policy)
        # A long-running deliverer starts even while the database is away, and waits for it.
        await deliverer.open(wait=once)
        try:
            if once:
                report = await deliverer.run_once()
                typer.echo(
                    f"claimed {report.claimed}: delivered {report.delivered},"
                    f" failed {report.failed}, dead {report.dead}, gone {report.gone},"
                    f" released {report.released}, expired {report.expired}"
                )
                return
            typer.echo("delivering; Ctrl-C stops")
            await deliverer.run_forever(stop)
        finally:
            await deliverer.close()

    try:
        asyncio.run(run())
    except asyncio.CancelledError:
        typer.echo("stopped; the deliveries in flight are back in the outbox")


def _embedded_url(data_dir: Path) -> str:
    from queue_server.infra.serve import NoDatabaseError, embedded_postgres
    from queue_server.store.bootstrap import DATABASE_NAME, SERVER_ROLE

    try:
        pg = embedded_postgres(data_dir / "pgdata")
    except NoDatabaseError as exc:
        fail("No database", str(exc), EXIT_UNAVAILABLE)
    if not (data_dir / "pgdata").exists() or not pg.is_running():
        fail(
            "No database",
            "set QUEUE_SERVER_DATABASE_URL, or start `queue-server serve` (embedded) first",
            EXIT_UNAVAILABLE,
        )
    return pg.url(DATABASE_NAME, user=SERVER_ROLE)
