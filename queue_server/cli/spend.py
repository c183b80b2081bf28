"""`queue-server spend`: approve, list, revoke and show the concurrency a queue may use."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer

from queue_server.cli.common import (
    CLI,
    DataDir,
    Json,
    Key,
    Tenant,
    Url,
    Wide,
    console,
    counted,
    fail,
    fields,
    print_json,
    resolve_id,
    table,
    tenant_session,
    when,
)
from queue_server.client.models import Concurrency

app = CLI(help="Spend approvals: the concurrency a queue may use.", no_args_is_help=True)


def parse_expiry(text: str) -> datetime:
    """`2h`, `30m`, `7d`, `90s`, or an RFC 3339 time with a zone."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if text and text[-1] in units and text[:-1].replace(".", "", 1).isdigit() and text.isascii():
        return datetime.now(UTC) + timedelta(seconds=float(text[:-1]) * units[text[-1]])
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        fail("Invalid --expires", "use a duration like 2h, 30m, 7d or an RFC 3339 time")
    if at.tzinfo is None:
        fail("Invalid --expires", "give the time zone, e.g. 2030-01-01T00:00:00Z")
    return at


@app.command("approve")
def spend_approve(
    queue: Annotated[str, typer.Argument(help="Queue name.")],
    max_concurrency: Annotated[
        int, typer.Option(help="Leases at once (at least 2, at most the policy's max-approved).")
    ],
    expires: Annotated[
        str, typer.Option(help="Duration (2h, 7d) or RFC 3339 time, at most a year ahead.")
    ],
    reason: Annotated[str, typer.Option(help="Why.")],
    approved_by: Annotated[
        str | None,
        typer.Option(hidden=True, help="Removed: the key you call with is the approver."),
    ] = None,
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Approve more than one concurrent lease on a queue until the approval expires. The
    key you call with is recorded as the approver.

    Example: [bold]queue-server spend approve emails --max-concurrency 8 --expires 7d
    --reason "launch week"[/bold]
    """
    if approved_by is not None:
        fail(
            "--approved-by is gone",
            "the approval records the key you call with (its id and role); leave it out",
        )
    expires_at = parse_expiry(expires)
    with tenant_session(url, key, data_dir, tenant) as qs:
        approval = qs.approve_spend(
            queue,
            max_concurrency=max_concurrency,
            expires_at=expires_at,
            reason=reason,
        )
    if json:
        print_json(approval)
        return
    console.print(
        f"{approval.queue}: up to {approval.max_concurrency} leases until"
        f" {when(approval.expires_at)} (approval {approval.approval_id},"
        f" by key {approval.approved_by}, {approval.approved_by_role})"
    )


@app.command("list")
def spend_list(
    queue: Annotated[str, typer.Argument(help="Queue name.")],
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
    wide: Wide = False,
) -> None:
    """The queue's spend approvals, live, expired and revoked, newest first.

    Example: [bold]queue-server spend list emails[/bold]
    """
    with tenant_session(url, key, data_dir, tenant) as qs:
        found = qs.spend_approvals(queue)
    if json:
        print_json(found)
        return
    table(
        f"{counted(len(found), 'spend approval')} of {queue}",
        ["approval", "max", "live", "by key", "role", "expires", "revoked", "reason"],
        [
            (
                a.approval_id,
                a.max_concurrency,
                "yes" if a.live else "no",
                a.approved_by,
                a.approved_by_role,
                a.expires_at,
                a.revoked_at,
                a.reason,
            )
            for a in found
        ],
        drop=["reason", "role", "revoked"],
        wide=wide,
    )


@app.command("revoke")
def spend_revoke(
    queue: Annotated[str, typer.Argument(help="Queue name.")],
    approval_id: Annotated[
        str, typer.Argument(help="The approval id, or a prefix of exactly one of the queue's.")
    ],
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Revoke a spend approval: from the next acquire on, the queue leases at most its limit
    without it (one, unless another approval lives).

    Example: [bold]queue-server spend revoke emails 3f2a9c1e[/bold]
    """
    with tenant_session(url, key, data_dir, tenant) as qs:
        whole = resolve_id(
            approval_id,
            "spend approval",
            lambda: [a.approval_id for a in qs.spend_approvals(queue)],
        )
        approval = qs.revoke_spend_approval(queue, whole)
        limit = qs.concurrency(queue).limit
    if json:
        print_json(approval)
        return
    console.print(
        f"{approval.queue}: approval {approval.approval_id} revoked"
        f" by key {approval.revoked_by}; the queue's limit is now {limit}"
    )


def _time(value: object) -> object:
    """An approval's time as every table shows times (the JSON has it as ISO 8601)."""
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            return when(datetime.fromisoformat(value))
    return value


@app.command("show")
def spend_show(
    queue: Annotated[str, typer.Argument(help="Queue name.")],
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """The queue's concurrency limit and what sets it (the approved limit, the queue's own
    concurrency below it), its active leases and the approval behind the limit, with a
    warning while that approval expires within the server's warning window.

    Example: [bold]queue-server spend show emails[/bold]
    """
    with tenant_session(url, key, data_dir, tenant) as qs:
        info = qs.concurrency(queue)
    if json:
        print_json(info)
        return
    _show(info)


def _show(info: Concurrency) -> None:
    approval = info.approval or {}
    if info.warning:
        console.print(f"[yellow]warning:[/yellow] {info.warning}")
    fields(
        f"queue {info.queue}",
        [
            ("limit", info.limit),
            ("approved limit", info.approved_limit),
            ("queue's concurrency", info.concurrency if info.concurrency else "approved limit"),
            ("active leases", info.active_leases),
            ("approval", approval.get("approval_id")),
            ("approved by", approval.get("approved_by")),
            ("role", approval.get("approved_by_role")),
            ("expires", _time(approval.get("expires_at"))),
            ("reason", approval.get("reason")),
        ],
    )


@app.command("concurrency")
def spend_concurrency(
    queue: Annotated[str, typer.Argument(help="Queue name.")],
    concurrency: Annotated[
        int | None,
        typer.Argument(
            min=1,
            show_default=False,
            help="Leases at once, at most the approved limit; leave out with --follow-approval.",
        ),
    ] = None,
    follow_approval: Annotated[
        bool,
        typer.Option(
            "--follow-approval", help="Drop the queue's own value: lease up to the approved limit."
        ),
    ] = False,
    reason: Annotated[str, typer.Option(help="Why, kept in the queue's ledger.")] = "",
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Set the queue's concurrency live (an operator key): from the next acquire on it leases
    at most that many at once. It stays at most the approved limit (a live spend approval's,
    else one): above it the server refuses (exit 4); `spend approve` raises it first. When
    the approval lapses the queue falls to one at a time and the expiry is in its ledger.

    Examples: [bold]queue-server spend approve emails --max-concurrency 8 --expires 30d --reason "launch"[/bold]
              [bold]queue-server spend concurrency emails 4 --reason "the provider throttles us"[/bold]
              [bold]queue-server spend concurrency emails --follow-approval[/bold]
    """
    if (concurrency is None) == (not follow_approval):
        fail("Give a concurrency or --follow-approval", "one of the two, not both")
    with tenant_session(url, key, data_dir, tenant) as qs:
        info = qs.set_concurrency(queue, None if follow_approval else concurrency, reason=reason)
    if json:
        print_json(info)
        return
    _show(info)
