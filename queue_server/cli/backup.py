"""`queue-server backup` and `queue-server restore`: base backups of the embedded database
into its backup repository (Barman), and point-in-time restore into a new data directory.

Run on the server's machine, as the server's account: they read the repository directory
(and the data directory's note of it), not the API."""

from __future__ import annotations

import shutil
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from queue_server.cli.common import (
    CLI,
    EXIT_FAILURES,
    EXIT_UNAVAILABLE,
    Json,
    console,
    fail,
    print_json,
    table,
)
from queue_server.infra import backup

app = CLI(
    help="Backups of the embedded database (Barman): create, list and check them. Restore"
    " with `queue-server restore`; docs/backup.md.",
    no_args_is_help=True,
)

BackupRepo = Annotated[
    Path | None,
    typer.Option(
        "--backup-repo",
        envvar="QUEUE_SERVER_BACKUP_REPO",
        help="The backup repository. Default: the one the local server streams into"
        " (`serve --backup-repo`, noted in <data-dir>/backup.repo).",
        show_default=False,
    ),
]
ServerDataDir = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        envvar="QUEUE_SERVER_DATA_DIR",
        help="The local server's data directory, where its backup repository is noted.",
        show_default=False,
    ),
]


def repository(repo: Path | None, data_dir: Path | None) -> backup.Repository:
    """--backup-repo, else the repository the local server noted in its data directory."""
    from queue_server.infra.address import local_data_dir

    if repo is not None:
        found = backup.Repository(repo)
    else:
        where = local_data_dir(data_dir)
        noted = backup.noted_repository(where)
        if noted is None:
            fail(
                "No backup repository is configured",
                f"the server of {where} streams into none: start it with"
                " `queue-server serve --backup-repo DIR` (or set QUEUE_SERVER_BACKUP_REPO),"
                " or pass --backup-repo DIR",
            )
        found = noted
    try:
        return found.require()
    except backup.BackupError as exc:
        fail("Not a backup repository", str(exc))


def _live(repo: backup.Repository) -> bool:
    """Whether the database the repository backs up is running."""
    from queue_server.infra.serve import NoDatabaseError, embedded_postgres

    pgdata = repo.live_pgdata()
    try:
        return pgdata is not None and embedded_postgres(pgdata).is_running()
    except NoDatabaseError:
        return False


def _require_live(repo: backup.Repository) -> None:
    """The repository's database is running (a base backup reads it)."""
    if not _live(repo):
        data_dir = repo.live_data_dir()
        fail(
            "The database is not running",
            f"a backup reads the running database of {data_dir}: start it with"
            f" `queue-server serve --data-dir {data_dir} --backup-repo {repo.root}`",
            EXIT_UNAVAILABLE,
        )


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    return f"{size:.1f} TiB"


def _when(moment: datetime | None) -> str:
    return moment.astimezone(UTC).isoformat(timespec="seconds") if moment else "-"


def _row(b: backup.Backup) -> dict[str, object]:
    return {
        "backup_id": b.backup_id,
        "kind": b.kind,
        "status": b.status,
        "parent": b.parent,
        "begin_time": _when(b.begin_time) if b.begin_time else None,
        "end_time": _when(b.end_time) if b.end_time else None,
        "size_bytes": b.size,
    }


@app.command("create")
def backup_create(
    incremental: Annotated[
        bool,
        typer.Option(
            "--incremental",
            help="Copy only what changed since the newest backup (PostgreSQL's incremental"
            " backup); a restore combines the chain again.",
        ),
    ] = False,
    backup_repo: BackupRepo = None,
    data_dir: ServerDataDir = None,
    json: Json = False,
) -> None:
    """Take a base backup of the running embedded database into its repository, wait
    until the WAL it needs is archived, then expire backups past the retention.

    Examples: [bold]queue-server backup create[/bold]
              [bold]queue-server backup create --incremental[/bold]
    """
    repo = repository(backup_repo, data_dir)
    _require_live(repo)
    before = {b.backup_id for b in repo.backups()}
    if incremental and not any(b.good for b in repo.backups()):
        fail(
            "No backup to build on",
            "an incremental backup copies what changed since the newest one, and there is"
            " none yet: run `queue-server backup create` first",
        )
    args = ["backup", backup.SERVER, "--wait", "--wait-timeout", str(backup.ARCHIVE_TIMEOUT)]
    if incremental:
        args += ["--incremental", "latest"]
    started = time.monotonic()
    try:
        if not repo.archived_wal():
            # Barman's first backup wants a WAL segment in the archive already: one now,
            # rather than once the server has written 16 MiB.
            repo.archive_current()
        repo.barman(*args, timeout=3600)
    except backup.BackupError as exc:
        fail("The backup failed", str(exc), EXIT_FAILURES)
    elapsed = time.monotonic() - started
    # Retention (and the archive of the WAL streamed meanwhile), as the server's maintenance does.
    repo.barman("cron", timeout=600, check=False)
    made = [b for b in repo.backups() if b.backup_id not in before]
    if not made or not made[-1].good:
        fail("The backup failed", f"see {repo.root / 'barman.log'}", EXIT_FAILURES)
    new = made[-1]
    if json:
        print_json({**_row(new), "seconds": round(elapsed, 3)})
        return
    console.print(f"backup {new.backup_id} ({new.kind}, {_size(new.size)}) done in {elapsed:.1f} s")
    console.print(f"restorable from {_when(new.end_time)} on")


@app.command("list")
def backup_list(
    backup_repo: BackupRepo = None,
    data_dir: ServerDataDir = None,
    json: Json = False,
) -> None:
    """List the repository's base backups, oldest first, and how far its WAL reaches.

    Example: [bold]queue-server backup list[/bold]
    """
    repo = repository(backup_repo, data_dir)
    backups = repo.backups()
    received, archived = _moment(repo.last_wal_at()), _moment(repo.last_archived_at())
    if json:
        print_json(
            {
                "backups": [_row(b) for b in backups],
                "wal_received_until": _when(received) if received else None,
                "wal_archived_until": _when(archived) if archived else None,
            }
        )
        return
    table(
        f"{len(backups)} backups in {repo.root}",
        ["backup", "kind", "status", "ended", "size"],
        [(b.backup_id, b.kind, b.status, _when(b.end_time), _size(b.size)) for b in backups],
    )
    console.print(
        f"WAL received until {_when(received)} (restorable up to then),"
        f" archived in complete segments until {_when(archived)}"
    )


def _moment(epoch: float | None) -> datetime | None:
    return datetime.fromtimestamp(epoch, UTC) if epoch is not None else None


@app.command("check")
def backup_check(
    backup_repo: BackupRepo = None,
    data_dir: ServerDataDir = None,
    json: Json = False,
) -> None:
    """Verify the repository: a complete backup exists and its files match its manifest
    (pg_verifybackup), no WAL segment is missing since the oldest backup, and Barman's own
    checks of the running database pass (streaming, slot, receiver). Exit 1 on a failure.

    Example: [bold]queue-server backup check[/bold]
    """
    repo = repository(backup_repo, data_dir)
    checks: list[tuple[str, bool, str]] = []
    newest = repo.last_good_backup()
    checks.append(
        (
            "complete backup",
            newest is not None,
            f"{newest.backup_id}, ended {_when(newest.end_time)}" if newest else "none",
        )
    )
    if newest is not None:
        verified = repo.barman("verify-backup", backup.SERVER, newest.backup_id, check=False)
        said = (verified.stdout + verified.stderr).strip().splitlines()
        checks.append(
            (
                "backup files match the manifest",
                verified.returncode == 0,
                said[-1] if said else "",
            )
        )
    repo.barman("archive-wal", backup.SERVER, timeout=120, check=False)
    gaps = repo.wal_gaps()
    checks.append(
        (
            "WAL archive complete",
            not gaps,
            f"missing {len(gaps)} segments: {', '.join(gaps[:3])}" if gaps else "no gap",
        )
    )
    barman = repo.barman("check", backup.SERVER, timeout=120, check=False)
    for line in barman.stdout.splitlines():
        name, sep, result = line.strip().partition(": ")
        if sep and result.split(" ")[0] in ("OK", "FAILED"):
            checks.append((name, result.startswith("OK"), result.partition(" ")[2].strip("()")))
    failed = [c for c in checks if not c[1]]
    if json:
        print_json(
            {
                "ok": not failed,
                "checks": [{"check": n, "ok": ok, "detail": d} for n, ok, d in checks],
            }
        )
    else:
        table(
            f"{repo.root}: {'every check passed' if not failed else f'{len(failed)} failed'}",
            ["check", "result", "detail"],
            [(n, "ok" if ok else "FAILED", d) for n, ok, d in checks],
        )
    if failed:
        raise typer.Exit(code=EXIT_FAILURES)


def parse_target(text: str) -> datetime | None:
    """`latest`, or an RFC 3339 / ISO 8601 time (UTC when it names no zone)."""
    if text.strip().lower() == "latest":
        return None
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        fail(
            "--to",
            f"{text!r} is neither `latest` nor a time such as 2026-12-03T09:30:00Z"
            " (`date -u +%FT%TZ` prints the present one)",
        )
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment


def restore(
    to: Annotated[
        str,
        typer.Option(
            "--to",
            help="The moment to restore: a time (RFC 3339, e.g. 2026-12-03T09:30:00Z; UTC"
            " when no zone is given): every transaction committed before it, none after; or"
            " `latest`: everything the repository holds.",
            show_default=False,
        ),
    ],
    data_dir: Annotated[
        Path,
        typer.Option(
            "--data-dir",
            help="A NEW data directory to restore into (absent or empty; never the live one).",
            show_default=False,
        ),
    ],
    backup_repo: Annotated[
        Path | None,
        typer.Option(
            "--backup-repo",
            envvar="QUEUE_SERVER_BACKUP_REPO",
            help="The backup repository. Default: the one the live server streams into"
            " (noted in its data directory: --from-data-dir).",
            show_default=False,
        ),
    ] = None,
    from_data_dir: Annotated[
        Path | None,
        typer.Option(
            "--from-data-dir",
            envvar="QUEUE_SERVER_DATA_DIR",
            help="The live server's data directory, where its backup repository is noted"
            " (when --backup-repo is not given).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Restore the embedded database, as it was at a moment, into a new data directory,
    and print how to start a server on it. The live data directory is never touched.

    The newest backup that ended before the moment is restored, then the archived WAL is
    replayed up to it; the restored database is started once to finish the recovery and
    gets a new admin key (<data-dir>/admin.key; the keys of the moment keep working).

    Examples: [bold]queue-server restore --to 2026-12-03T09:30:00Z --data-dir /srv/qs-restored[/bold]
              [bold]queue-server restore --to latest --data-dir /srv/qs-restored[/bold]
    """
    target = parse_target(to)
    repo = repository(backup_repo, from_data_dir)
    new = data_dir.expanduser().resolve()
    live = repo.live_data_dir()
    if live is not None and (new == live or live in new.parents or new in live.parents):
        fail(
            "--data-dir",
            f"{new} is (or holds, or is inside) the live data directory {live}: restore"
            " into a new directory, then start a server on it",
        )
    if new == repo.root or repo.root in new.parents or new in repo.root.parents:
        # Inside it, Barman's own files would be restored into; around it, a restore's
        # first step (an empty directory) could never hold.
        fail(
            "--data-dir",
            f"{new} is (or holds, or is inside) the backup repository {repo.root}: restore"
            " into a directory of its own",
        )
    if new.exists() and (not new.is_dir() or any(new.iterdir())):
        fail("--data-dir", f"{new} exists and is not empty: restore into a new directory")
    started = time.monotonic()
    try:
        chosen = repo.choose(target)
    except backup.BackupError as exc:
        fail("Nothing to restore", str(exc), EXIT_FAILURES)
    what = "latest" if target is None else target.astimezone(UTC).isoformat()
    console.print(f"restoring backup {chosen.backup_id} and its WAL to {what} into {new}")
    from queue_server.infra.serve import DataDirInUseError, NoDatabaseError, finish_restore

    made = not new.exists()
    try:
        if _live(repo):
            # The moment may be in the last seconds: the server's WAL until now, archived.
            repo.archive_current()
        new.mkdir(parents=True, exist_ok=True)
        repo.restore(chosen, target, new / "pgdata")
        finish_restore(new)
    except (backup.BackupError, NoDatabaseError, DataDirInUseError, RuntimeError) as exc:
        # Nothing half-restored left behind: the same command can run again.
        if made:
            shutil.rmtree(new, ignore_errors=True)
        elif new.exists():
            for child in new.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
        fail("The restore failed", str(exc), EXIT_FAILURES)
    elapsed = time.monotonic() - started
    console.print(f"restored in {elapsed:.1f} s: {new} is a queue-server data directory")
    console.print(f"admin key: {new / 'admin.key'} (a new one; the restored keys still work)")
    console.print("start a server on it:")
    console.print(f"  queue-server serve --data-dir {new}")
    console.print(f'  (in a checkout: make serve ARGS="--data-dir {new}")')
