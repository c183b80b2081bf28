"""Database roles of an application on the queue's PostgreSQL: made, granted tenants through
`queue_server.grant_enqueue` (what `queue-server db grant-enqueue` runs), and dropped."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import quote

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

# The application's own table, beside the queue's.
ORDERS = (
    "CREATE TABLE IF NOT EXISTS orders (order_id bigint GENERATED ALWAYS AS IDENTITY"
    " PRIMARY KEY, customer text NOT NULL)"
)


@dataclass
class AppRole:
    """A login role of the application and how it connects (libpq conninfo, password set)."""

    name: str
    conninfo: str
    # The same as a postgresql:// URL (what `queue-server db grant-enqueue` prints).
    url: str

    def connect(self) -> psycopg.Connection[tuple[object, ...]]:
        return psycopg.connect(self.conninfo)


@dataclass
class Roles:
    """Makes application roles on the test's database; `drop` removes every one made."""

    database_url: str
    made: list[str] = field(default_factory=list)

    def make(self, *tenants: str, member: bool = True) -> AppRole:
        """A LOGIN role with the `orders` table; granted `tenants` (with `member` False and
        no tenant: not even a member of queue_server_enqueuer)."""
        name = f"app_{uuid.uuid4().hex[:10]}"
        password = secrets.token_urlsafe(16)
        self.made.append(name)
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            conn.execute(ORDERS)
            if tenants:
                for i, tenant in enumerate(tenants):
                    conn.execute(
                        "SELECT queue_server.grant_enqueue(%s, %s, %s)",
                        (name, tenant, password if i == 0 else None),
                    )
            else:
                conn.execute(
                    sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                        sql.Identifier(name), sql.Literal(password)
                    )
                )
                if member:
                    conn.execute(
                        sql.SQL("GRANT queue_server_enqueuer TO {}").format(sql.Identifier(name))
                    )
            conn.execute(
                sql.SQL("GRANT SELECT, INSERT ON orders TO {}").format(sql.Identifier(name))
            )
        info = conninfo_to_dict(self.database_url)
        url = (
            f"postgresql://{name}:{quote(password, safe='')}@/{info['dbname']}"
            f"?host={quote(str(info['host']), safe='')}&port={info['port']}"
        )
        return AppRole(name, make_conninfo(self.database_url, user=name, password=password), url)

    def drop(self) -> None:
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            for name in self.made:
                conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
                conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def roles_on(database_url: str) -> Iterator[Roles]:
    roles = Roles(database_url)
    try:
        yield roles
    finally:
        roles.drop()
