"""The `queue-server` command."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer

from queue_server.cli import (
    backup,
    dead_letters,
    enqueue,
    items,
    keys,
    ledger,
    policy,
    queues,
    schedules,
    spend,
    status,
    tenants,
    watchers,
    work,
)
from queue_server.cli import db as db_commands
from queue_server.cli.common import (
    CLI,
    EXIT_FAILURES,
    EXIT_USAGE,
    PolicyFile,
    process_policy,
    settings_from_env,
)
from queue_server.version import __version__

app = CLI(
    name="queue-server",
    help="""A durable work-queue and lease server on PostgreSQL.

    Client commands connect with --url/--key, or QUEUE_SERVER_URL/QUEUE_SERVER_KEY;
    on the server's machine, without either, they read the address and the admin key
    that `queue-server serve` wrote to its data directory (server.url, admin.key).
    """,
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)
db_app = CLI(
    help="Database schema: migrate and inspect; let database roles enqueue inside their own"
    " transactions (queue_server.enqueue).",
    no_args_is_help=True,
)
app.add_typer(db_app, name="db")
db_app.command("grant-enqueue")(db_commands.grant_enqueue)
db_app.command("revoke-enqueue")(db_commands.revoke_enqueue)
db_app.command("grants")(db_commands.grants)
app.add_typer(policy.app, name="policy")
app.add_typer(tenants.app, name="tenants")
app.add_typer(keys.app, name="keys")
app.command()(status.status)
app.add_typer(items.app, name="items")
app.add_typer(queues.app, name="queues")
app.add_typer(dead_letters.app, name="dead-letters")
app.add_typer(spend.app, name="spend")
app.add_typer(ledger.app, name="ledger")
app.add_typer(schedules.app, name="schedules")
app.add_typer(backup.app, name="backup")
app.command("restore")(backup.restore)
enqueue.register(app)
work.register(app)
watchers.register(app)

DataDir = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        envvar="QUEUE_SERVER_DATA_DIR",
        help="Where the embedded PostgreSQL and the admin key live.",
    ),
]


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"queue-server {__version__}")
        raise typer.Exit


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """A durable work-queue and lease server on PostgreSQL."""


def _fail(message: str, code: int = EXIT_FAILURES) -> typer.Exit:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    return typer.Exit(code=code)


@app.command()
def version() -> None:
    """Print the version."""
    typer.echo(__version__)


@app.command("data-dir")
def data_dir_command(data_dir: DataDir = None) -> None:
    """Print the data directory the local server uses: its address (server.url) and the
    admin key (admin.key) are there.

    --data-dir or QUEUE_SERVER_DATA_DIR if given; else the data directory `queue-server
    serve` last started on (`serve --data-dir X`: X), while that server runs; else the
    default, ~/.local/share/queue-server, or /var/lib/queue-server as root. Every command
    that reads the data directory finds it so.

    Example: [bold]cat "$(queue-server data-dir)/server.url"[/bold]
    """
    from queue_server.infra.address import local_data_dir

    typer.echo(local_data_dir(data_dir))


@app.command()
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8080,
    workers: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Worker processes (default: one per CPU core); /metrics adds up all of them."
            " Their pools share the database's connections (the start line says how; a"
            " number whose minimum pools do not fit is refused: docs/scaling.md).",
            show_default=False,
        ),
    ] = None,
    data_dir: DataDir = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    policy_file: PolicyFile = None,
    print_admin_key: Annotated[
        bool,
        typer.Option(
            "--print-admin-key",
            help="On first start, also print the admin key's secret (default: only where"
            " its file is, so no log keeps it).",
        ),
    ] = False,
    backup_repo: Annotated[
        Path | None,
        typer.Option(
            "--backup-repo",
            envvar="QUEUE_SERVER_BACKUP_REPO",
            help="Stream the embedded database's WAL into this backup repository (Barman)"
            " while serving, so `queue-server backup create` and `queue-server restore`"
            " work; see docs/backup.md.",
            show_default=False,
        ),
    ] = None,
    backup_retention: Annotated[
        str | None,
        typer.Option(
            "--backup-retention",
            envvar="QUEUE_SERVER_BACKUP_RETENTION",
            help="How long backups are kept: a recovery window (7d, 4w, 6m) or a number of"
            " full backups (3). Default: forever.",
            show_default=False,
        ),
    ] = None,
    metrics_listen: Annotated[
        str | None,
        typer.Option(
            envvar="QUEUE_SERVER_METRICS_LISTEN",
            help="Also publish /metrics without a key on this HOST:PORT (one the monitoring"
            " network reaches, not the public); on the API's port /metrics needs an operator"
            " or admin key.",
        ),
    ] = None,
) -> None:
    """Serve the REST API.

    With no QUEUE_SERVER_DATABASE_URL, starts an embedded PostgreSQL in the data
    directory, migrates it, and creates an admin key on first start, written readable
    only by you to <data-dir>/admin.key. Ctrl-C stops both. With a URL, the schema
    must already be at head (`queue-server db upgrade`). With
    OTEL_EXPORTER_OTLP_ENDPOINT set, every worker process exports OpenTelemetry spans of
    its requests and database round trips (docs/observability.md).

    With --backup-repo, the embedded database's WAL is streamed into that directory
    while it serves (docs/backup.md).

    Examples: [bold]queue-server serve --port 9000[/bold]
              [bold]queue-server serve --backup-repo /var/backups/queue-server --backup-retention 7d[/bold]
    """
    from queue_server.infra.address import published
    from queue_server.infra.backup import parse_retention
    from queue_server.infra.budget import ConnectionBudgetError, embedded_max_connections
    from queue_server.infra.serve import (
        DataDirInUseError,
        NoDatabaseError,
        SchemaNotAtHeadError,
        admin_key_path,
        archiving,
        connection_budget,
        database,
        ensure_admin_key,
    )

    settings = settings_from_env()
    if data_dir is not None:
        settings = settings.model_copy(update={"data_dir": data_dir})
    if backup_repo is not None:
        settings = settings.model_copy(update={"backup_repo": backup_repo.resolve()})
    if backup_retention is not None:
        settings = settings.model_copy(update={"backup_retention": backup_retention})
    try:
        retention = parse_retention(settings.backup_retention)
    except ValueError as exc:
        raise _fail(f"--backup-retention: {exc}", EXIT_USAGE) from None
    # Loaded and checked before anything starts: a bad document or a setting above
    # the envelope stops the server here, naming the cell.
    policy = process_policy(policy_file)
    settings.bounded_by(policy)
    if policy_file is not None:
        os.environ["QUEUE_SERVER_POLICY"] = str(policy_file.resolve())
    if metrics_listen is not None:
        from queue_server.infra.serve import parse_address

        try:
            parse_address(metrics_listen)
        except ValueError as exc:
            raise _fail(f"--metrics-listen: {exc}") from None
    processes = workers or os.cpu_count() or 1
    listening = metrics_listen is not None
    # The embedded database is started with room for every process's full pool.
    room = embedded_max_connections(settings, processes=processes, metrics_listener=listening)
    try:
        with (
            database(settings, max_connections=room) as db,
            archiving(settings, db) as streaming,
        ):
            try:
                budget = connection_budget(
                    settings, db.url, processes=processes, metrics_listener=listening
                )
            except ConnectionBudgetError as exc:
                raise _fail(str(exc)) from None
            # Every process's pool is sized by the budget (the processes read it from here).
            os.environ["QUEUE_SERVER_POOL_MIN_SIZE"] = str(budget.pool_min)
            os.environ["QUEUE_SERVER_POOL_MAX_SIZE"] = str(budget.pool_max)
            settings = settings.model_copy(
                update={"pool_min_size": budget.pool_min, "pool_max_size": budget.pool_max}
            )
            secret = ensure_admin_key(settings, db.url)
            if secret is not None:
                path = admin_key_path(settings.data_dir)
                typer.secho(
                    f"Created the admin key: {path} (readable only by you)",
                    fg=typer.colors.YELLOW,
                )
                if print_admin_key:
                    typer.echo(f"  {secret}")
                typer.echo("  Rotate it with `queue-server keys rotate-admin`.")
            where = (
                "embedded PostgreSQL in " + str(db.embedded.pgdata) if db.embedded else "external"
            )
            typer.echo(f"queue-server {__version__} on http://{host}:{port} ({where} database)")
            typer.echo(f"policy {policy.describe()}")
            typer.echo(budget.describe())
            if streaming is not None:
                kept = f", retention {retention.lower()}" if retention else ", kept forever"
                typer.echo(f"backups: WAL streaming into {streaming.repo.root}{kept}")
                os.environ["QUEUE_SERVER_BACKUP_REPO"] = str(streaming.repo.root)
            os.environ["QUEUE_SERVER_DATABASE_URL"] = db.url
            # The API's own port: the transport allowance never opens it to a watcher.
            os.environ["QUEUE_SERVER_PORT"] = str(port)
            os.environ["QUEUE_SERVER_DATA_DIR"] = str(settings.data_dir)
            # The CLI on this machine reads it, as it reads admin.key: no --url needed, and
            # no --data-dir either (infra/address.py); held until the server stops.
            with (
                published(settings.data_dir, host, port) as address,
                _process_metrics(
                    processes,
                    metrics_listen,
                    db.url,
                    settings.objectives(),
                    settings.approval_warning_seconds,
                ),
            ):
                if db.lock is not None:
                    db.lock.note(address.read_text().strip())
                _run_uvicorn(host=host, port=port, workers=processes, log_level=log_level)
    except (SchemaNotAtHeadError, NoDatabaseError, DataDirInUseError) as exc:
        raise _fail(str(exc)) from None


@contextlib.contextmanager
def _process_metrics(
    workers: int,
    listen: str | None,
    database_url: str,
    objectives: dict[str, float],
    approval_warning: float,
) -> Iterator[None]:
    """With several workers or a metrics listener, every process writes its metrics into one
    directory (prometheus_client's multiprocess mode), so any scrape adds them all up."""
    if workers == 1 and listen is None:
        yield
        return
    from queue_server.infra.metrics import new_multiprocess_dir, prepare_multiprocess
    from queue_server.infra.serve import start_metrics_listener

    with new_multiprocess_dir() as directory:
        prepare_multiprocess(Path(directory))
        if listen is not None:
            try:
                start_metrics_listener(listen, database_url, objectives, approval_warning)
            except OSError as exc:
                raise _fail(f"--metrics-listen {listen}: {exc.strerror or exc}") from None
            typer.echo(f"metrics on http://{listen}/metrics")
        yield


def _run_uvicorn(*, host: str, port: int, workers: int, log_level: str) -> None:
    import uvicorn

    config = uvicorn.Config(
        "queue_server.app:app_from_env",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=log_level,
        access_log=False,
        http="queue_server.infra.http_protocol:ProblemHttpToolsProtocol",
    )
    if workers > 1:
        _fork_workers_from_the_imported_app()
        uvicorn.run(
            "queue_server.app:app_from_env",
            factory=True,
            host=host,
            port=port,
            workers=workers,
            log_level=log_level,
            access_log=False,
            http="queue_server.infra.http_protocol:ProblemHttpToolsProtocol",
        )
        return
    # uvicorn re-raises the signal that stopped it once it has shut down; by then
    # there is nothing left to interrupt, and the embedded database still has to stop.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: None)
    uvicorn.Server(config).run()


def _fork_workers_from_the_imported_app() -> None:
    """uvicorn starts each worker as a fresh interpreter (multiprocessing's spawn), which
    imports the app's modules again: about 0.9 s of CPU and of start-up per worker, at every
    start and every restart of a worker. Its workers come from a fork server instead: one
    clean process, started with this one's environment, that imports the app once; each
    worker is forked from it, a process of its own that shares no state, thread or
    connection with this one, as a spawned worker."""
    import multiprocessing

    import uvicorn._subprocess

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["queue_server.app"])
    uvicorn._subprocess.spawn = context  # type: ignore[assignment]


def _database_url() -> str:
    url = settings_from_env().database_url
    if not url:
        raise _fail("set QUEUE_SERVER_DATABASE_URL to the database to migrate", EXIT_USAGE)
    return url


@db_app.command("upgrade")
def db_upgrade(
    revision: Annotated[str, typer.Argument(help="Target revision.")] = "heads",
) -> None:
    """Migrate the database at QUEUE_SERVER_DATABASE_URL to REVISION (default: every head).

    Example: [bold]QUEUE_SERVER_DATABASE_URL=postgresql://... queue-server db upgrade[/bold]
    """
    from queue_server.infra import migrate

    url = _database_url()
    migrate.upgrade(url, revision)
    typer.echo(f"database at {migrate.describe(migrate.current_revisions(url))}")


@db_app.command("current")
def db_current() -> None:
    """Show the database's revision and the head revision; exit 1 if they differ."""
    from queue_server.infra import migrate

    url = _database_url()
    current, heads = migrate.current_revisions(url), migrate.head_revisions()
    typer.echo(f"current: {migrate.describe(current)}  head: {migrate.describe(heads)}")
    if current != heads:
        sys.exit(1)
