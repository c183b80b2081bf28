"""The lock that makes a background sweep run in one process at a time, across processes.

A transaction-level advisory lock, tried (never waited for): it ends with the sweep's
transaction, so it also holds behind PgBouncer in transaction mode, and a process that
dies mid-sweep releases it with its connection.
"""

from __future__ import annotations

from queue_server.store.sql import fetch_one, load
from queue_server.store.types import Conn

_SQL = load("sweeps")

# The first key of every sweep lock; the second names the sweep.
SWEEP_LOCK_CLASS = 0x5157  # "QW"


async def try_lock(conn: Conn, sweep: int) -> bool:
    """True when this transaction now holds sweep `sweep`'s lock; False when another does."""
    row = await fetch_one(conn, _SQL["try_lock"], {"class": SWEEP_LOCK_CLASS, "sweep": sweep})
    return bool(row and row["locked"])
