"""What every client command shares: connection options, the client factory, output, errors."""

from __future__ import annotations

import copy
import inspect
import json
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
import typer.main
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from queue_server.client import DEFAULT_URL, QueueClient, QueueClientError
from queue_server.client.errors import ConnectionFailedError, NoTenantError, ProblemError
from queue_server.infra.address import ADDRESS_FILE, local_data_dir, local_url
from queue_server.policy import PolicyError, PolicyFileError, ReliabilityPolicy

if TYPE_CHECKING:
    from queue_server.settings import Settings

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

Url = Annotated[
    str | None,
    typer.Option(
        "--url",
        envvar="QUEUE_SERVER_URL",
        help="The server's base URL. Default: the address the local `queue-server serve`"
        f" running on the data directory wrote to <data-dir>/{ADDRESS_FILE}, else {DEFAULT_URL}.",
        rich_help_panel="Connection",
        show_default=False,
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
        help="The operation-reliability policy document to run under (a version of your"
        " own: start from `queue-server policy new --version NAME`). Default: the built-in"
        " operation-reliability.v2.",
        show_default=False,
        dir_okay=False,
    ),
]
Wide = Annotated[
    bool, typer.Option("--wide", "-w", help="Every column in full, however wide the terminal.")
]
Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="Print only the ids, one per line.")]

# The exit status of every command, and the sentence every command's help ends with.
EXIT_OK = 0
EXIT_FAILURES = 1  # the command ran, and some of what it did failed (or was declined)
EXIT_USAGE = 2  # bad arguments or options (Click's own code for usage errors)
EXIT_UNAVAILABLE = 3  # the server could not be reached, or answered that it is unavailable
EXIT_REFUSED = 4  # the server refused: authentication, permission, validation, not found, conflict
EXIT_CODES_HELP = (
    "Exit status: 0 done; 1 failures (some of the work failed, or a question was declined);"
    " 2 usage (bad arguments); 3 the server unreachable or unavailable;"
    " 4 refused (authentication, permission, validation, not found, conflict)."
)


class CommandError(Exception):
    """A CLI-side refusal: printed as `error: title: detail`, exit `code` (default: usage)."""

    def __init__(self, title: str, detail: str = "", code: int = EXIT_USAGE) -> None:
        self.title = title
        self.detail = detail
        self.code = code
        super().__init__(f"{title}: {detail}" if detail else title)


def fail(title: str, detail: str = "", code: int = EXIT_USAGE) -> NoReturn:
    raise CommandError(title, detail, code)


def settings_from_env() -> Settings:
    """The server's settings (QUEUE_SERVER_*); ones that do not validate are a usage error
    naming each variable and what it must be, not a traceback."""
    from pydantic import ValidationError

    from queue_server.settings import Settings

    try:
        return Settings()
    except ValidationError as exc:
        fail("Invalid settings", "; ".join(_setting_error(e) for e in exc.errors()))


def _setting_error(error: Any) -> str:
    said = str(error["msg"]).removeprefix("Value error, ")
    if not error["loc"]:  # a rule across settings: its message names them
        return said
    name = f"QUEUE_SERVER_{str(error['loc'][0]).upper()}"
    return f"{name}={error['input']!r}: {said}" if "input" in error else f"{name}: {said}"


def exit_code(exc: QueueClientError) -> int:
    """The exit status for an error of the client: unavailable (3), refused (4), usage (2)."""
    if isinstance(exc, ConnectionFailedError):
        return EXIT_UNAVAILABLE
    if isinstance(exc, NoTenantError):
        return EXIT_USAGE
    if isinstance(exc, ProblemError):
        return EXIT_UNAVAILABLE if exc.status >= 500 else EXIT_REFUSED
    return EXIT_FAILURES


def problem_detail(exc: QueueClientError) -> str:
    """The server's detail, with the reason it gave for each invalid field."""
    detail = exc.detail
    body = exc.body if isinstance(exc, ProblemError) else {}
    reasons = []
    for error in body.get("errors") or ():
        if not isinstance(error, dict):
            continue
        where = ".".join(str(part) for part in error.get("loc") or ())
        reasons.append(f"{where}: {error.get('msg')}" if where else str(error.get("msg")))
    if reasons and detail.startswith("Invalid fields:"):
        return "; ".join(reasons)  # the same fields, each with its reason
    if reasons:
        detail = (detail + " " if detail else "") + "; ".join(reasons)
    return detail


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
    """Typer, with client and CLI errors printed as one line and their exit status, the exit
    statuses at the end of every command's help, and flags shown without a value hint."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        given = kwargs["args"] if "args" in kwargs else args[0] if args else None
        argv = sys.argv[1:] if given is None else list(given)  # what click will parse
        command = typer.main.get_command(self.narrowed(argv))
        _finish_help(command)
        try:
            return command(*args, **kwargs)
        except QueueClientError as exc:
            report_error(exc.title, problem_detail(exc), exc.code)
            sys.exit(exit_code(exc))
        except CommandError as exc:
            report_error(exc.title, exc.detail)
            sys.exit(exc.code)
        except PolicyFileError as exc:
            # Not a document at all (unreadable, not UTF-8, not JSON, too deep): one line.
            report_error("Not a policy document", "; ".join(r for _, r in exc.problems))
            sys.exit(EXIT_USAGE)
        except PolicyError as exc:
            report_error("Reliability policy refused", str(exc))
            sys.exit(1)

    def narrowed(self, argv: Sequence[str]) -> typer.Typer:
        """This CLI with only the command or group that `argv` names: building the whole
        tree of commands took a seventh of a command's start. Without a name (`--help`,
        `--version`) or with one it does not know (click then lists them), the whole tree."""
        name = next((arg for arg in argv if not arg.startswith("-")), None)
        groups = [group for group in self.registered_groups if group.name == name]
        commands = [
            command
            for command in self.registered_commands
            if (
                command.name
                or typer.main.get_command_name(getattr(command.callback, "__name__", ""))
            )
            == name
        ]
        if not groups and not commands:
            return self
        narrowed = copy.copy(self)
        narrowed.registered_groups = groups
        narrowed.registered_commands = commands
        return narrowed


def process_policy(path: Path | None) -> ReliabilityPolicy:
    """The policy this process runs under (--policy, QUEUE_SERVER_POLICY or the built-in one).

    A document that breaks the loader's rules stops the command with each cell named.
    """
    from queue_server.policy import runtime_policy

    return runtime_policy(path)


def _finish_help(command: Any) -> None:
    """Every command and group: the exit statuses as the help's last paragraph; flags
    (--json, --yes, --help...) take no value, so their help shows none.

    Duck-typed: Typer builds its commands on its own copy of Click.
    """
    if not command.epilog:
        command.epilog = EXIT_CODES_HELP
    if command.help:
        command.help = unwrap(command.help)
    help_option = command.get_help_option(command.context_class(command))  # built once, kept
    for param in [*command.params, help_option]:
        if getattr(param, "is_flag", False):
            param.metavar = ""
    for sub in getattr(command, "commands", {}).values():
        _finish_help(sub)


def unwrap(text: str) -> str:
    """A docstring's paragraphs as flowing text: the terminal wraps them at its own width.

    A line that starts with a space or a dash (an example's second line, a list item)
    keeps its line break; paragraphs stay apart.
    """
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(re.sub(r"\n(?=[^\s-])", " ", p) for p in paragraphs)


def _from_data_dir(data_dir: Path | None, name: str) -> str | None:
    try:
        return (local_data_dir(data_dir) / name).read_text().strip() or None
    except OSError:
        return None


def server_url(url: str | None, data_dir: Path | None = None) -> str:
    """--url or QUEUE_SERVER_URL, else the address of the local server running on the data
    directory (a `server.url` no running server holds is stale), else the default."""
    return url or local_url(local_data_dir(data_dir)) or DEFAULT_URL


def admin_key(key: str | None, data_dir: Path | None = None) -> str | None:
    """--key or QUEUE_SERVER_KEY, else the admin key a local embedded server wrote."""
    # queue_server.infra.serve.ADMIN_KEY_FILE; not imported, it would pull in the database stack.
    return key or _from_data_dir(data_dir, "admin.key")


def connect(
    url: str | None,
    key: str | None,
    data_dir: Path | None = None,
    policy: ReliabilityPolicy | None = None,
) -> QueueClient:
    """The one client factory of the CLI (its calls classified under `policy`, default: the
    one QUEUE_SERVER_POLICY names, else the built-in one)."""
    key = admin_key(key, data_dir)
    if not key:
        fail(
            "No API key",
            "pass --key, set QUEUE_SERVER_KEY, or run where the embedded server's"
            " <data-dir>/admin.key is readable",
            EXIT_REFUSED,
        )
    # A person is waiting: retry transient failures briefly, then say what went wrong.
    return QueueClient(server_url(url, data_dir), key, attempts=3, max_wait=2.0, policy=policy)


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
    url: str | None,
    key: str | None,
    data_dir: Path | None,
    tenant: str | None,
    policy: ReliabilityPolicy | None = None,
) -> Iterator[QueueClient]:
    client = connect(url, key, data_dir, policy)
    try:
        tenant_of(client, tenant)
        yield client
    finally:
        client.close()


def resolve_id(given: str, what: str, candidates: Callable[[], Iterable[str]]) -> str:
    """A whole id as given; the start or the end of exactly one of `candidates` as that id
    (a list shows an id's end: the part of a UUIDv7 that tells two apart)."""
    if len(given) >= 32:  # a whole uuid (or a key id); the server says if it exists
        return given
    part = given.lower()
    tail = part.replace("-", "")
    matches = sorted(
        {
            c
            for c in candidates()
            if c.lower().startswith(part) or c.lower().replace("-", "").endswith(tail)
        }
    )
    if len(matches) == 1:
        return matches[0]
    if not matches:
        fail(f"No {what} id starts or ends with {given!r}", code=EXIT_REFUSED)
    shown = ", ".join(matches[:5]) + (", ..." if len(matches) > 5 else "")
    fail(
        f"Ambiguous {what} id {given!r}",
        f"{len(matches)} start or end with it ({shown}); give more of it",
        code=EXIT_REFUSED,
    )


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
        return when(value)
    if isinstance(value, dict | list):
        text = json.dumps(value, ensure_ascii=False)
        return text if len(text) <= 60 else text[:57] + "..."
    return str(value)


def when(value: datetime) -> str:
    """A time in the local zone, with the zone: `2025-03-01 14:02:11 CET`."""
    local = value.astimezone()
    return local.strftime("%Y-%m-%d %H:%M:%S ") + (local.tzname() or local.strftime("%z"))


# Ids are copied into the next command: never cut, never wrapped.
ID_COLUMNS = frozenset(
    {"dead letter", "item", "watcher", "delivery key", "key", "tenant", "queue", "schedule"}
)
NARROWEST = 10  # a column other than an id is wrapped down to this width, never below


def table(
    title: str | None,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    drop: Sequence[str] = (),
    wide: bool = False,
) -> None:
    """A table whose id columns stay whole. When the terminal is too narrow, the other
    columns wrap, then the columns in `drop` go, in that order (the title says which);
    `wide` prints every column in full whatever the terminal's width."""
    texts = [[cell(v) for v in row] for row in rows]
    natural = [max([len(c), *(len(r[i]) for r in texts)]) for i, c in enumerate(columns)]
    # A column wraps down to NARROWEST, never cutting a word of its heading.
    narrowest = [
        min(natural[i], max([NARROWEST, *(len(word) for word in c.split())]))
        for i, c in enumerate(columns)
    ]
    keep = list(range(len(columns)))

    def needed(indexes: list[int], full: bool) -> int:
        widths = [natural[i] if full or columns[i] in ID_COLUMNS else narrowest[i] for i in indexes]
        return sum(widths) + 3 * len(widths) + 1  # the box's borders and padding

    out = console
    if wide:
        out = Console(highlight=False, width=max(console.width, needed(keep, full=True)))
    else:
        for name in drop:
            if needed(keep, full=False) <= console.width:
                break
            keep.remove(columns.index(name))
        if needed(keep, full=False) > console.width:
            # Still too wide with every column at its narrowest: wider than the terminal
            # (it wraps the lines) rather than an id cut short.
            out = Console(highlight=False, width=needed(keep, full=False))
    dropped = [c for i, c in enumerate(columns) if i not in keep]
    if dropped:
        note = f"(not shown: {', '.join(dropped)}; --wide shows every column)"
        title = f"{title} {note}" if title else note
    # The widths, chosen here rather than by rich (whose collapse can take a column below
    # its minimum and then overflow): the widest column that may wrap gives a character
    # at a time until the table fits or every such column is at its narrowest.
    widths = {i: natural[i] for i in keep}
    room = out.width - (3 * len(keep) + 1)
    while sum(widths.values()) > room:
        shrinkable = [i for i in keep if widths[i] > narrowest[i] and columns[i] not in ID_COLUMNS]
        if not shrinkable:
            break
        widths[max(shrinkable, key=lambda i: widths[i])] -= 1
    grid = Table(title=title, title_justify="left", header_style="bold")
    for i in keep:
        no_wrap = columns[i] in ID_COLUMNS
        grid.add_column(columns[i], no_wrap=no_wrap, overflow="fold", width=widths[i])
    for row in texts:
        grid.add_row(*(_escape(row[i]) for i in keep))
    out.print(grid)


def counted(n: int, noun: str) -> str:
    """`1 tenant`, `2 tenants`."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def ids(values: Sequence[str]) -> None:
    """--quiet: the ids alone, one per line, for the next command or a shell variable."""
    for value in values:
        sys.stdout.write(value + "\n")
    sys.stdout.flush()


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


def failure_text(failure: Any) -> str | None:
    """An item's failure ({"class", "message"}) or a delivery's last outcome
    ({"outcome", "status", "detail"...}) as one short line."""
    if not isinstance(failure, dict) or not failure:
        return None
    if "outcome" in failure:
        status = failure.get("status")
        parts = [str(failure["outcome"]) + (f" (HTTP {status})" if status else "")]
        extra = failure.get("detail") or failure.get("error") or failure.get("response_prefix")
        if extra:
            parts.append(str(extra))
        if failure.get("attempt"):
            parts.append(f"attempt {failure['attempt']}")
        return ": ".join(parts[:2]) + (f", {parts[2]}" if len(parts) > 2 else "")
    message = failure.get("message")
    kind = failure.get("class")
    if kind and message:
        return f"{kind}: {message}"
    return str(message or kind or json.dumps(failure, ensure_ascii=False))


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
