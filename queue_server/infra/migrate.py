"""Alembic, driven from Python: upgrade, downgrade, and whether a database is at head.

Alembic and SQLAlchemy are imported by the functions that run migrations, not by this
module. A server process only asks which revisions are the heads, read here from the
revision files themselves (which revisions the database is at is one query of the
store), and `serve` upgrades in a child process: none of its processes carries both
libraries (about 30 MB each)."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Set as AbstractSet
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from queue_server import migrations

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_DIR = Path(migrations.__file__).parent


def sqlalchemy_url(database_url: str) -> str:
    """`postgresql://...` as SQLAlchemy's psycopg 3 dialect wants it."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if database_url.startswith(prefix):
            return "postgresql+psycopg://" + database_url[len(prefix) :]
    return database_url


def alembic_config(database_url: str) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # ConfigParser interpolation would read % escapes in the URL.
    config.set_main_option("sqlalchemy.url", sqlalchemy_url(database_url).replace("%", "%%"))
    return config


def upgrade(database_url: str, revision: str = "heads") -> None:
    from alembic import command

    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str = "base") -> None:
    from alembic import command

    command.downgrade(alembic_config(database_url), revision)


def _assigned(path: Path, name: str) -> object:
    """The literal a revision file assigns to `name` at module level (`revision`,
    `down_revision`), as alembic reads it from the imported module."""
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        targets: list[ast.expr]
        if isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        elif isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return ast.literal_eval(value)
    raise ValueError(f"{path.name} assigns no {name}")


@cache
def head_revisions() -> frozenset[str]:
    """Every head of the migration graph (independent features may each add one)."""
    return heads_of(MIGRATIONS_DIR / "versions")


def heads_of(versions: Path) -> frozenset[str]:
    """The revisions in `versions` that no other names as its down revision."""
    revisions: set[str] = set()
    below: set[str] = set()
    for path in versions.glob("*.py"):
        if path.name == "__init__.py":
            continue
        revision = _assigned(path, "revision")
        down = _assigned(path, "down_revision")
        if not isinstance(revision, str):
            raise ValueError(f"{path.name}: revision is not a string")
        revisions.add(revision)
        if isinstance(down, str):
            below.add(down)
        elif isinstance(down, tuple | list):  # a merge revision
            below.update(str(each) for each in down)
    return frozenset(revisions - below)


def current_revisions(database_url: str) -> set[str]:
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import create_engine, pool

    engine = create_engine(sqlalchemy_url(database_url), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            return set(MigrationContext.configure(conn).get_current_heads())
    finally:
        engine.dispose()


def upgrade_apart(database_url: str) -> None:
    """Upgrade to head in a child process: a long-lived process (the server's supervisor)
    never loads alembic and SQLAlchemy for it."""
    # The URL holds a password: on the child's stdin, never on its command line.
    child = subprocess.run(
        [sys.executable, "-m", "queue_server.infra.migrate"],
        input=database_url,
        capture_output=True,
        text=True,
        check=False,
    )
    if child.returncode != 0:
        raise MigrationError(f"the schema upgrade failed:\n{child.stderr.strip()}")


class MigrationError(Exception):
    """A schema upgrade run apart did not finish."""


def describe(revisions: AbstractSet[str]) -> str:
    return ", ".join(sorted(revisions)) or "no revision"


def is_at_head(database_url: str) -> bool:
    return current_revisions(database_url) == head_revisions()


if __name__ == "__main__":  # upgrade_apart's child: the URL on stdin
    upgrade(sys.stdin.read().strip())
