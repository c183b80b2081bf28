"""Alembic, driven from Python: upgrade, downgrade, and whether a database is at head."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, pool

from queue_server import migrations

MIGRATIONS_DIR = Path(migrations.__file__).parent


def sqlalchemy_url(database_url: str) -> str:
    """`postgresql://...` as SQLAlchemy's psycopg 3 dialect wants it."""
    for prefix in ("postgresql+psycopg://", "postgresql://", "postgres://"):
        if database_url.startswith(prefix):
            return "postgresql+psycopg://" + database_url[len(prefix) :]
    return database_url


def alembic_config(database_url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    # ConfigParser interpolation would read % escapes in the URL.
    config.set_main_option("sqlalchemy.url", sqlalchemy_url(database_url).replace("%", "%%"))
    return config


def upgrade(database_url: str, revision: str = "heads") -> None:
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(database_url), revision)


def head_revisions() -> set[str]:
    """Every head of the migration graph (independent features may each add one)."""
    return set(ScriptDirectory.from_config(alembic_config("")).get_heads())


def current_revisions(database_url: str) -> set[str]:
    engine = create_engine(sqlalchemy_url(database_url), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            return set(MigrationContext.configure(conn).get_current_heads())
    finally:
        engine.dispose()


def describe(revisions: set[str]) -> str:
    return ", ".join(sorted(revisions)) or "no revision"


def is_at_head(database_url: str) -> bool:
    return current_revisions(database_url) == head_revisions()
