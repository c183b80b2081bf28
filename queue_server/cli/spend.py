"""`queue-server spend`: approve and show the concurrency a queue may use."""

from __future__ import annotations

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
    console,
    fail,
    fields,
    print_json,
    tenant_session,
)

app = CLI(help="Spend approvals: the concurrency a queue may use.", no_args_is_help=True)


def parse_expiry(text: str) -> datetime:
    """`2h`, `30m`, `7d`, `90s`, or an RFC 3339 time with a zone."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if text and text[-1] in units and text[:-1].replace(".", "", 1).isdigit() and text.isascii():
        return datetime.now(UTC) + timedelta(seconds=float(text[:-1]) * units[text[-1]])
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        fail("Invalid --expires", "use a duration like 2h, 30m, 7d or an RFC 3339 time")
    if when.tzinfo is None:
        fail("Invalid --expires", "give the time zone, e.g. 2030-01-01T00:00:00Z")
    return when


@app.command("approve")
def spend_approve(
    queue: Annotated[str, typer.Argument(help="Queue name.")],
    max_concurrency: Annotated[int, typer.Option(help="Leases at once (at least 2).")],
    expires: Annotated[str, typer.Option(help="Duration (2h, 7d) or RFC 3339 time.")],
    approved_by: Annotated[str, typer.Option(help="Who approves the spend.")],
    reason: Annotated[str, typer.Option(help="Why.")],
    url: Url = None,
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


@app.command("show")
def spend_show(
    queue: Annotated[str, typer.Argument(help="Queue name.")],
    url: Url = None,
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
