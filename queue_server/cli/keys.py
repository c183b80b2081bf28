"""`queue-server keys`: create and revoke API keys (admin)."""

from __future__ import annotations

from pathlib import Path
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
    settings_from_env,
    table,
)

KEY_ID_LENGTH = 16  # queue_server.auth.new_key: 8 random bytes, in hex

app = CLI(
    help="Create, list and revoke API keys (admin); rotate the admin key (on the server's"
    " machine).",
    no_args_is_help=True,
)


@app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Argument(help="Tenant the key belongs to.")],
    role: Annotated[str, typer.Option(help="worker or operator.")] = "worker",
    name: Annotated[
        str | None,
        typer.Option(help="A name shown beside the key's id in ledgers (e.g. billing-worker)."),
    ] = None,
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

    Example: [bold]queue-server keys create acme --role operator --name on-call[/bold]
    """
    if role not in ("worker", "operator"):
        fail("Invalid role", "--role must be worker or operator")
    with connect(url, key, data_dir) as qs:
        created = qs.create_key(
            "worker" if role == "worker" else "operator", tenant=tenant, name=name
        )
    if json:
        print_json(created)
        return
    if quiet:
        ids([created.secret])
        return
    from rich.markup import escape

    named = f" ({escape(created.name)})" if created.name else ""
    console.print(f"{created.role} key [bold]{created.key_id}[/bold]{named} for {created.tenant}")
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
    """A tenant's API keys: id, role, name, created (never a secret).

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
            ["key", "role", "name", "created", "revoked"],
            [(k.key_id, k.role, k.name, k.created_at, k.revoked_at) for k in found],
            drop=["revoked", "created", "name"],
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


@app.command("create-admin")
def keys_create_admin(
    url: Url = None,
    key: Key = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Create another admin key (admin); its secret is printed once.

    A second admin can then revoke the first (`keys revoke-admin`), and the other way round.

    Example: [bold]queue-server keys create-admin[/bold]
    """
    with connect(url, key, data_dir) as qs:
        created = qs.create_admin_key()
    if json:
        print_json(created)
        return
    console.print(f"admin key [bold]{created.key_id}[/bold]")
    console.print("secret (shown once; store it now):")
    console.print(created.secret, soft_wrap=True)


@app.command("revoke-admin")
def keys_revoke_admin(
    key_id: Annotated[str, typer.Argument(help="The admin key's id (not the secret).")],
    url: Url = None,
    key: Key = None,
    data_dir: DataDir = None,
) -> None:
    """Revoke an admin key (admin), at once in every API process. The last one cannot be.

    Example: [bold]queue-server keys revoke-admin 3f2a9c0d1e4b5a6f[/bold]
    """
    with connect(url, key, data_dir) as qs:
        qs.revoke_admin_key(key_id)
    console.print(f"admin key {key_id} revoked")


@app.command("rotate-admin")
def keys_rotate_admin(
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data-dir",
            envvar="QUEUE_SERVER_DATA_DIR",
            help="The server's data directory: admin.key is replaced there.",
            show_default=False,
        ),
    ] = None,
    revoke_all: Annotated[
        bool,
        typer.Option(
            "--revoke-all", help="Revoke every other admin key too (a leaked or lost key)."
        ),
    ] = False,
    print_admin_key: Annotated[
        bool, typer.Option("--print-admin-key", help="Also print the new secret.")
    ] = False,
    json: Json = False,
) -> None:
    """Replace the admin key in <data-dir>/admin.key: a new secret, written readable only by
    you (0600); the old key is revoked in the same transaction, at once in every API process.

    Runs on the server's machine and needs its database, not a key: the embedded one in the
    data directory, or QUEUE_SERVER_DATABASE_URL. So it also works when the key was lost.

    Examples: [bold]queue-server keys rotate-admin[/bold]
              [bold]queue-server keys rotate-admin --revoke-all[/bold]
    """
    from queue_server.infra.address import local_data_dir
    from queue_server.infra.serve import (
        DataDirInUseError,
        NoDatabaseError,
        database_for_admin,
        rotate_admin_key,
    )

    settings = settings_from_env().model_copy(update={"data_dir": local_data_dir(data_dir)})
    try:
        with database_for_admin(settings) as database_url:
            done = rotate_admin_key(settings, database_url, revoke_all=revoke_all)
    except NoDatabaseError as exc:
        fail("No database", str(exc))
    except DataDirInUseError as exc:  # a server starting on it: it is running in a moment
        fail("Data directory in use", f"{exc} Run this again once it serves.")
    if json:
        body: dict[str, object] = {
            "key_id": done.key_id,
            "revoked": done.revoked,
            "path": str(done.path),
        }
        if print_admin_key:
            body["secret"] = done.secret
        print_json(body)
        return
    console.print(
        f"new admin key [bold]{done.key_id}[/bold], written to {done.path}", soft_wrap=True
    )
    console.print(f"revoked: {', '.join(done.revoked) or 'none'}")
    if print_admin_key:
        console.print(done.secret, soft_wrap=True)
