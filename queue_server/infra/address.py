"""How the command line on the server's machine finds the server that runs there.

`serve` writes the URL it answers at to `<data-dir>/server.url` and holds that file locked
(an exclusive `flock`) for as long as it serves: the kernel drops the lock when the process
ends, however it ends, so a `server.url` nobody holds is a stale one and is not used. It
also notes the data directory it started on in a per-user file,
`~/.local/state/queue-server/serving` (`$XDG_STATE_HOME`), so that a command run without
`--data-dir` finds a server started with one (`make serve ARGS="--data-dir X"`). Only the
lightweight modules are imported here: every client command reads this.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import platformdirs

# Beside admin.key in the data directory: the URL clients on this machine reach it at.
ADDRESS_FILE = "server.url"
# In the user's state directory: the data directory `serve` last started on.
SERVING_FILE = "serving"


def serving_note() -> Path:
    """The per-user file naming the data directory `serve` last started on."""
    return Path(platformdirs.user_state_dir("queue-server")) / SERVING_FILE


@contextlib.contextmanager
def published(data_dir: Path, host: str, port: int) -> Iterator[Path]:
    """`<data-dir>/server.url`, held for the life of the block, and the per-user note that
    this data directory is the one served: for clients on this machine."""
    reachable = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    netloc = f"[{reachable}]" if ":" in reachable else reachable
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / ADDRESS_FILE
    fd, tmp = tempfile.mkstemp(dir=data_dir, prefix=f".{ADDRESS_FILE}.")
    try:
        # Locked before it takes the name: no reader ever sees it unheld while this serves.
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, f"http://{netloc}:{port}\n".encode())
        os.fchmod(fd, 0o644)
        os.replace(tmp, path)
        _note_serving(data_dir)
        yield path
    finally:
        os.close(fd)  # the lock goes with it
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _note_serving(data_dir: Path) -> None:
    note = serving_note()
    try:
        note.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=note.parent, prefix=f".{note.name}.")
        with os.fdopen(fd, "w") as file:
            file.write(f"{data_dir.resolve()}\n")
        os.replace(tmp, note)
    except OSError:
        pass  # a home directory it cannot write: --data-dir still finds it


def serving(data_dir: Path) -> bool:
    """Whether a server runs on `data_dir` now: one holds its `server.url`."""
    try:
        fd = os.open(data_dir / ADDRESS_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        # A shared lock is refused only while the server holds its exclusive one; two
        # readers asking at once do not refuse each other.
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False


def local_data_dir(given: Path | None = None) -> Path:
    """The data directory of the server on this machine: `given` (--data-dir or
    QUEUE_SERVER_DATA_DIR); else the one `serve` last started on, while it still serves;
    else the default one."""
    from queue_server.settings import default_data_dir  # not at import: the CLI starts fast

    if given is not None:
        return given
    try:
        noted = Path(serving_note().read_text().strip())
    except (OSError, ValueError):
        noted = None
    if noted is not None and noted.is_absolute() and serving(noted):
        return noted
    return default_data_dir()


def local_url(data_dir: Path) -> str | None:
    """The URL in `<data-dir>/server.url` while its server runs; None when none does."""
    try:
        url = (data_dir / ADDRESS_FILE).read_text().strip()
    except OSError:
        return None
    return url if url and serving(data_dir) else None
