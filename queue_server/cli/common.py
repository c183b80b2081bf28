"""What every client command shares: connection options, the client factory, output, errors."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from queue_server.client import QueueClient, QueueClientError
from queue_server.policy import PolicyError, ReliabilityPolicy

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

Url = Annotated[
    str,
    typer.Option(
        "--url",
        envvar="QUEUE_SERVER_URL",
        help="The server's base URL.",
        rich_help_panel="Connection",
    ),
]
Key = Annotated[
    str | None,
    typer.Option(
        "--key",
        envvar="QUEUE_SERVER_KEY",
        help="API key. Default: <data-dir>/admin.key of a local embedded server.",
        rich_help_panel="Connection",
        show_default=False,
    ),
]
Tenant = Annotated[
    str | None,
    typer.Option(
        "--tenant",
        "-t",
        envvar="QUEUE_SERVER_TENANT",
        help="Tenant. Default: the API key's own tenant.",
        rich_help_panel="Connection",
        show_default=False,
    ),
]
DataDir = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        envvar="QUEUE_SERVER_DATA_DIR",
        help="The embedded server's data directory (where admin.key lives).",
        rich_help_panel="Connection",
        show_default=False,
    ),
]
Json = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
PolicyFile = Annotated[
    Path | None,
    typer.Option(
        "--policy",
        envvar="QUEUE_SERVER_POLICY",
        help="The operation-reliability policy document to run under (the JSON"
        " `queue-server policy show --json` prints; it may tighten the built-in"
        " operation-reliability.v2, never loosen it). Default: the built-in one.",
        show_default=False,
        dir_okay=False,
    ),
]


class CommandError(Exception):
    """A CLI-side refusal: printed as `error: title: detail`, exit 1."""

    def __init__(self, title: str, detail: str = "") -> None:
        self.title = title
        self.detail = detail
        super().__init__(f"{title}: {detail}" if detail else title)


def fail(title: str, detail: str = "") -> NoReturn:
    raise CommandError(title, detail)


def report_error(title: str, detail: str, code: str | None = None) -> None:
    message = f"[bold red]error:[/] {_escape(title)}"
    if detail:
        message += f": {_escape(detail)}"
    if code:
        message += f" [dim]({_escape(code)})[/]"
    err_console.print(message)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


class CLI(typer.Typer):
    """Typer, with client and CLI errors printed as one line and a non-zero exit."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except QueueClientError as exc:
            report_error(exc.title, exc.detail, exc.code)
            sys.exit(1)
        except CommandError as exc:
            report_error(exc.title, exc.detail)
            sys.exit(1)
        except PolicyError as exc:
            report_error("Reliability policy refused", str(exc))
            sys.exit(1)


def process_policy(path: Path | None) -> ReliabilityPolicy:
    """The policy this process runs under (--policy, QUEUE_SERVER_POLICY or the built-in one).

    A document that breaks the loader's rules stops the command with each cell named.
    """
    from queue_server.policy import runtime_policy

    return runtime_policy(path)


def _key_from_data_dir(data_dir: Path | None) -> str | None:
    from queue_server.settings import default_data_dir

    # queue_server.infra.serve.ADMIN_KEY_FILE; not imported, it would pull in the database stack.
    path = (data_dir or default_data_dir()) / "admin.key"
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def connect(url: str, key: str | None, data_dir: Path | None = None) -> QueueClient:
    """The one client factory of the CLI."""
    key = key or _key_from_data_dir(data_dir)
    if not key:
        fail(
            "No API key",
            "pass --key, set QUEUE_SERVER_KEY, or run where the embedded server's"
            " <data-dir>/admin.key is readable",
        )
    # A person is waiting: retry transient failures briefly, then say what went wrong.
    return QueueClient(url, key, attempts=3, max_wait=2.0)


def tenant_of(client: QueueClient, tenant: str | None) -> str:
    """The tenant named, else the key's own; an admin key must name one."""
    if tenant:
        client.tenant = tenant
        return tenant
    own = client.whoami().tenant
    if not own:
        fail("No tenant", "this is an admin key: pass --tenant or set QUEUE_SERVER_TENANT")
    client.tenant = own
    return own


@contextmanager
def tenant_session(
    url: str, key: str | None, data_dir: Path | None, tenant: str | None
) -> Iterator[QueueClient]:
    client = connect(url, key, data_dir)
    try:
        tenant_of(client, tenant)
        yield client
    finally:
        client.close()


# -- output ----------------------------------------------------------------------


def to_jsonable(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: to_jsonable(v) for k, v in value.items()}
    return value


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(to_jsonable(value), indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, dict | list):
        text = json.dumps(value, ensure_ascii=False)
        return text if len(text) <= 60 else text[:57] + "..."
    return str(value)


ID_COLUMNS = frozenset({"dead letter", "item"})


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    grid = Table(title=title, title_justify="left", header_style="bold")
    for column in columns:
        if column in ID_COLUMNS:
            # Ids are copied into the next command: never cut or wrapped.
            grid.add_column(column, no_wrap=True, min_width=36)
        else:
            grid.add_column(column)
    for row in rows:
        grid.add_row(*(_escape(cell(v)) for v in row))
    console.print(grid)


def fields(title: str | None, pairs: Sequence[tuple[str, Any]]) -> None:
    grid = Table(title=title, title_justify="left", show_header=False, box=None)
    grid.add_column(style="bold")
    grid.add_column(overflow="fold")
    for name, value in pairs:
        text = (
            json.dumps(value, ensure_ascii=False) if isinstance(value, dict | list) else cell(value)
        )
        grid.add_row(name, _escape(text))
    console.print(grid)


def age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"


def confirm(question: str, yes: bool) -> None:
    """Ask before a change to many things; --yes skips; no terminal means no."""
    if yes:
        return
    if not sys.stdin.isatty():
        fail("Confirmation needed", f"{question} Re-run with --yes to proceed without asking.")
    if not typer.confirm(question, default=False):
        raise typer.Exit(code=1)
