"""`queue-server tenants`: create tenants, change and show their settings (admin)."""

from __future__ import annotations

from typing import Annotated

import typer

from queue_server.cli.common import (
    CLI,
    DataDir,
    Json,
    Key,
    Url,
    connect,
    console,
    fields,
    print_json,
    tenant_session,
)
from queue_server.client import DEFAULT_URL, QueueClient

app = CLI(help="Create and inspect tenants (admin).", no_args_is_help=True)


@app.command("put")
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


@app.command("show")
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
