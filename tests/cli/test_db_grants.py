"""`queue-server db grant-enqueue`, `grants` and `revoke-enqueue` against the server's real
database: a new role is made with a password whose URL is printed once and works; the grant
is per tenant and taken back at once."""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest

from queue_server.client import enqueue_in, errors
from tests.helpers.api import Api, setup_tenant
from tests.helpers.cli import Cli
from tests.helpers.roles import Roles


def test_grant_enqueue_makes_a_login_role_prints_its_url_once_and_revoke_takes_it_back(
    cli: Cli, database_url: str
) -> None:
    cli.env["QUEUE_SERVER_DATABASE_URL"] = database_url
    roles = Roles(database_url)
    name = f"app_{uuid.uuid4().hex[:10]}"
    roles.made.append(name)
    try:
        done = cli.run("db", "grant-enqueue", name, "--tenant", "acme")
        [url] = [line for line in done.stdout.splitlines() if line.startswith("postgresql://")]
        assert url.startswith(f"postgresql://{name}:")
        assert f"role {name} may enqueue for tenant acme" in done.stdout
        # The URL connects as the new role, which enqueues in its own transaction.
        with psycopg.connect(url) as conn:
            assert conn.info.user == name
            item_id = enqueue_in(conn, "acme", "emails", {"order": 1}, key="order-1")
        listed = cli.api.operator.get("/v1/tenants/acme/items").json()["items"]
        assert [i["item_id"] for i in listed] == [item_id]

        # Granted again (another tenant's grant would add to it): no new password, no URL.
        again = cli.run("db", "grant-enqueue", name, "--tenant", "acme")
        assert "postgresql://" not in again.stdout
        # Another tenant's grant is not listed under this one's.
        setup_tenant(cli.api.url, cli.api.admin, "beta")
        theirs = f"app_{uuid.uuid4().hex[:10]}"
        roles.made.append(theirs)
        cli.run("db", "grant-enqueue", theirs, "--tenant", "beta")
        assert [g["role"] for g in cli.json("db", "grants", "--tenant", "beta")["grants"]] == [
            theirs
        ]
        cli.run("db", "revoke-enqueue", theirs, "--tenant", "beta")
        assert cli.json("db", "grants", "--tenant", "acme")["grants"] == [
            {
                "tenant": "acme",
                "role": name,
                "role_exists": True,
                "granted_at": cli.json("db", "grants")["grants"][0]["granted_at"],
            }
        ]

        listing = cli.run("db", "grants").stdout
        assert "acme" in listing
        assert name in listing
        revoked = cli.run("db", "revoke-enqueue", name, "--tenant", "acme")
        assert f"role {name} may no longer enqueue for tenant acme" in revoked.stdout
        with psycopg.connect(url) as conn, pytest.raises(errors.EnqueueNotGrantedError) as denied:
            enqueue_in(conn, "acme", "emails", {"order": 2}, key="order-2")
        assert denied.value.sqlstate == "42501"
        nothing = cli.run("db", "revoke-enqueue", name, "--tenant", "acme")
        assert "nothing to revoke" in nothing.stderr
        assert cli.json("db", "grants")["grants"] == []
    finally:
        roles.drop()


def test_grant_enqueue_for_an_unknown_tenant_or_a_reserved_name_fails_clearly(
    cli: Cli, database_url: str
) -> None:
    cli.env["QUEUE_SERVER_DATABASE_URL"] = database_url
    unknown = cli.run("db", "grant-enqueue", "app_nobody", "--tenant", "nope", ok=False)
    assert unknown.returncode == 2
    assert "No tenant is named nope" in unknown.stderr + unknown.stdout
    reserved = cli.run("db", "grant-enqueue", "pg_monitor", "--tenant", "acme", ok=False)
    assert reserved.returncode == 2
    assert "No role can be named 'pg_monitor'" in reserved.stderr + reserved.stdout
    with psycopg.connect(database_url) as conn:
        assert (
            conn.execute("SELECT 1 FROM pg_roles WHERE rolname = 'app_nobody'").fetchone() is None
        )


def test_the_db_commands_say_what_they_do(cli: Cli) -> None:
    text = cli.run("db", "grant-enqueue", "--help").stdout
    assert "generated password" in text
    assert "QUEUE_SERVER_DATABASE_URL" in text
    assert "revoke" in cli.run("db", "--help").stdout
    assert "no tenant left" in cli.run("db", "revoke-enqueue", "--help").stdout.lower()
    assert "Only this tenant" in cli.run("db", "grants", "--help").stdout


# Every form of taking an advisory lock, on the key of another tenant's queue lock (and of
# the concurrency announcement beside it): what `acquire` takes, spelled by anyone.
TAKE_ANOTHER_TENANTS_LOCK = (
    "SELECT pg_advisory_lock(hashtextextended('beta/dosq', 7))",
    "SELECT pg_advisory_lock_shared(hashtextextended('beta/dosq', 7))",
    "SELECT pg_try_advisory_lock(hashtextextended('beta/dosq', 7))",
    "SELECT pg_advisory_xact_lock(hashtextextended('beta/dosq', 7))",
    "SELECT pg_try_advisory_xact_lock_shared(hashtext('beta/dosq'), 100)",
    "SELECT pg_advisory_lock(hashtext('queue-server-deliveries-in-flight'))",
)


def test_an_enqueue_role_cannot_take_another_tenants_queue_or_admission_lock(
    cli: Cli, database_url: str, api: Api
) -> None:
    cli.env["QUEUE_SERVER_DATABASE_URL"] = database_url
    beta = setup_tenant(api.url, api.admin, "beta")
    beta.enqueue("dosq", {"n": 1})
    roles = Roles(database_url)
    name = f"app_{uuid.uuid4().hex[:10]}"
    roles.made.append(name)
    try:
        done = cli.run("db", "grant-enqueue", name, "--tenant", "acme")
        assert "warning" not in done.stderr
        [url] = [line for line in done.stdout.splitlines() if line.startswith("postgresql://")]
        with psycopg.connect(url, autocommit=True) as conn:
            for statement in TAKE_ANOTHER_TENANTS_LOCK:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(statement)
            # The admission lock is a row lock on the tenant: no table is readable, and
            # queue_server.enqueue takes it only for a tenant granted to the role.
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT 1 FROM tenants WHERE tenant_id = 'beta' FOR NO KEY UPDATE")
            with pytest.raises(errors.EnqueueNotGrantedError):
                enqueue_in(conn, "beta", "dosq", {"n": 2}, key="squat")
            # Its own tenant's admission, held open: beta's workers do not wait for it.
            with conn.transaction():
                enqueue_in(conn, "acme", "emails", {"order": 1}, key="order-1")
                started = time.monotonic()
                assert len(beta.acquire("dosq")) == 1
                assert time.monotonic() - started < 2
    finally:
        roles.drop()


ORDERS = (
    "CREATE TABLE orders (order_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,"
    " customer text NOT NULL)"
)


def test_with_own_schema_the_role_creates_its_table_and_commits_an_order_with_its_item(
    cli: Cli, database_url: str, api: Api
) -> None:
    cli.env["QUEUE_SERVER_DATABASE_URL"] = database_url
    roles = Roles(database_url)
    plain, owner = (f"app_{uuid.uuid4().hex[:10]}" for _ in range(2))
    roles.made += [plain, owner]
    try:
        # Without a schema of its own the role may enqueue, but not make its table.
        bare = cli.json("db", "grant-enqueue", plain, "--tenant", "acme")
        with (
            psycopg.connect(bare["url"]) as conn,
            pytest.raises(psycopg.errors.InsufficientPrivilege, match="schema public"),
        ):
            conn.execute(ORDERS)

        made = cli.json("db", "grant-enqueue", owner, "--tenant", "acme", "--own-schema")
        assert made["schema"] == owner
        with psycopg.connect(made["url"]) as conn:
            conn.execute(ORDERS)
            conn.commit()
            row = conn.execute(
                "INSERT INTO orders (customer) VALUES ('ada') RETURNING order_id"
            ).fetchone()
            assert row is not None
            item_id = enqueue_in(conn, "acme", "emails", {"order": row[0]}, key="order-1")
            conn.commit()
            where = conn.execute("SELECT 'orders'::regclass::text").fetchone()
        assert where == ("orders",)  # found first on the role's own search_path
        with psycopg.connect(database_url) as conn:
            schema = conn.execute(
                "SELECT relnamespace::regnamespace::text FROM pg_class WHERE oid = %s::regclass",
                (f"{owner}.orders",),
            ).fetchone()
        assert schema == (owner,)
        listed = cli.api.operator.get("/v1/tenants/acme/items").json()["items"]
        assert [i["item_id"] for i in listed] == [item_id]
        # Again: the schema is kept (it is the role's already).
        assert cli.json("db", "grant-enqueue", owner, "--tenant", "acme", "--own-schema")
        # A schema of that name that is another role's is not taken over.
        taken = f"app_{uuid.uuid4().hex[:10]}"
        roles.made.append(taken)
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {taken}")
        refused = cli.run(
            "db", "grant-enqueue", taken, "--tenant", "acme", "--own-schema", ok=False
        )
        assert "belongs to another role" in refused.stderr
    finally:
        roles.drop()
