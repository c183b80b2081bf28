"""`queue-server ledger`: fold every item's ledger and compare it with the item."""

from __future__ import annotations

import typer

from queue_server.cli.common import (
    CLI,
    DataDir,
    Json,
    Key,
    Tenant,
    Url,
    connect,
    console,
    err_console,
    print_json,
    table,
)

app = CLI(help="Ledger checks.", no_args_is_help=True)


@app.command("verify")
def ledger_verify(
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Fold every item's ledger and compare it with the item; exit 1 on any mismatch.

    Runs on the server (GET /v1/.../ledger-verification), page by page. Without
    --tenant, an admin key checks every tenant and a tenant key its own tenant.

    Example: [bold]queue-server ledger verify --tenant acme[/bold]
    """
    with connect(url, key, data_dir) as qs:
        every = tenant is None and qs.whoami().tenant is None
        if not every:
            scope = tenant or qs.whoami().tenant
            qs.tenant = scope
        checked = 0
        mismatches = []
        cursor: str | None = None
        with err_console.status("verifying ledgers") as spinner:
            while True:
                page = qs.verify_ledgers(all_tenants=every, cursor=cursor)
                checked += page.checked
                mismatches += page.mismatches
                spinner.update(f"verified {checked} items, {len(mismatches)} mismatches")
                cursor = page.next_cursor
                if cursor is None:
                    break
    if json:
        print_json({"checked": checked, "mismatches": mismatches})
    else:
        if mismatches:
            table(
                f"{len(mismatches)} of {checked} items disagree with their ledger",
                ["tenant", "item", "problem"],
                [(m.tenant, m.item_id, "; ".join(m.problems)) for m in mismatches],
            )
        else:
            console.print(f"{checked} items verified: every ledger folds to its item")
    if mismatches:
        raise typer.Exit(code=1)
