"""The counters' fold: append-only deltas summed into a new base.

Every transition's statement inserts a row into `counter_deltas` per (tenant, queue) it
touched, carrying its transaction's id; nothing updates one. Readers take the view
`counter_totals` (migration 0023): the latest base plus the deltas at or above its
`as_of_xid`. The fold keeps the deltas since the last base few, so a reader's cost is
what happened since the last fold, whatever old snapshot another session holds (the
deleted deltas and bases lie below the ranges read). The sweeper folds every
`FOLD_INTERVAL` seconds, in one process at a time (`store.sweeps`).
"""

from __future__ import annotations

from dataclasses import dataclass

from queue_server.store.sql import fetch_one, load
from queue_server.store.types import Conn

_SQL = load("counters")


@dataclass(frozen=True, slots=True)
class Fold:
    """What one fold did: deltas summed and deleted, base rows written (0 when nothing was
    folded: the base stays), and the horizon it folded up to (the new base's `as_of_xid`)."""

    deltas: int
    bases: int
    as_of_xid: int


async def fold(conn: Conn) -> Fold:
    """Sum the deltas of every transaction that has ended into a new base (one statement;
    the caller commits). Run by one process at a time: two at once would both replace the
    same base."""
    row = await fetch_one(conn, _SQL["fold"], {})
    assert row is not None
    return Fold(int(row["deltas"]), int(row["bases"]), int(row["as_of_xid"]))
