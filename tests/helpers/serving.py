"""`queue-server serve` and other commands as real processes, for tests of what a person runs
on the server's machine (backups, restore)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from queue_server.infra.embedded import EmbeddedPostgres
from tests.helpers import web

BIN = Path(sys.executable).parent / "queue-server"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def open_dir(prefix: str) -> Iterator[Path]:
    """A directory other users may traverse: as root, the embedded PostgreSQL runs as a
    system user that must reach its data directory (pytest's own are 0700)."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o711)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def environment(**extra: str) -> dict[str, str]:
    """This process's environment without a database URL or a data directory of its own."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("QUEUE_SERVER_DATABASE_URL", "QUEUE_SERVER_DATA_DIR")
        and not k.startswith("QUEUE_SERVER_BACKUP")
    }
    # Wide enough that no line a test reads is wrapped.
    return {**env, "COLUMNS": "200", **extra}


class Served:
    """One `queue-server serve` process on a data directory, ready, with its admin client."""

    def __init__(self, data_dir: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [
                str(BIN),
                "serve",
                "--port",
                str(self.port),
                "--workers",
                "1",
                "--data-dir",
                str(data_dir),
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env or environment(),
            start_new_session=True,
        )
        self.output = ""

    def wait_ready(self, timeout: float = 60.0) -> Served:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(self.proc.stdout.read() if self.proc.stdout else "")
            try:
                if web.get(f"{self.url}/readyz").status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError("the server did not become ready")

    def admin(self) -> httpx.Client:
        key = (self.data_dir / "admin.key").read_text().strip()
        return web.client(base_url=self.url, headers={"Authorization": f"Bearer {key}"}, timeout=30)

    def stop(self) -> str:
        """Ctrl-C, as a person stops it; its output."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        out, _ = self.proc.communicate(timeout=120)
        self.output += out or ""
        return self.output

    def kill(self) -> None:
        """After a failure: everything it started, whatever state it is in."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        # Its database (and with it a WAL receiver, which stops when the database does).
        EmbeddedPostgres(self.data_dir / "pgdata").stop(mode="immediate")


def run(
    *args: str, env: dict[str, str] | None = None, timeout: float = 180.0
) -> subprocess.CompletedProcess[str]:
    """`queue-server ARGS` as a person runs it: exit status, stdout and stderr."""
    return subprocess.run(
        [str(BIN), *args],
        capture_output=True,
        text=True,
        env=env or environment(),
        timeout=timeout,
        check=False,
    )


def children(pid: int) -> list[int]:
    """The process's children (Linux: /proc)."""
    return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def process_tree(pid: int) -> list[int]:
    """The process and its descendants, parents first."""
    return [pid, *(each for child in children(pid) for each in process_tree(child))]


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
