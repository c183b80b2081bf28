"""`queue-server db grant-enqueue`, `revoke-enqueue` and `grants`: which database roles may
enqueue inside their own transactions (`queue_server.enqueue`), for which tenant."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from queue_server.cli.common import (
    Json,
    console,
    err_console,
    fail,
    print_json,
    settings_from_env,
    table,
)

if TYPE_CHECKING:
    import psycopg

    from queue_server.infra.serve import RolesDatabase

Role = Annotated[
    str,
    typer.Argument(
        help="The database role (a PostgreSQL role name, as it is spelled: no quoting).",
        show_default=False,
    ),
]
Tenant = Annotated[
    str,
    typer.Option("--tenant", "-t", help="The tenant the role may enqueue for.", show_default=False),
]
DataDir = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        envvar="QUEUE_SERVER_DATA_DIR",
        help="The server's data directory (its embedded database), when"
        " QUEUE_SERVER_DATABASE_URL is not set.",
        show_default=False,
    ),
]

WHERE = """
    Runs on the server's machine against its database, as a role that may create roles:
    QUEUE_SERVER_DATABASE_URL (its role needs CREATEROLE to make a new role, and may
    grant queue_server_enqueuer), else the embedded database's superuser in --data-dir.
"""


@contextlib.contextmanager
def _administering(
    data_dir: Path | None,
) -> Iterator[tuple[RolesDatabase, psycopg.Connection[Any]]]:
    """The server's database as a role that may create roles; a refusal is the command's
    failure, with PostgreSQL's message, detail and hint."""
    import psycopg

    from queue_server.infra.address import local_data_dir
    from queue_server.infra.serve import NoDatabaseError, roles_session

    settings = settings_from_env().model_copy(update={"data_dir": local_data_dir(data_dir)})
    try:
        with roles_session(settings) as (target, conn):
            yield target, conn
    except NoDatabaseError as exc:
        fail("No database", str(exc))
    except psycopg.Error as exc:
        diag = exc.diag
        why = " ".join(
            p for p in (diag.message_primary, diag.message_detail, diag.message_hint) if p
        )
        if isinstance(exc, psycopg.errors.InsufficientPrivilege):
            fail("Not allowed", f"{why or exc} (this needs a role that may create roles).")
        fail("Refused", why or str(exc))


def grant_enqueue(
    role: Role,
    tenant: Tenant,
    own_schema: Annotated[
        bool,
        typer.Option(
            "--own-schema",
            help="Also make a schema named like ROLE and owned by it, for the application's"
            " own tables beside the queue's (first on the role's search_path).",
        ),
    ] = False,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Let database role ROLE call queue_server.enqueue and queue_server.enqueue_many for
    TENANT, inside its own transactions (EXECUTE on those two functions, no table access).

    When ROLE does not exist it is created as a LOGIN role with a generated password, and
    its postgresql:// URL is printed, once: keep it where the application reads its
    secrets. An existing role keeps its password (nothing is printed but the grant).
    Granting a second tenant to a role adds to the first.

    With --own-schema the role also gets a schema of its own, named like it: its CREATE
    TABLE lands there (the public schema takes no table from it), and its transactions
    write its rows and enqueue together.

    Example: [bold]queue-server db grant-enqueue orders_app --tenant acme --own-schema[/bold]
    """
    from queue_server.store import enqueue_grants

    password = secrets.token_urlsafe(24)
    with _administering(data_dir) as (target, conn):
        created = enqueue_grants.grant(conn, role=role, tenant=tenant, password=password)
        if own_schema:
            enqueue_grants.own_schema(conn, role=role)
        restricted = enqueue_grants.restrict_advisory_locks(conn)
    if not restricted:
        err_console.print(
            "warning: this role may not restrict advisory locks to the server's role, so"
            f" {role} could hold another tenant's queue lock; as a superuser, run once the"
            " statements of docs/transactional-enqueue.md (Isolation between tenants)",
            soft_wrap=True,
        )
    url = target.app_url(role, password) if created else None
    if json:
        body: dict[str, Any] = {"role": role, "tenant": tenant, "created": created}
        if own_schema:
            body["schema"] = role
        if url:
            body["url"] = url
        print_json(body)
        return
    console.print(f"role [bold]{role}[/bold] may enqueue for tenant [bold]{tenant}[/bold]")
    if own_schema:
        console.print(f"schema {role} is {role}'s own: its tables go there", soft_wrap=True)
    if url:
        console.print(f"created role {role}; its connection URL (shown once):", soft_wrap=True)
        console.print(url, soft_wrap=True, markup=False)


def revoke_enqueue(
    role: Role,
    tenant: Tenant,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Take back ROLE's grant to enqueue for TENANT: its next call of queue_server.enqueue
    for TENANT is refused (permission denied). With no tenant left, ROLE also stops being
    a member of queue_server_enqueuer; the role itself is kept.

    Example: [bold]queue-server db revoke-enqueue orders_app --tenant acme[/bold]
    """
    from queue_server.store import enqueue_grants

    with _administering(data_dir) as (_, conn):
        revoked = enqueue_grants.revoke(conn, role=role, tenant=tenant)
    if json:
        print_json({"role": role, "tenant": tenant, "revoked": revoked})
        return
    if not revoked:
        err_console.print(f"role {role} had no grant for tenant {tenant}: nothing to revoke")
        return
    console.print(f"role [bold]{role}[/bold] may no longer enqueue for tenant {tenant}")


def grants(
    tenant: Annotated[
        str | None, typer.Option("--tenant", "-t", help="Only this tenant's grants.")
    ] = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """List which database roles may enqueue for which tenant (queue_server.enqueue)."""
    from queue_server.store import enqueue_grants

    with _administering(data_dir) as (_, conn):
        rows = enqueue_grants.list_grants(conn, tenant=tenant)
    found = [
        {"tenant": r[0], "role": r[1], "role_exists": r[2], "granted_at": r[3].isoformat()}
        for r in rows
    ]
    if json:
        print_json({"grants": found})
        return
    if not found:
        console.print("no grants")
        return
    table(None, ["tenant", "role", "role exists", "granted at"], [list(g.values()) for g in found])


for command in (grant_enqueue, revoke_enqueue, grants):
    command.__doc__ = (command.__doc__ or "") + "\n" + WHERE
