"""`queue-server keys`: create and revoke API keys (admin)."""

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
    connect,
    console,
    counted,
    fail,
    ids,
    print_json,
    resolve_id,
    table,
)

KEY_ID_LENGTH = 16  # queue_server.auth.new_key: 8 random bytes, in hex

app = CLI(help="Create and revoke API keys (admin).", no_args_is_help=True)


@app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Argument(help="Tenant the key belongs to.")],
    role: Annotated[str, typer.Option(help="worker or operator.")] = "worker",
    url: Url = None,
    key: Key = None,
    data_dir: DataDir = None,
    json: Json = False,
    quiet: Annotated[
        bool,
        typer.Option("--quiet", "-q", help="Print only the secret (e.g. WORKER=$(...)))."),
    ] = False,
) -> None:
    """Create an API key; its secret is printed once.

    Example: [bold]queue-server keys create acme --role operator[/bold]
    """
    if role not in ("worker", "operator"):
        fail("Invalid role", "--role must be worker or operator")
    with connect(url, key, data_dir) as qs:
        created = qs.create_key("worker" if role == "worker" else "operator", tenant=tenant)
    if json:
        print_json(created)
        return
    if quiet:
        ids([created.secret])
        return
    console.print(f"{created.role} key [bold]{created.key_id}[/bold] for {created.tenant}")
    console.print("secret (shown once; store it now):")
    console.print(created.secret, soft_wrap=True)


@app.command("list")
def keys_list(
    tenant: Annotated[str, typer.Argument(help="Tenant the keys belong to.")],
    revoked: Annotated[bool, typer.Option("--revoked", help="Also the revoked keys.")] = False,
    url: Url = None,
    key: Key = None,
    data_dir: DataDir = None,
    json: Json = False,
    quiet: Quiet = False,
    wide: Wide = False,
) -> None:
    """A tenant's API keys: id, role, created (never a secret).

    Example: [bold]queue-server keys list acme[/bold]
    """
    with connect(url, key, data_dir) as qs:
        found = qs.list_keys(tenant, revoked=revoked)
    if json:
        print_json(found)
    elif quiet:
        ids([k.key_id for k in found])
    else:
        table(
            f"{counted(len(found), 'key')} of {tenant}",
            ["key", "role", "created", "revoked"],
            [(k.key_id, k.role, k.created_at, k.revoked_at) for k in found],
            drop=["revoked", "created"],
            wide=wide,
        )


@app.command("revoke")
def keys_revoke(
    tenant: Annotated[str, typer.Argument(help="Tenant the key belongs to.")],
    key_id: Annotated[
        str, typer.Argument(help="The key id (not the secret), or a prefix of exactly one.")
    ],
    url: Url = None,
    key: Key = None,
    data_dir: DataDir = None,
) -> None:
    """Revoke an API key; it is refused from the next request on.

    Example: [bold]queue-server keys revoke acme 3f2a9c0d1e4b5a6f[/bold]
    """
    with connect(url, key, data_dir) as qs:
        if len(key_id) < KEY_ID_LENGTH:  # a prefix: the one live key of the tenant it names
            key_id = resolve_id(key_id, "key", lambda: [k.key_id for k in qs.list_keys(tenant)])
        qs.revoke_key(key_id, tenant=tenant)
    console.print(f"key {key_id} revoked")
