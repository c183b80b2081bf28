"""Backups of the embedded PostgreSQL and point-in-time restore, with Barman.

Barman (PyPI `barman`, EDB's backup and recovery manager) runs on this machine, without
ssh, as the server's own account, from a configuration we write into the repository:

- while `queue-server serve --backup-repo DIR` runs, `barman receive-wal` streams the
  database's WAL into DIR over a replication slot (PostgreSQL's own pg_receivewal), and
  `barman cron` moves it into the archive, expires backups past their retention and
  restarts the receiver if it stopped (`WalStreaming`);
- `queue-server backup create` is `barman backup` (PostgreSQL's pg_basebackup; with
  `--incremental`, PostgreSQL 17+'s incremental backup, combined again on restore by
  pg_combinebackup);
- `queue-server restore` is `barman restore --target-time` into a new directory.

The repository holds everything the data directory's PostgreSQL holds (its password
file too): keep it as private as the data directory (it is made 0700). The layout:

    DIR/barman.conf          written by `serve` at every start
    DIR/repository.json      the data directory it backs up (restore never writes there)
    DIR/barman/queue-server  Barman's own: base backups (meta/, base/), WAL (wals/, streaming/)
    DIR/barman.log           Barman's log; DIR/receive-wal.log the receiver's output

Why Barman and not pgBackRest: docs/backup.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pwd
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

log = logging.getLogger(__name__)

SERVER = "queue-server"  # Barman's name for the one server a repository backs up
SLOT = "queue_server_backup"  # the replication slot the WAL receiver reads
CONFIG = "barman.conf"
STATE = "repository.json"
# In a data directory: the repository its server streams into (the backup commands read it).
NOTE = "backup.repo"
# Seconds the last WAL segment may take to reach the archive (a backup's end, a stop).
ARCHIVE_TIMEOUT = 60

_CLOSED = re.compile(r"The WAL file ([0-9A-F]{24}) has been closed")
_RETENTION = re.compile(r"^\s*(\d+)\s*([dwm]?)\s*$", re.IGNORECASE)
_WINDOW = {"d": "DAYS", "w": "WEEKS", "m": "MONTHS"}


class BackupError(RuntimeError):
    """A backup command could not do what it was asked; the message says why."""


def parse_retention(text: str) -> str | None:
    """Barman's retention policy for `text`: "7d", "4w", "6m" keep a recovery window of
    that many days, weeks or months; "3" keeps the newest three full backups; "" keeps
    everything. ValueError says what is accepted."""
    if not text.strip():
        return None
    found = _RETENTION.match(text)
    if found is None or int(found.group(1)) < 1:
        raise ValueError(
            f"{text!r} is not a retention: give a recovery window (7d, 4w, 6m: days, weeks,"
            " months) or a number of full backups to keep (3)"
        )
    count, unit = int(found.group(1)), found.group(2).lower()
    if not unit:
        return f"REDUNDANCY {count}"
    return f"RECOVERY WINDOW OF {count} {_WINDOW[unit]}"


def barman_program() -> str:
    """The `barman` command installed beside this Python (the `backup` extra)."""
    beside = Path(sys.executable).parent / "barman"
    if beside.exists():
        return str(beside)
    found = shutil.which("barman")
    if found is None:
        raise BackupError(
            "Barman is not installed: pip install 'queue-server[backup]'"
            " (in a checkout: make backup-tools)"
        )
    return found


@dataclass(frozen=True)
class Backup:
    """One base backup in the repository (Barman's backup.info)."""

    backup_id: str
    kind: str  # full, incremental
    status: str  # DONE, FAILED, STARTED, ...
    begin_time: datetime | None
    end_time: datetime | None
    size: int
    begin_wal: str | None
    end_wal: str | None
    segment_size: int
    parent: str | None

    @property
    def good(self) -> bool:
        return self.status == "DONE"


def _info_time(value: str | None) -> datetime | None:
    if not value or value == "None":
        return None
    return datetime.fromisoformat(value)


def _read_info(path: Path) -> dict[str, str]:
    fields = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep:
            fields[key] = value
    return fields


def _backup(fields: dict[str, str], backup_id: str) -> Backup:
    parent = fields.get("parent_backup_id")
    return Backup(
        backup_id=backup_id,
        kind="incremental" if parent not in (None, "", "None") else "full",
        status=fields.get("status", "UNKNOWN"),
        begin_time=_info_time(fields.get("begin_time")),
        end_time=_info_time(fields.get("end_time")),
        size=int(fields.get("size") or 0) if (fields.get("size") or "").isdigit() else 0,
        begin_wal=fields.get("begin_wal") if fields.get("begin_wal") != "None" else None,
        end_wal=fields.get("end_wal") if fields.get("end_wal") != "None" else None,
        segment_size=int(fields.get("xlog_segment_size") or 16 * 1024 * 1024),
        parent=parent if parent not in (None, "", "None") else None,
    )


def segment_number(name: str, segment_size: int) -> tuple[int, int]:
    """(timeline, segment number) of a WAL file name: 24 hex digits, the timeline, then the
    log id and the segment within it (8 each)."""
    per_id = 0x100000000 // segment_size
    return int(name[:8], 16), int(name[8:16], 16) * per_id + int(name[16:24], 16)


class Repository:
    """A backup repository directory: Barman's configuration and home for one server."""

    def __init__(self, root: Path) -> None:
        self.root = root.expanduser().resolve()

    @property
    def config(self) -> Path:
        return self.root / CONFIG

    @property
    def home(self) -> Path:
        """Barman's directory of our one server."""
        return self.root / "barman" / SERVER

    def exists(self) -> bool:
        return self.config.exists()

    def require(self) -> Repository:
        if not self.exists():
            raise BackupError(
                f"{self.root} is not a backup repository (it has no {CONFIG}): start the"
                f" server with `queue-server serve --backup-repo {self.root}` first"
            )
        return self

    def configure(
        self,
        *,
        data_dir: Path,
        pgdata: Path,
        socket_dir: Path,
        port: int,
        passfile: Path,
        bin_dir: Path,
        role: str,
        retention: str | None,
    ) -> None:
        """Write Barman's configuration for the embedded database of `data_dir` (every start:
        the socket, the programs and the retention may have changed)."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o700)
        (self.root / "barman").mkdir(exist_ok=True)
        recorded = self.live_data_dir()
        if recorded is not None and recorded != data_dir.resolve():
            raise BackupError(
                f"{self.root} backs up the data directory {recorded}, not {data_dir}: give"
                " each data directory a repository of its own"
            )
        conninfo = (
            f"host={socket_dir} port={port} user={role} passfile={passfile}"
            " application_name=queue-server-backup"
        )
        policy = f"retention_policy = {retention}\n" if retention else ""
        text = f"""\
# Written by `queue-server serve --backup-repo` at every start: edits are lost.
[barman]
barman_user = {pwd.getpwuid(os.geteuid()).pw_name}
barman_home = {self.root / "barman"}
barman_lock_directory = {self.root / "barman"}
log_file = {self.root / "barman.log"}
log_level = INFO
compression = gzip

[{SERVER}]
description = "queue-server's embedded PostgreSQL in {pgdata}"
conninfo = {conninfo} dbname=postgres
streaming_conninfo = {conninfo}
backup_method = postgres
streaming_archiver = on
archiver = off
slot_name = {SLOT}
create_slot = auto
path_prefix = {bin_dir}
minimum_redundancy = 0
immediate_checkpoint = true
{policy}"""
        _write_private(self.config, text)
        _write_private(
            self.root / STATE,
            json.dumps({"data_dir": str(data_dir.resolve()), "pgdata": str(pgdata)}) + "\n",
        )

    def live_data_dir(self) -> Path | None:
        """The data directory this repository backs up (None before its first `serve`)."""
        try:
            return Path(json.loads((self.root / STATE).read_text())["data_dir"])
        except (OSError, ValueError, KeyError):
            return None

    def live_pgdata(self) -> Path | None:
        try:
            return Path(json.loads((self.root / STATE).read_text())["pgdata"])
        except (OSError, ValueError, KeyError):
            return None

    def barman(
        self, *args: str, timeout: float | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run `barman -c <config> ARGS`; BackupError with its output when it fails."""
        argv = [barman_program(), "-c", str(self.config), *args]
        try:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=self.root,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise BackupError(f"barman {args[0]} took more than {timeout:.0f} s") from exc
        if check and done.returncode != 0:
            said = "\n".join(
                line for line in (done.stdout + done.stderr).splitlines() if line.strip()
            )
            raise BackupError(f"barman {' '.join(args)} failed:\n{said}")
        return done

    def close_segment(self, timeout: float = ARCHIVE_TIMEOUT) -> str | None:
        """Switch the database to a new WAL segment and wait until the receiver holds the one
        it closed: every transaction committed before this call is then in the repository.
        The closed segment's name (None when the current one was empty: nothing to close)."""
        done = self.barman("switch-wal", "--force", SERVER, timeout=timeout)
        closed = _CLOSED.search(done.stdout + done.stderr)
        if closed is None:
            return None
        name = closed.group(1)
        deadline = time.monotonic() + timeout
        while not (self.home / "streaming" / name).exists():
            if name in {n for n, _ in self.archived_wal()}:
                break
            if time.monotonic() > deadline:
                raise BackupError(f"the WAL receiver did not receive {name} in {timeout:.0f} s")
            time.sleep(0.05)
        return name

    def archive_current(self, timeout: float = ARCHIVE_TIMEOUT) -> None:
        """Everything committed so far into the archive. Barman leaves the receiver's newest
        complete segment in streaming/ until a later one begins (and a restore reads the
        archive and the segment being streamed only), so the current segment is closed,
        then the next one (the checkpoint of that switch begins it), and the first is
        archived."""
        first = self.close_segment(timeout)
        self.close_segment(timeout)
        deadline = time.monotonic() + timeout
        while first is not None and first not in {n for n, _ in self.archived_wal()}:
            self.barman("archive-wal", SERVER, timeout=timeout, check=False)
            if time.monotonic() > deadline:
                raise BackupError(f"{first} did not reach the archive in {timeout:.0f} s")
            time.sleep(0.1)

    # -- what the repository holds (read from Barman's files: cheap, no process) -----------

    def backups(self) -> list[Backup]:
        """Every base backup, oldest first."""
        found = []
        meta = self.home / "meta"
        for path in sorted(meta.glob("*-backup.info")) if meta.is_dir() else []:
            with contextlib.suppress(OSError, ValueError):
                found.append(_backup(_read_info(path), path.name.removesuffix("-backup.info")))
        return found

    def last_good_backup(self) -> Backup | None:
        good = [b for b in self.backups() if b.good and b.end_time is not None]
        return max(good, key=lambda b: b.end_time or datetime.min.replace(tzinfo=UTC), default=None)

    def archived_wal(self) -> list[tuple[str, float]]:
        """The archived WAL segments (name, when it was written), in archive order."""
        db = self.home / "wals" / f"{SERVER}-xlog.db"
        segments = []
        with contextlib.suppress(OSError):
            for line in db.read_text().splitlines():
                parts = line.split("\t")
                if len(parts) >= 3:
                    with contextlib.suppress(ValueError):
                        segments.append((parts[0], float(parts[2])))
        return segments

    def last_archived_at(self) -> float | None:
        """When the newest segment in the archive was completed (epoch seconds)."""
        db = self.home / "wals" / f"{SERVER}-xlog.db"
        with contextlib.suppress(OSError), db.open("rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - 4096))
            lines = handle.read().decode(errors="replace").strip().splitlines()
            if lines:
                with contextlib.suppress(IndexError, ValueError):
                    return float(lines[-1].split("\t")[2])
        return None

    def last_wal_at(self) -> float | None:
        """When the newest WAL in the repository was written (epoch seconds): the newest
        archived segment, or the one the receiver is still streaming (what a restore gets)."""
        times = [t for t in [self.last_archived_at()] if t is not None]
        with contextlib.suppress(OSError):
            times += [p.stat().st_mtime for p in (self.home / "streaming").iterdir()]
        return max(times, default=None)

    def wal_gaps(self) -> list[str]:
        """WAL segments missing from the archive between the oldest good backup's start and
        the newest archived segment (of that backup's timeline and after): a restore to a
        time past a gap is impossible."""
        good = [b for b in self.backups() if b.good and b.begin_wal]
        if not good:
            return []
        oldest = min(good, key=lambda b: b.begin_wal or "")
        size = oldest.segment_size
        timeline, start = segment_number(oldest.begin_wal or "", size)
        have: dict[int, set[int]] = {}
        # The files themselves, not Barman's index of them: a segment lost from the disk is
        # a gap however it is listed.
        on_disk = [
            f.name for d in (self.home / "wals").glob("*") if d.is_dir() for f in d.iterdir()
        ]
        for name in on_disk:
            if len(name) == 24 and all(c in "0123456789ABCDEF" for c in name):
                tli, number = segment_number(name, size)
                have.setdefault(tli, set()).add(number)
        missing = []
        numbers = set().union(*(v for t, v in have.items() if t >= timeline)) if have else set()
        last = max(numbers, default=start)
        per_id = 0x100000000 // size
        for number in range(start, last + 1):
            if number not in numbers:
                missing.append(f"{timeline:08X}{number // per_id:08X}{number % per_id:08X}")
        return missing

    def ages(self, now: float | None = None) -> dict[str, float]:
        """Seconds since the last good backup ended and since the newest WAL was written
        (each only when there is one): what /metrics shows."""
        now = time.time() if now is None else now
        ages = {}
        backup = self.last_good_backup()
        if backup is not None and backup.end_time is not None:
            ages["last_good_backup"] = max(0.0, now - backup.end_time.timestamp())
        wal = self.last_wal_at()
        if wal is not None:
            ages["last_archived_wal"] = max(0.0, now - wal)
        return ages

    # -- restore ------------------------------------------------------------------------

    def choose(self, target: datetime | None) -> Backup:
        """The newest good backup that ended before `target` (the newest of all for None)."""
        good = [b for b in self.backups() if b.good and b.end_time is not None]
        if not good:
            raise BackupError(f"{self.root} holds no complete backup: nothing to restore")
        if target is None:
            return max(good, key=lambda b: b.end_time or target_floor())
        before = [b for b in good if b.end_time is not None and b.end_time < target]
        if not before:
            oldest = min(good, key=lambda b: b.end_time or target_floor())
            raise BackupError(
                f"no backup ended before {target.isoformat()}: the oldest one"
                f" ({oldest.backup_id}) ended at {_shown(oldest.end_time)}"
            )
        return max(before, key=lambda b: b.end_time or target_floor())

    def restore(self, backup: Backup, target: datetime | None, pgdata: Path) -> None:
        """`barman restore` of `backup` into `pgdata` (which must not exist), set to recover
        to `target` (every WAL the repository holds for None) and then promote; the WAL
        the receiver was still streaming comes too (--partial-wal)."""
        # The receiver's complete segments into the archive first: a restore to a moment of
        # the last minutes needs them.
        self.barman("archive-wal", SERVER, timeout=120, check=False)
        args = ["restore", SERVER, backup.backup_id, str(pgdata), "--no-get-wal", "--partial-wal"]
        if target is not None:
            args += ["--target-time", target.isoformat(), "--target-action", "promote"]
        self.barman(*args, timeout=3600)


def target_floor() -> datetime:
    return datetime.min.replace(tzinfo=UTC)


def _shown(moment: datetime | None) -> str:
    return moment.astimezone(UTC).isoformat(timespec="seconds") if moment else "?"


def _write_private(path: Path, text: str) -> None:
    staged = path.with_name(f".{path.name}.new")
    staged.unlink(missing_ok=True)
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(staged, path)


def note_repository(data_dir: Path, repo: Repository | None) -> None:
    """Say in `data_dir` which repository its server streams into (or that none)."""
    path = data_dir / NOTE
    if repo is None:
        path.unlink(missing_ok=True)
    else:
        _write_private(path, f"{repo.root}\n")


def noted_repository(data_dir: Path) -> Repository | None:
    """The repository a server on `data_dir` streams into, as `serve` noted it."""
    try:
        text = (data_dir / NOTE).read_text().strip()
    except OSError:
        return None
    return Repository(Path(text)) if text else None


class WalStreaming:
    """While the server runs: `barman receive-wal` streaming WAL into the repository (restarted
    when it stops), and `barman cron` every `interval` seconds (streamed segments into the
    archive, retention). At exit, before the database stops, the current WAL segment is
    closed and archived: a stopped server's repository holds everything it committed."""

    def __init__(self, repo: Repository, interval: float) -> None:
        self.repo = repo
        self.interval = interval
        self._proc: subprocess.Popen[bytes] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wal-streaming", daemon=True)
        self.restarts = 0
        self._started = 0.0

    def __enter__(self) -> WalStreaming:
        self._start_receiver()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval + 130)
        if self._proc is None or self._proc.poll() is not None:
            self._start_receiver()
        try:
            self.repo.archive_current()
        except BackupError as exc:
            log.warning("the last WAL may not have reached the repository: %s", exc)
        self._stop_receiver()
        # A receiver `barman cron` started while ours was restarting, if any.
        with contextlib.suppress(BackupError):
            self.repo.barman("receive-wal", "--stop", SERVER, timeout=30, check=False)

    def _start_receiver(self) -> None:
        self._started = time.monotonic()
        with (self.repo.root / "receive-wal.log").open("ab") as output:
            self._proc = subprocess.Popen(
                [barman_program(), "-c", str(self.repo.config), "receive-wal", SERVER],
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                cwd=self.repo.root,
                # Its own process group: a Ctrl-C meant for `serve` must not stop it before
                # the last segment is archived (serve stops it after that).
                start_new_session=True,
            )

    def _stop_receiver(self) -> None:
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _run(self) -> None:
        backoff = 1.0
        restart_at = 0.0
        next_cron = time.monotonic() + min(self.interval, 5.0)
        while not self._stop.wait(0.5):
            now = time.monotonic()
            proc = self._proc
            if proc is not None and proc.poll() is not None:
                if restart_at == 0.0:
                    log.warning("barman receive-wal stopped (exit %s); restarting", proc.returncode)
                    restart_at = now + backoff
                    backoff = min(backoff * 2, 30.0)
                elif now >= restart_at:
                    restart_at = 0.0
                    self.restarts += 1
                    self._start_receiver()
            elif now - self._started > 60:
                backoff = 1.0  # up for a minute: the next stop is a new trouble
            if now >= next_cron:
                try:
                    self.repo.barman("cron", timeout=600, check=False)
                except BackupError as exc:
                    log.warning("barman cron: %s", exc)
                next_cron = time.monotonic() + self.interval
