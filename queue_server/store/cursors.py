"""Where each connection's next acquire on a queue starts reading the ready and leased indexes.

Every acquire changes the rows it takes (ready -> leased), and PostgreSQL keeps the old,
ready version of each, with its index entry, while any snapshot older than the change
is open (a pg_dump, a report, a forgotten BEGIN): a scan of the ready index from its
start walks past every row taken since that snapshot began. So a connection keeps a
cursor per queue: for each priority, the first ready row it saw; the next acquire reads
each priority from there, and finds by `placed_xid` (migration 0021) the rows that were
made ready by a transaction the cursor's snapshot did not see, wherever they lie (an
enqueue that committed late, a requeue to an earlier instant, a new priority). Its cost
is the rows taken and made ready since the connection's previous acquire on the queue,
not the history behind the oldest snapshot. Expired leases are read the same way: from
the first lease that had expired (or the snapshot's now), and by `placed_xid` the leases
made or extended by a transaction the cursor's snapshot did not see. And the queue's
active leases are counted from the ones active at the cursor's snapshot, each probed by
its key, and the ones made or extended since, instead of a scan of the leased index (which
walks every lease ended within a TTL while an old snapshot is held).

The cursor is kept with the connection object, and shared with the process's other
connections to the same running server (known by its postmaster's start time, which
`advance_cursor` returns: after a failover or a restart no cursor of the old server is
used on the new one); it is moved only by a statement that succeeded (`advance_cursor`,
before the acquire in the same transaction). The
queue's figures are read from it too (store/queues.py `open_figures`), which moves it.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from psycopg.rows import tuple_row

from queue_server.store.sql import load
from queue_server.store.types import Conn

_SQL = load("cursors")
# The connection's next cursor on a queue, from its current one (`Cursor.params`).
ADVANCE = _SQL["advance_cursor"]


NO_ITEM = "00000000-0000-0000-0000-000000000000"

# The top of every range of `placed_xid` the statements read (no transaction id reaches
# it). A range with both bounds unknown is estimated at 0.5% of the rows in a generic
# plan; with one bound, a third of them: with many ready rows in other queues, the planner
# then read the whole table instead of the index of rows placed since the cursor.
XID8_MAX = "18446744073709551615"


@dataclass(frozen=True, slots=True)
class Cursor:
    """Per priority, the first ready row (`available_at`, `item_id`) visible at a snapshot
    whose xmin is `xmin`; None: no snapshot yet (read the whole index)."""

    xmin: str | None = None
    lanes: dict[int, tuple[datetime, str]] = field(default_factory=dict)
    # No lease visible at that snapshot expired before this instant (at most its now).
    expired_from: datetime | None = None
    # The leases active at that snapshot: the next count probes these by key, and adds the
    # leases made or extended since.
    active: tuple[str, ...] = ()
    # The running server that snapshot was of: its postmaster's start time.
    server: str | None = None

    def params(self) -> dict[str, Any]:
        priorities = sorted(self.lanes)
        return {
            "since_xid": self.xmin,
            "until_xid": XID8_MAX,
            "lane_priority": priorities,
            "lane_at": [self.lanes[p][0] for p in priorities],
            "lane_id": [self.lanes[p][1] for p in priorities],
            "expired_from": self.expired_from,
            # Never empty: `item_id = ANY('{}')` is a contradiction, and a custom plan may
            # then read any partial index whole (the leased one, under an old snapshot,
            # holds every lease taken since it began). The nil UUID is no item's id.
            "active_ids": list(self.active) or [NO_ITEM],
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Cursor:
        lanes = {
            priority: (at, str(item_id))
            for priority, at, item_id in zip(row["priorities"], row["ats"], row["ids"], strict=True)
        }
        return cls(
            xmin=row["xmin"],
            lanes=lanes,
            expired_from=row["expired_from"],
            active=tuple(str(item_id) for item_id in row["active_ids"]),
            server=row["server"],
        )


_COLD = Cursor()
_cursors: weakref.WeakKeyDictionary[Conn, dict[tuple[str, str], Cursor]] = (
    weakref.WeakKeyDictionary()
)
# The server each connection last reached, and per (server, tenant, queue) the freshest
# cursor any connection to it moved to: a cursor holds on every connection to the server
# whose snapshot it came from, so each acquire starts from the last place any connection
# of this process reached, and walks only what happened since.
_servers: weakref.WeakKeyDictionary[Conn, str] = weakref.WeakKeyDictionary()
_shared: dict[tuple[str, str, str], Cursor] = {}


def _fresher(a: Cursor, b: Cursor) -> bool:
    """Whether `a` came from a later snapshot than `b` (a cold cursor is the oldest)."""
    return a.xmin is not None and (b.xmin is None or int(a.xmin) > int(b.xmin))


async def learn_server(conn: Conn) -> None:
    """Read, once per connection, which running server it reached, before its first use
    of a cursor: a new connection then starts from the freshest cursor of that server, not
    from the indexes' start, which under an old snapshot is a walk past every row taken
    since it began (a pool that opened connections while a snapshot was held stalled on
    it). Not from the server the process last reached: after a restart or a failover
    the transaction ids of the new one may lie below an old cursor's, and its rows would
    be passed over."""
    if conn in _servers:
        return
    cur = conn.cursor(row_factory=tuple_row)
    row = await (await cur.execute(_SQL["server_started"])).fetchone()
    if row is not None:
        _servers[conn] = row[0]


def get(conn: Conn, tenant: str, queue: str) -> Cursor:
    """The freshest cursor on the queue of the connection or of the other connections to
    the server it reached (the index's start if there is none)."""
    own = _cursors.get(conn, {}).get((tenant, queue), _COLD)
    server = _servers.get(conn)
    shared = None if server is None else _shared.get((server, tenant, queue))
    return shared if shared is not None and _fresher(shared, own) else own


def put(conn: Conn, tenant: str, queue: str, cursor: Cursor, *, used: Cursor) -> None:
    """Keep `cursor`, moved from `used` by `advance_cursor`. When the server is another
    than `used`'s (a failover or a restart behind the same connection, as through a
    pooler), the move started from positions on the old server, whose last commits may be
    gone: the connection starts again from the indexes' start."""
    if used.server is not None and used.server != cursor.server:
        _cursors[conn] = {}
        cursor = Cursor(server=cursor.server)
    _cursors.setdefault(conn, {})[(tenant, queue)] = cursor
    if cursor.server is None:
        return
    _servers[conn] = cursor.server
    key = (cursor.server, tenant, queue)
    shared = _shared.get(key)
    if shared is None or _fresher(cursor, shared):
        _shared[key] = cursor
