"""Running the server: the embedded database, migrations, the admin key file, uvicorn,
the metrics listener.

The admin key's secret is written, readable only by the server's user, to
`<data-dir>/admin.key`, and never printed unless asked (`--print-admin-key`): a log
that keeps it (docker compose keeps every line) would be a second copy to guard.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import psycopg
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

from queue_server import auth, db, errors
from queue_server.infra import backup, migrate
from queue_server.infra.budget import Budget, ConnectionBudgetError, Limits, plan
from queue_server.infra.metrics import (
    approval_families,
    backup_families,
    figure_families,
    horizon_families,
    multiprocess_dir,
    objective_family,
    table_families,
)
from queue_server.services import figures
from queue_server.services.keys import Keys
from queue_server.settings import Settings
from queue_server.store import bootstrap, enqueue_grants
from queue_server.store.bootstrap import DATABASE_NAME, SERVER_ROLE
from queue_server.store.health import CONNECTION_LIMITS

if TYPE_CHECKING:
    # Imported where it is used: the `embedded` extra is optional (the image leaves it out).
    from queue_server.infra.embedded import EmbeddedPostgres

log = logging.getLogger(__name__)

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


# With a backup repository: WAL a replica (and Barman's receiver) can follow, WAL summaries
# for incremental backups (PostgreSQL 17+), and room for the receiver and a base backup.
BACKUP_SERVER_SETTINGS = {
    "wal_level": "replica",
    "summarize_wal": "on",
    "max_wal_senders": "10",
    "max_replication_slots": "10",
}


def embedded_postgres(
    pgdata: Path, *, backups: bool = False, max_connections: int | None = None
) -> EmbeddedPostgres:
    """The embedded cluster under `pgdata` (set up for WAL streaming to a backup repository
    with `backups`; started with `max_connections` if given, else PostgreSQL's default);
    NoDatabaseError when embedded-postgres is absent."""
    try:
        from queue_server.infra.embedded import EmbeddedPostgres
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] != "embedded_postgres":
            raise
        raise NoDatabaseError(NO_DATABASE) from None
    server_settings = dict(BACKUP_SERVER_SETTINGS) if backups else {}
    if max_connections is not None:
        server_settings["max_connections"] = str(max_connections)
    return EmbeddedPostgres(
        pgdata,
        server_settings=server_settings,
        replication_role=bootstrap.BACKUP_ROLE if backups else None,
    )


class DataDirInUseError(RuntimeError):
    """Another process serves (or administers) the embedded database of this data directory."""


LOCK_FILE = "server.lock"


class DataDirLock:
    """The exclusive lock of one data directory (`flock` on `<data-dir>/server.lock`), held by
    the process that runs its embedded PostgreSQL. The kernel releases it when that process
    ends, however it ends: a crashed server's lock never stops the next start. The file says
    who holds it (pid, and the URL once serving) for the refusal's message."""

    def __init__(self, data_dir: Path, fd: int) -> None:
        self.data_dir = data_dir
        self._fd = fd

    def note(self, url: str | None) -> None:
        text = json.dumps({"pid": os.getpid(), "url": url}).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, text, 0)


def _holder(fd: int) -> tuple[int | None, str | None]:
    try:
        held = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return held.get("pid"), held.get("url")
    except (OSError, ValueError, AttributeError):
        return None, None


@contextlib.contextmanager
def data_dir_lock(data_dir: Path) -> Iterator[DataDirLock]:
    """Hold `data_dir` for this process; DataDirInUseError naming the holder if another has it."""
    data_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid, url = _holder(fd)
            who = f"pid {pid}" if pid else "another process"
            where = f"already running at {url} ({who})" if url else f"in use by {who}"
            raise DataDirInUseError(
                f"queue-server is {where} on the data directory {data_dir}: stop it first,"
                " or give this one a --data-dir of its own."
            ) from None
        lock = DataDirLock(data_dir, fd)
        lock.note(None)
        yield lock
    finally:
        os.close(fd)


@dataclass
class ServedDatabase:
    url: str
    embedded: EmbeddedPostgres | None
    lock: DataDirLock | None = None


def admin_key_path(data_dir: Path) -> Path:
    return data_dir / ADMIN_KEY_FILE


def own_database(pg: EmbeddedPostgres, *, backups: bool = False) -> str:
    """The server's role and its database on the embedded cluster (made as the superuser,
    which the server then never uses); the URL the server connects with, as that role.
    With `backups`, the local backup's role too."""
    with psycopg.connect(pg.url(), autocommit=True) as conn:
        bootstrap.ensure_role(conn, pg.role_password(SERVER_ROLE))
        bootstrap.ensure_database(conn)
        if backups:
            bootstrap.ensure_backup_role(conn, pg.role_password(bootstrap.BACKUP_ROLE))
    with psycopg.connect(pg.url(DATABASE_NAME), autocommit=True) as conn:
        bootstrap.hand_over(conn)
    return pg.url(DATABASE_NAME, user=SERVER_ROLE)


def schema_revisions(database_url: str) -> set[str]:
    """The revisions the database's schema is at (without alembic: see `migrate`)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        return bootstrap.schema_revisions(conn)


@contextlib.contextmanager
def database(settings: Settings, *, max_connections: int | None = None) -> Iterator[ServedDatabase]:
    """The configured database; with no URL, an embedded one in the data directory, migrated,
    started with `max_connections` (infra/budget.py sizes it for the processes it serves;
    one already running keeps its own)."""
    if settings.database_url:
        current = schema_revisions(settings.database_url)
        if current != migrate.head_revisions():
            raise SchemaNotAtHeadError(
                f"The database schema is at {migrate.describe(current)}, not at"
                f" {migrate.describe(migrate.head_revisions())}: run `queue-server db upgrade` first."
            )
        if settings.backup_repo is not None:
            raise NoDatabaseError(
                "--backup-repo backs up the embedded database; an external PostgreSQL"
                " (QUEUE_SERVER_DATABASE_URL) is backed up with its own tools (docs/backup.md)"
            )
        yield ServedDatabase(url=settings.database_url, embedded=None)
        return
    backups = settings.backup_repo is not None
    pg = embedded_postgres(
        settings.data_dir / "pgdata", backups=backups, max_connections=max_connections
    )
    # One process runs a data directory's PostgreSQL: a second `serve` on it would stop the
    # first one's database when it stops its own (it is the same one).
    from queue_server.infra.embedded import EmbeddedPostgresError  # there: pg is one

    with data_dir_lock(settings.data_dir) as lock:
        try:
            pg.start()
        except EmbeddedPostgresError as exc:  # it says what to do: no traceback around it
            raise NoDatabaseError(str(exc)) from None
        try:
            url = own_database(pg, backups=backups)
            if schema_revisions(url) != migrate.head_revisions():
                try:
                    migrate.upgrade_apart(url)
                except migrate.MigrationError as exc:
                    raise NoDatabaseError(str(exc)) from None
            # As the superuser, once the tables exist: advisory locks are the server's only.
            with psycopg.connect(pg.url(DATABASE_NAME), autocommit=True) as conn:
                enqueue_grants.restrict_advisory_locks(conn)
            yield ServedDatabase(url=url, embedded=pg, lock=lock)
        finally:
            pg.stop()


@contextlib.contextmanager
def archiving(settings: Settings, served: ServedDatabase) -> Iterator[backup.WalStreaming | None]:
    """With a backup repository: Barman's configuration for the embedded database, written
    into the repository, and its WAL streaming while the server runs (stopped, after the
    last segment is archived, before the database stops)."""
    if served.embedded is None:
        yield None
        return
    if settings.backup_repo is None:
        backup.note_repository(settings.data_dir, None)
        # Nothing reads the backup's replication slot any more: it would keep every WAL
        # segment from now on, until the disk is full.
        with psycopg.connect(served.embedded.url(), autocommit=True) as conn:
            if bootstrap.drop_replication_slot(conn, backup.SLOT):
                log.warning(
                    "WAL archiving is off (no --backup-repo): dropped the replication slot"
                    " %s; the repository's backups cannot be restored past this point",
                    backup.SLOT,
                )
        yield None
        return
    pg = served.embedded
    repo = backup.Repository(settings.backup_repo)
    try:
        repo.configure(
            data_dir=settings.data_dir,
            pgdata=pg.pgdata,
            socket_dir=pg.socket_dir,
            port=pg.port,
            passfile=pg.password_file,
            bin_dir=pg.bin_dir,
            role=bootstrap.BACKUP_ROLE,
            retention=backup.parse_retention(settings.backup_retention),
        )
    except (backup.BackupError, ValueError) as exc:
        raise NoDatabaseError(str(exc)) from None
    backup.note_repository(settings.data_dir, repo)
    with backup.WalStreaming(repo, settings.backup_maintenance_interval) as streaming:
        yield streaming


def finish_restore(data_dir: Path, timeout: float = 600.0) -> None:
    """Make the database Barman restored into `data_dir`/pgdata a working data directory:
    start it until its recovery reaches the target and it is promoted, then give it a new
    admin key (`data_dir`/admin.key; the restored keys keep working) and stop it.
    BackupError says why the recovery did not end."""
    from queue_server.infra.embedded import EmbeddedPostgresError

    pg = embedded_postgres(data_dir / "pgdata")
    pg.adopt()
    with data_dir_lock(data_dir):
        try:
            pg.start()
        except EmbeddedPostgresError as exc:
            raise backup.BackupError(_recovery_failure(pg) or str(exc)) from None
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    with psycopg.connect(pg.url(), autocommit=True, connect_timeout=5) as conn:
                        if not bootstrap.in_recovery(conn):
                            break
                except psycopg.OperationalError:
                    if not pg.is_running():
                        raise backup.BackupError(
                            _recovery_failure(pg) or f"PostgreSQL stopped:\n{pg.log_tail()}"
                        ) from None
                if time.monotonic() > deadline:
                    raise backup.BackupError(
                        f"the recovery did not end in {timeout:.0f} s:\n{pg.log_tail()}"
                    )
                time.sleep(0.2)
        except BaseException:
            pg.stop()
            raise
    settings = Settings(data_dir=data_dir, database_url="", backup_repo=None)
    with database(settings) as served:
        rotate_admin_key(settings, served.url, revoke_all=False)


def _recovery_failure(pg: EmbeddedPostgres) -> str | None:
    tail = pg.log_tail(20_000)
    if "recovery ended before configured recovery target was reached" in tail:
        return (
            "the repository's WAL ends before that moment (nothing was committed between"
            " the last WAL it received and then): restore --to latest for everything it holds"
        )
    return None


def _one_connection(settings: Settings, url: str) -> db.Database:
    """The API's pool (its session settings) with one connection: for one transaction,
    without opening (and configuring) the API's `pool_min_size` connections first."""
    one = settings.model_copy(update={"pool_min_size": 1, "pool_max_size": 1})
    return db.Database.for_api(one, url)


def create_admin_key(settings: Settings, url: str) -> str | None:
    """Create the first admin key; returns its secret, or None if an admin key exists."""

    async def create() -> str | None:
        pool = _one_connection(settings, url)
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
        write_secret(admin_key_path(settings.data_dir), secret)
    return secret


def write_secret(path: Path, secret: str) -> None:
    """Write `secret` to `path`, readable and writable by this user only (0600), atomically:
    a reader sees the old file or the new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(secret + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        staged.chmod(0o600)
        os.replace(staged, path)
    finally:
        staged.unlink(missing_ok=True)


@dataclass
class Rotation:
    key_id: str
    secret: str
    revoked: list[str]
    path: Path


def rotate_admin_key(settings: Settings, url: str, *, revoke_all: bool) -> Rotation:
    """A new admin key in `<data-dir>/admin.key`; the key that file held (or, with
    `revoke_all`, every other admin key) revoked in the same transaction."""
    path = admin_key_path(settings.data_dir)
    old: str | None = None
    if path.exists():
        with contextlib.suppress(errors.UnauthorizedError):
            old = auth.parse_bearer("Bearer " + path.read_text().strip())
    key = auth.new_key()

    async def rotate() -> list[str]:
        pool = _one_connection(settings, url)
        await pool.open(wait=True)
        try:
            return await Keys(pool).rotate_admin_key(key, revoke=old, revoke_all=revoke_all)
        finally:
            await pool.close()

    revoked = asyncio.run(rotate())
    # Committed: the old key is refused everywhere now; the file gets the new one.
    write_secret(path, key.secret)
    return Rotation(key_id=key.key_id, secret=key.secret, revoked=revoked, path=path)


@contextlib.contextmanager
def database_for_admin(settings: Settings) -> Iterator[str]:
    """The server's database for an administrative command on its machine: the URL, or the
    embedded one in the data directory (used as it runs, else started and stopped again)."""
    if settings.database_url:
        yield settings.database_url
        return
    pg = embedded_postgres(settings.data_dir / "pgdata")
    if not (pg.pgdata / "PG_VERSION").exists():
        raise NoDatabaseError(
            f"No embedded database in {settings.data_dir} (and QUEUE_SERVER_DATABASE_URL is"
            " not set): run this where `queue-server serve` keeps its data (--data-dir)."
        )
    if pg.is_running():
        yield pg.url(DATABASE_NAME, user=SERVER_ROLE)
        return
    with database(settings) as served:
        yield served.url


@dataclass(frozen=True)
class RolesDatabase:
    """A session that may create roles, and how an application's role reaches the same
    database: `app_url(role, password)`."""

    url: str
    host: str | None
    port: int | None
    dbname: str
    options: dict[str, str]

    def app_url(self, role: str, password: str) -> str:
        """A postgresql:// URL for `role` on this database (a Unix socket as `host=`)."""
        auth = f"{quote(role, safe='')}:{quote(password, safe='')}"
        query = dict(self.options)
        netloc = ""
        if self.host and not self.host.startswith("/"):
            netloc = f"[{self.host}]" if ":" in self.host else self.host
            if self.port is not None:
                netloc += f":{self.port}"
        else:
            if self.host:
                query["host"] = self.host
            if self.port is not None:
                query["port"] = str(self.port)
        tail = "&".join(f"{k}={quote(v, safe='/')}" for k, v in query.items())
        return f"postgresql://{auth}@{netloc}/{quote(self.dbname, safe='')}" + (
            f"?{tail}" if tail else ""
        )


# What an application's URL keeps of the administrator's: where and how to connect, not who.
_KEPT_OPTIONS = ("sslmode", "sslrootcert", "target_session_attrs", "connect_timeout")


@contextlib.contextmanager
def database_for_roles(settings: Settings) -> Iterator[RolesDatabase]:
    """The server's database as a role that may create roles and grant them: the URL's
    (QUEUE_SERVER_DATABASE_URL, whose role needs CREATEROLE for a new role), or the
    embedded cluster's superuser (started and stopped again when it is not running)."""
    from psycopg.conninfo import conninfo_to_dict

    if settings.database_url:
        url = settings.database_url.replace("postgresql+psycopg://", "postgresql://", 1)
        info = conninfo_to_dict(url)
        port = info.get("port")
        yield RolesDatabase(
            url=url,
            host=str(info["host"]) if info.get("host") else None,
            port=int(str(port)) if port else None,
            dbname=str(info.get("dbname") or info.get("user") or "postgres"),
            options={k: str(info[k]) for k in _KEPT_OPTIONS if info.get(k)},
        )
        return
    pg = embedded_postgres(settings.data_dir / "pgdata")
    if not (pg.pgdata / "PG_VERSION").exists():
        raise NoDatabaseError(
            f"No embedded database in {settings.data_dir} (and QUEUE_SERVER_DATABASE_URL is"
            " not set): run this where `queue-server serve` keeps its data (--data-dir)."
        )

    def embedded() -> RolesDatabase:
        return RolesDatabase(
            url=pg.url(DATABASE_NAME),
            host=str(pg.socket_dir),
            port=pg.port,
            dbname=DATABASE_NAME,
            options={},
        )

    if pg.is_running():
        yield embedded()
        return
    with database(settings):
        yield embedded()


@contextlib.contextmanager
def roles_session(settings: Settings) -> Iterator[tuple[RolesDatabase, psycopg.Connection[Any]]]:
    """A session on `database_for_roles` (autocommit), for `queue-server db`'s grants."""
    with (
        database_for_roles(settings) as target,
        psycopg.connect(target.url, autocommit=True) as conn,
    ):
        yield target, conn


class _DatabaseFigures:
    """A prometheus_client collector: the figures of every tenant, read at each scrape on a
    connection of its own."""

    def __init__(
        self, database_url: str, objectives: dict[str, float], approval_warning: float
    ) -> None:
        self.database_url = database_url
        self.objectives = objectives
        self.approval_warning = timedelta(seconds=approval_warning)

    async def _read(self) -> figures.Snapshot:
        async with db.direct_session(self.database_url) as conn:
            return await figures.snapshot(conn, tenant=None, approval_warning=self.approval_warning)

    def collect(self) -> Iterator[Metric]:
        try:
            snapshot = asyncio.run(self._read())
        except psycopg.Error as exc:
            log.warning("metrics listener: could not read the figures: %s", exc)
            return
        yield from figure_families(snapshot.tenants, snapshot.queues, snapshot.watchers)
        yield from approval_families(snapshot.approvals)
        yield from horizon_families(snapshot.horizon)
        yield from table_families(snapshot.tables)
        yield objective_family(self.objectives)
        repo = os.environ.get("QUEUE_SERVER_BACKUP_REPO")
        if repo:
            yield from backup_families(backup.Repository(Path(repo)).ages())


def parse_address(address: str) -> tuple[str, int]:
    """`HOST:PORT` (IPv6 in brackets) as (host, port); ValueError names what is wrong."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{address!r} is not HOST:PORT, e.g. 127.0.0.1:9100")
    return host.strip("[]"), int(port)


def start_metrics_listener(
    address: str,
    database_url: str,
    objectives: dict[str, float],
    approval_warning: float = 86400.0,
) -> None:
    """Publish every process's metrics and every tenant's figures, without a key, at
    http://`address`/metrics (a daemon thread of this process).

    The address should be one that only the monitoring network reaches: what it
    publishes names tenants, queues and watchers.
    """
    host, port = parse_address(address)
    registry = CollectorRegistry()
    directory = multiprocess_dir()
    if directory is None:
        raise RuntimeError("the metrics listener needs the multiprocess directory set first")
    MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    registry.register(_DatabaseFigures(database_url, objectives, approval_warning))
    start_http_server(port, addr=host, registry=registry)


def read_limits(conninfo: str) -> Limits:
    """The database's max_connections and its reserved slots (`reserved_connections`
    is PostgreSQL 16's; older servers have none); ConnectionBudgetError if they cannot be read."""
    try:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=10) as conn:
            row = conn.execute(CONNECTION_LIMITS).fetchone()
    except psycopg.Error as exc:
        raise ConnectionBudgetError(
            f"Could not read the database's max_connections to size the pools: {exc}"
        ) from None
    assert row is not None
    return Limits(max_connections=row[0], reserved=row[1])


def connection_budget(
    settings: Settings, conninfo: str, *, processes: int, metrics_listener: bool
) -> Budget:
    """The budget of `serve` on the database at `conninfo` (its limits read now, unless it is
    a transaction pooler's)."""
    pooled = settings.database_pooler == "transaction"
    limits = None if pooled else read_limits(conninfo)
    return plan(settings, limits, processes=processes, metrics_listener=metrics_listener)
