"""`queue-server tenants`: create tenants, change and show their settings (admin)."""

from __future__ import annotations

from typing import Annotated

import typer

from queue_server.cli.common import (
    CLI,
    DataDir,
    Json,
    Key,
    Quiet,
    Url,
    Wide,
    confirm,
    connect,
    console,
    counted,
    fail,
    fields,
    ids,
    print_json,
    table,
    tenant_session,
)
from queue_server.client import QueueClient
from queue_server.client.errors import NotFoundError
from queue_server.client.models import Tenant

# A new tenant's settings when not given (the server's defaults too).
NEW_MAX_ACQUISITIONS = 5
NEW_LEASE_TTL = 30.0
NEW_RETENTION = 7 * 24 * 3600.0
# What `tenants list` does not count (`tenants show` does).
_UNCOUNTED = {"ready", "leased", "completed", "quarantined", "cancelled"}

app = CLI(help="Create, update, list and show tenants (admin).", no_args_is_help=True)


@app.command("put")
def tenants_put(
    tenant: Annotated[str, typer.Argument(help="Tenant name.")],
    backlog_cap: Annotated[
        int | None,
        typer.Option(
            help="Most ready + leased items at once (needed for a new tenant).", show_default=False
        ),
    ] = None,
    default_max_acquisitions: Annotated[
        int | None,
        typer.Option(
            help=f"Acquisition budget of a new item [new tenant: {NEW_MAX_ACQUISITIONS}].",
            show_default=False,
        ),
    ] = None,
    default_lease_ttl: Annotated[
        float | None,
        typer.Option(
            help=f"Lease TTL in seconds [new tenant: {NEW_LEASE_TTL:g}].", show_default=False
        ),
    ] = None,
    replace: Annotated[
        bool,
        typer.Option(
            "--replace",
            help="Replace every setting: those not given go back to a new tenant's defaults.",
        ),
    ] = False,
    retention: Annotated[
        float | None,
        typer.Option(
            help="Seconds finished items are kept, then deleted with their ledgers"
            f" [new tenant: {NEW_RETENTION:g}].",
            show_default=False,
        ),
    ] = None,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Lower the cap below the backlog without asking.")
    ] = False,
    url: Url = None,
    key: Key = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Create a tenant, or change only the settings given.

    A new tenant needs --backlog-cap; the other settings start at their defaults.
    On an existing tenant the settings not given keep their values (--replace resets
    them to the defaults). A cap below the tenant's current backlog refuses every
    enqueue until the backlog falls under it: that asks first (--yes does not).

    Examples: [bold]queue-server tenants put acme --backlog-cap 10000[/bold]
              [bold]queue-server tenants put acme --default-max-acquisitions 3[/bold]
    """
    with connect(url, key, data_dir) as qs:
        try:
            current: Tenant | None = qs.get_tenant(tenant)
        except NotFoundError:
            current = None
        if current is None or replace:
            if backlog_cap is None:
                which = "--replace" if current is not None else "a new tenant"
                fail("Missing option", f"{which} needs --backlog-cap")
            cap, budget, ttl = (
                backlog_cap,
                default_max_acquisitions or NEW_MAX_ACQUISITIONS,
                default_lease_ttl or NEW_LEASE_TTL,
            )
            keep: float | None = retention or NEW_RETENTION
        else:
            if (
                backlog_cap is None
                and default_max_acquisitions is None
                and default_lease_ttl is None
                and retention is None
            ):
                fail(
                    "Nothing to change",
                    "give --backlog-cap, --default-max-acquisitions, --default-lease-ttl"
                    " or --retention",
                )
            cap = current.backlog_cap if backlog_cap is None else backlog_cap
            budget = default_max_acquisitions or current.default_max_acquisitions
            ttl = default_lease_ttl or current.default_lease_ttl
            keep = retention or current.retention
        backlog = (current.backlog or 0) if current is not None else 0
        if current is not None and cap < backlog and cap < current.backlog_cap:
            confirm(
                f"Tenant {tenant} has {backlog:,} items in its backlog: a cap of {cap:,} refuses"
                " every enqueue until it falls below. Lower the cap?",
                yes,
            )
        row = qs.put_tenant(
            tenant,
            backlog_cap=cap,
            default_max_acquisitions=budget,
            default_lease_ttl=ttl,
            retention=keep,
        )
    if json:
        print_json(row)
        return
    console.print(f"tenant [bold]{row.tenant}[/bold] {'saved' if current else 'created'}")
    fields(
        None,
        [
            ("backlog cap", _changed(row.backlog_cap, current and current.backlog_cap)),
            (
                "default max acquisitions",
                _changed(
                    row.default_max_acquisitions, current and current.default_max_acquisitions
                ),
            ),
            (
                "default lease TTL",
                _changed(
                    f"{row.default_lease_ttl:g}s", current and f"{current.default_lease_ttl:g}s"
                ),
            ),
            (
                "retention",
                _changed(_seconds(row.retention), current and _seconds(current.retention)),
            ),
        ],
    )


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:g}s"


def _changed(new: object, old: object) -> str:
    return f"{new} (was {old})" if old is not None and old != new else str(new)


@app.command("list")
def tenants_list(
    url: Url = None,
    key: Key = None,
    data_dir: DataDir = None,
    json: Json = False,
    quiet: Quiet = False,
    wide: Wide = False,
) -> None:
    """Every tenant with its backlog cap and defaults (admin).

    Example: [bold]queue-server tenants list[/bold]
    """
    with connect(url, key, data_dir) as qs:
        rows = qs.list_tenants()
    if json:
        # The list counts each tenant's backlog, not its items by state: those are left
        # out rather than shown as null (`tenants show` has them).
        print_json([row.model_dump(mode="json", exclude=_UNCOUNTED) for row in rows])
    elif quiet:
        ids([row.tenant for row in rows])
    else:
        table(
            counted(len(rows), "tenant"),
            [
                "tenant",
                "backlog",
                "cap",
                "default max acquisitions",
                "default lease TTL",
                "created",
            ],
            [
                (
                    t.tenant,
                    t.backlog,
                    t.backlog_cap,
                    t.default_max_acquisitions,
                    f"{t.default_lease_ttl:g}s",
                    t.created_at,
                )
                for t in rows
            ],
            drop=["created", "default lease TTL", "default max acquisitions"],
            wide=wide,
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
    url: Url = None,
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
