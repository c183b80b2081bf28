"""`queue-server policy`: print the reliability policy, start a version of one's own, verify a
document or a live server, and list the versions the server has run under."""

from __future__ import annotations

import copy
import hashlib
import json
import math
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from queue_server.cli.common import (
    CLI,
    DataDir,
    Json,
    Key,
    PolicyFile,
    Url,
    Wide,
    connect,
    console,
    counted,
    fail,
    print_json,
    process_policy,
    table,
)

app = CLI(
    help="The operation-reliability policy: show it, raise or lower one of its cells on the"
    " server (set), start a version of your own, verify a document or a server, list the"
    " versions the server has run under.",
    no_args_is_help=True,
)


@app.command("show")
def show(
    from_server: Annotated[
        bool, typer.Option("--from-server", help="Print the server's GET /v1/policy instead.")
    ] = False,
    url: Url = None,
    key: Key = None,
    data_dir: DataDir = None,
    as_json: Json = False,
    policy_file: PolicyFile = None,
) -> None:
    """Print the reliability policy: every class by every dimension. Without --from-server,
    the one this machine's processes would load (--policy FILE or QUEUE_SERVER_POLICY, else
    the built-in operation-reliability.v2), validated; its --json output is a document that
    --policy accepts. To change a value, start from `policy new --version NAME`.

    Example: [bold]queue-server policy show --json > my-policy.json[/bold]
    """
    from queue_server.policy import load_policy

    if from_server:
        with connect(url, key, data_dir) as client:
            document = client.policy()
        policy = load_policy(document)  # the server's copy must validate too
        document.pop("loaded", None)
    else:
        policy = process_policy(policy_file)
        document = policy.as_document()
    if as_json:
        print_json(document)
        return
    table(policy.version, ["class", "dimension", "value"], policy.rows())


@app.command("new")
def new(
    version: Annotated[
        str,
        typer.Option(
            "--version",
            help="The new document's version, e.g. acme.v3 (letters, digits and . _ + -);"
            " not the built-in's operation-reliability.v2.",
            show_default=False,
        ),
    ],
) -> None:
    """Print the built-in policy under a version of your own, as JSON: the starting point of
    a policy of your own. Edit it (each value within the rules `policy verify` checks), then
    run the server under it with `serve --policy FILE`.

    Example: [bold]queue-server policy new --version acme.v3 > p.json[/bold]
    """
    from queue_server.policy import POLICY_NAME, PolicyError, default_policy, load_policy

    if version == POLICY_NAME:
        fail(
            f"{POLICY_NAME} is the built-in policy",
            "a document of your own needs a version of its own",
        )
    document = {**default_policy().as_document(), "version": version}
    try:
        load_policy(document)
    except PolicyError as error:
        fail("Not a version", "; ".join(reason for _, reason in error.problems))
    print_json(document)


@app.command("verify")
def verify(
    file: Annotated[
        Path | None,
        typer.Argument(
            help="The policy document to check (default: --policy FILE, QUEUE_SERVER_POLICY,"
            " else the built-in).",
            show_default=False,
            dir_okay=False,
        ),
    ] = None,
    server: Annotated[
        str | None,
        typer.Option(
            "--server",
            help="Probe this live server's envelope instead (an admin key: --key, QUEUE_SERVER_KEY"
            " or <data-dir>/admin.key); scratch tenants are created and deleted.",
            show_default=False,
        ),
    ] = None,
    key: Key = None,
    data_dir: DataDir = None,
    policy_file: PolicyFile = None,
    as_json: Json = False,
) -> None:
    """Check one policy document (FILE, else the one this installation would load: --policy
    FILE or QUEUE_SERVER_POLICY, else the built-in operation-reliability.v2): it is total
    (every class states all ten cells, a value or not-applicable with its reason), it obeys
    the policy's rules, durable-leased-work stays inside its bounds (deadline 7 days, attempt
    timeout 1 hour, 100 acquisitions, backoff cap 24 hours), and a changed document has a
    version of its own. Each problem names its cell. With --server, probe a live deployment
    instead: each cell of its envelope is asked for just above its value and must be
    refused, naming the cell; a stale fence, another worker's name and an expired lease must
    be refused by complete, batch complete and triage; an enqueue past a tenant's backlog
    cap, a backlog cap above max-queued, a spend approval above max-approved and a watcher
    flooded past the outbox cap must be held to the policy. A probe the server cannot
    answer is reported skipped, with the reason. Scratch tenants are created and deleted
    (a few seconds: the expired-lease probe waits out a 1 s lease). In a checkout, `make contract` proves that each cell is
    enforced by the code bound to it. Exits 1 on any failure.

    Example: [bold]queue-server policy verify p.json[/bold]
    """
    if server is not None:
        _verify_server(server, key, data_dir, as_json)
        return
    from queue_server.policy import NotApplicable, PolicyError, PolicyFileError

    try:
        policy = process_policy(file or policy_file)
    except PolicyFileError:
        raise  # not a document at all: one line, exit 2
    except PolicyError as error:
        if as_json:
            problems = [{"cell": cell, "problem": reason} for cell, reason in error.problems]
            print_json({"passed": False, "problems": problems})
        else:
            table("policy problems", ["cell", "problem"], list(error.problems))
            console.print("[bold red]policy FAILED[/]")
        raise typer.Exit(code=1) from None
    cells = [policy.cell(c, d) for c, d, _ in policy.rows()]
    not_applicable = sum(isinstance(cell, NotApplicable) for cell in cells)
    if as_json:
        print_json(
            {
                "passed": True,
                **policy.loaded(),
                "cells": len(cells),
                "not_applicable": not_applicable,
                "problems": [],
            }
        )
        return
    console.print(
        f"policy {policy.describe()}: {len(cells)} cells, total ({not_applicable} not-applicable,"
        " each with its reason); its rules and bounds hold"
    )
    console.print("[bold green]policy verified[/]")


def _verify_server(url: str, key: str | None, data_dir: Path | None, as_json: bool) -> None:
    from queue_server.cli.common import EXIT_REFUSED, admin_key
    from queue_server.cli.probes import probe_server

    found = admin_key(key, data_dir)
    if not found:
        fail(
            "No API key",
            "probing needs an admin key: pass --key or set QUEUE_SERVER_KEY",
            EXIT_REFUSED,
        )
    report = probe_server(url, found)
    if as_json:
        print_json(report.as_dict())
    else:
        console.print(f"server {report.server}: policy {report.version} ({report.digest[:19]})")
        table(
            "envelope probes",
            ["", "probe", "cell", "detail"],
            [
                ("skipped" if p.skipped else "ok" if p.ok else "FAILED", p.name, p.cell, p.detail)
                for p in report.probes
            ],
        )
        for tenant, deleted in report.tenants.items():
            console.print(f"scratch tenant {tenant}: {'deleted' if deleted else 'NOT deleted'}")
        console.print(
            "[bold green]envelope verified[/]" if report.passed else "[bold red]envelope FAILED[/]"
        )
    if not report.passed:
        raise typer.Exit(code=1)


# The cells `policy set` moves on a running server (durable-leased-work, which the server
# enforces): CELL (and its short names) -> (dimension, the cell's field, integer?).
SETTABLE: dict[str, tuple[str, str, bool]] = {
    "durable-leased-work/retry": ("retry", "max-acquisitions", True),
    "durable-leased-work/deadline": ("deadline", "seconds", False),
    "durable-leased-work/attempt-timeout": ("attempt-timeout", "seconds", False),
    "durable-leased-work/backoff-and-jitter": ("backoff-and-jitter", "max-seconds", False),
    "durable-leased-work/backpressure": ("backpressure", "max-queued", True),
    "durable-leased-work/concurrency": ("concurrency", "max-approved", True),
}
SHORT_NAMES: dict[str, str] = {
    "attempts": "durable-leased-work/retry",
    "max-acquisitions": "durable-leased-work/retry",
    "deadline": "durable-leased-work/deadline",
    "lease-ttl": "durable-leased-work/attempt-timeout",
    "attempt-timeout": "durable-leased-work/attempt-timeout",
    "backoff-cap": "durable-leased-work/backoff-and-jitter",
    "backlog": "durable-leased-work/backpressure",
    "max-approved": "durable-leased-work/concurrency",
}


def derived_version(base: str, document: dict[str, Any]) -> str:
    """The name of a version derived from `base`: its name before any `+`, then `+` and the
    first 12 hex digits of the sha256 of the classes (the same content, the same name)."""
    canonical = json.dumps(document["classes"], sort_keys=True, separators=(",", ":"))
    return f"{base.split('+', 1)[0][:87]}+{hashlib.sha256(canonical.encode()).hexdigest()[:12]}"


@app.command("set")
def set_cell(
    cell: Annotated[
        str,
        typer.Argument(
            help="The cell: durable-leased-work/retry (attempts), /deadline (deadline),"
            " /attempt-timeout (lease-ttl), /backoff-and-jitter (backoff-cap),"
            " /backpressure (backlog), /concurrency (max-approved).",
            show_default=False,
        ),
    ],
    value: Annotated[
        str,
        typer.Argument(
            help="Its new value: seconds, or a count for attempts, backlog and max-approved.",
            show_default=False,
        ),
    ],
    reason: Annotated[
        str,
        typer.Option("--reason", help="Why: kept in the history.", show_default=False),
    ],
    version: Annotated[
        str | None,
        typer.Option(
            "--version",
            help="The new version's name (default: the loaded one's, + a digest of the content).",
            show_default=False,
        ),
    ] = None,
    url: Url = None,
    key: Key = None,
    data_dir: DataDir = None,
    as_json: Json = False,
) -> None:
    """Raise or lower one cell of the server's policy (an admin key): a new version is made
    from the one the server runs with that value, checked as `policy verify` checks a file
    (the decision's rules, and durable-leased-work's bounds: deadline 7 days, attempt
    timeout 1 hour, 100 acquisitions, backoff cap 24 hours), published with your key and
    --reason, and run by the server at once (every server process started without --policy
    when the publication's notification reaches it, and after a restart). `policy history`
    shows who set what and why. The workers, `deliver` and the SDK load their own policy at
    start: give them the new version with
    `policy show --from-server --json > p.json` and --policy p.json when they need it (a
    worker's lease TTL above 30 s does). Exits 1 when the value breaks a rule, naming the cell.

    Examples: [bold]queue-server policy set attempts 25 --reason "imports retry for a day"[/bold]
              [bold]queue-server policy set deadline 7200 --reason "reports run two hours"[/bold]
              [bold]queue-server policy set backlog 100000 --reason "the nightly batch"[/bold]
    """
    from queue_server.policy import PolicyError, load_policy

    name = SHORT_NAMES.get(cell, cell)
    if name not in SETTABLE:
        fail(
            f"Not a cell policy set moves: {cell}",
            "one of " + ", ".join([*SETTABLE, *SHORT_NAMES]),
        )
    dimension, field, integer = SETTABLE[name]
    number = _number(value, integer, name)
    with connect(url, key, data_dir) as client:
        served = client.policy()
        served.pop("loaded", None)
        loaded = load_policy(served)  # the server's copy must validate too
        document = copy.deepcopy(loaded.as_document())
        cell_doc = document["classes"]["durable-leased-work"][dimension]
        before = cell_doc.get(field)
        if before == number:
            console.print(f"{name} {field} is already {value} in {loaded.version}: nothing to set")
            return
        cell_doc[field] = number
        document["version"] = version or derived_version(loaded.version, document)
        try:
            load_policy(document)
        except PolicyError as error:
            table(
                f"{name} {field}={value}: policy problems",
                ["cell", "problem"],
                list(error.problems),
            )
            console.print("[bold red]policy not set[/]")
            raise typer.Exit(code=1) from None
        published = client.publish_policy(document, reason=reason)
    _until_every_process_runs(url, key, data_dir, published.version)
    if as_json:
        print_json(
            {
                **published.model_dump(mode="json"),
                "cell": name,
                "field": field,
                "before": before,
                "value": number,
            }
        )
        return
    console.print(
        f"policy {published.version} ({published.sha256[:12]}): {name} {field}"
        f" {_shown(before)} -> {_shown(number)}, published by {published.published_by}"
        f" ({published.reason}) and loaded"
    )


# The process that took the publication runs it at once; the server's other processes read
# it when the policy channel's notification reaches them (within their policy poll
# interval, QUEUE_SERVER_POLICY_POLL_INTERVAL, 5 s by default, if their listener was down).
# Each check is a new connection, so that it may reach any of them.
SETTLE_CHECKS = 8
SETTLE_SECONDS = 30.0


def _until_every_process_runs(url: str | None, key: str | None, data_dir: Path | None,
                              version: str) -> None:  # fmt: skip
    """Returns once SETTLE_CHECKS answers in a row, each on a new connection, report
    `version` (or after SETTLE_SECONDS, saying so)."""
    deadline = time.monotonic() + SETTLE_SECONDS
    running = 0
    while running < SETTLE_CHECKS:
        with connect(url, key, data_dir) as client:
            running = running + 1 if client.policy().get("version") == version else 0
        if running < SETTLE_CHECKS and time.monotonic() > deadline:
            console.print(
                f"[yellow]not every server process reported {version} within"
                f" {SETTLE_SECONDS:.0f} s; each reads it within its policy poll interval[/]"
            )
            return
        if running == 0:
            time.sleep(0.5)


def _number(value: str, integer: bool, cell: str) -> int | float:
    try:
        number = int(value) if integer else float(value)
    except ValueError:
        kind = "a whole number" if integer else "a number of seconds"
        fail(f"Not {kind}: {value}", f"{cell} takes {kind}")
    if not math.isfinite(number) or number <= 0:
        fail(f"Not a positive value: {value}", f"{cell} takes a positive value")
    return int(number) if not integer and float(number).is_integer() else number


def _shown(value: object) -> str:
    return "unset" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


@app.command("history")
def history(
    url: Url = None,
    key: Key = None,
    data_dir: DataDir = None,
    as_json: Json = False,
    wide: Wide = False,
) -> None:
    """Every policy version the server has run under or an admin has published (admin),
    the latest first: its sha256, where it was loaded from, its first and last load, how many
    process loads, who published it and why (`policy set`), and which one the server runs
    under now.

    Example: [bold]queue-server policy history[/bold]
    """
    with connect(url, key, data_dir) as client:
        versions = client.policy_history()
    if as_json:
        print_json({"versions": versions})
        return
    table(
        counted(len(versions), "policy version"),
        [
            "version",
            "sha256",
            "source",
            "first loaded",
            "last loaded",
            "loads",
            "published by",
            "reason",
            "current",
        ],
        [
            (
                v.version,
                v.sha256[:12],
                v.source,
                v.first_loaded_at,
                v.last_loaded_at,
                v.loads,
                v.published_by or "",
                v.reason or "",
                "yes" if v.current else "",
            )
            for v in versions
        ],
        drop=("first loaded", "source", "sha256", "loads", "last loaded"),
        wide=wide,
    )
