"""`queue-server items`: one work item as it is now, and its ledger."""

from __future__ import annotations

from typing import Annotated

import typer

from queue_server.cli.common import (
    CLI,
    DataDir,
    Json,
    Key,
    Tenant,
    Url,
    fields,
    print_json,
    table,
    tenant_session,
)
from queue_server.client.models import Item, LedgerEvent

app = CLI(help="Inspect work items.", no_args_is_help=True)


def item_fields(item: Item) -> None:
    """An item as a table of its fields (also under a dead letter)."""
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


def ledger_table(item_id: str, events: list[LedgerEvent]) -> None:
    """An item's ledger, one row per transition."""
    table(
        f"ledger of {item_id}",
        ["seq", "at", "kind", "fence", "actor", "data"],
        [(e.seq, e.at, e.kind, e.fence, e.actor, e.data) for e in events],
    )


@app.command("show")
def items_show(
    item_id: Annotated[str, typer.Argument(help="Item id.")],
    url: Url = None,
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
        item_fields(item)


@app.command("ledger")
def items_ledger(
    item_id: Annotated[str, typer.Argument(help="Item id.")],
    url: Url = None,
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
        ledger_table(item_id, events)
