"""A RAM-backed directory for the suite's databases and temporary files, when there is room."""

from __future__ import annotations

import os
import tempfile

SCRATCH_ENV = "QUEUE_SERVER_TEST_TMPDIR"
SCRATCH_MIN_FREE = 2 << 30


def scratch_dir() -> str | None:
    """`/dev/shm` when it is a writable tmpfs with room, else None (the system's default).

    On this machine's disk a `CREATE DATABASE` from the migrated template takes about 0.28 s;
    on tmpfs 0.015 s, and every test takes a database of its own. A small /dev/shm (a
    container's 64 MB) is not used. QUEUE_SERVER_TEST_TMPDIR names another directory.
    """
    if chosen := os.environ.get(SCRATCH_ENV):
        return chosen
    shm = "/dev/shm"
    try:
        stats = os.statvfs(shm)
    except OSError:
        return None
    roomy = stats.f_bavail * stats.f_frsize >= SCRATCH_MIN_FREE
    return shm if roomy and os.access(shm, os.W_OK | os.X_OK) else None


def use_scratch_dir() -> None:
    """Temporary files of this process (tempfile) and of its subprocesses (TMPDIR) go to the
    scratch directory, if there is one."""
    chosen = scratch_dir()
    if chosen is not None:
        tempfile.tempdir = chosen
        os.environ["TMPDIR"] = chosen
