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

A fair queue (migration 0040: round-robin between partition keys) has a lane per priority
and key instead, read from the keyed ready index: each key's first row is then found from
that key's place, and the acquire hands out the keys' rows in their turns, the key served
longest ago by this process first (`took_turns`, below). A cursor made for the other kind of
queue than the queue is now starts again from the indexes' start.

The cursor is kept with the connection object, and shared with the process's other
connections to the same running server (known by its postmaster's start time, which
`advance_cursor` returns: after a failover or a restart no cursor of the old server is
used on the new one); it is moved only by a statement that succeeded (`advance_cursor`,
before the acquire in the same transaction). The
queue's figures are read from it too (store/queues.py `open_figures`), which moves it.
"""

from __future__ import annotations

import heapq
import itertools
import weakref
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from psycopg.rows import tuple_row

from queue_server.store.sql import load
from queue_server.store.types import Conn, Row, uuid_array

_SQL = load("cursors")
# The connection's next cursor on a queue, from its current one (`Cursor.params`).
ADVANCE = _SQL["advance_cursor"]


NO_ITEM = "00000000-0000-0000-0000-000000000000"

# The top of every range of `placed_xid` the statements read (no transaction id reaches
# it). A range with both bounds unknown is estimated at 0.5% of the rows in a generic
# plan; with one bound, a third of them: with many ready rows in other queues, the planner
# then read the whole table instead of the index of rows placed since the cursor.
XID8_MAX = "18446744073709551615"


# A lane: a priority, and in a fair queue a partition key ('' for items without one).
Lane = tuple[int, str | None]


@dataclass(frozen=True, slots=True)
class Cursor:
    """Per priority (per priority and key in a fair queue), the first ready row
    (`available_at`, `item_id`) visible at a snapshot whose xmin is `xmin`; None: no
    snapshot yet (read the whole index)."""

    xmin: str | None = None
    lanes: dict[Lane, tuple[datetime, str]] = field(default_factory=dict)
    # Whether the lanes are per key (a fair queue's), and the queue's setting when read.
    fair: bool = False
    fairness: str = "arrival"
    # No lease visible at that snapshot expired before this instant (at most its now).
    expired_from: datetime | None = None
    # The leases active at that snapshot: the next count probes these by key, and adds the
    # leases made or extended since.
    active: tuple[str, ...] = ()
    # The running server that snapshot was of: its postmaster's start time.
    server: str | None = None

    def front(self, turns: dict[str, int] | None = None, most: int | None = None) -> list[Lane]:
        """The lanes in the order an acquire reads them: the highest priority first, and
        within one a fair queue's keys in their `turns` (the key served last, last; keys
        never served by key). Of a fair queue's, the first `most` (None: all): an acquire
        reads no more than that, and the advance of the cursor then probes only those (the
        others keep their places)."""
        taken = turns or {}
        ranked = [(-p, taken.get(k or "", 0), k or "", (p, k)) for p, k in self.lanes]
        if most is None or not self.fair or most >= len(ranked):
            return [lane for *_, lane in sorted(ranked)]
        return [lane for *_, lane in heapq.nsmallest(most, ranked)]

    def params(self, lanes: list[Lane] | None = None) -> dict[str, Any]:
        """The statements' parameters, with `lanes` (None: all, in acquire order). Each
        lane's `width` is its priority's number of lanes, sent or not: a fair queue's
        acquire shares the room between them. When not every lane is sent, the `floor` of
        each priority, the first place of all its lanes, from which the acquire reads the
        other keys' items if the keys sent have too few."""
        sent = self.front() if lanes is None else lanes
        widths = Counter(priority for priority, _ in self.lanes)
        floors: dict[int, tuple[datetime, str]] = {}
        if len(sent) < len(self.lanes):
            if len(widths) == 1:  # the usual case, one priority: one pass, in C
                floors = {next(iter(widths)): min(self.lanes.values())}
            else:
                for (priority, _), at in self.lanes.items():
                    floors[priority] = min(floors.get(priority, at), at)
        return {
            "floor_priority": list(floors),
            "floor_at": [at for at, _ in floors.values()],
            "floor_id": [item_id for _, item_id in floors.values()],
            "fair": self.fair,
            "since_xid": self.xmin,
            "until_xid": XID8_MAX,
            "lane_priority": [priority for priority, _ in sent],
            "lane_key": [key for _, key in sent],
            "lane_at": [self.lanes[lane][0] for lane in sent],
            "lane_id": [self.lanes[lane][1] for lane in sent],
            "lane_width": [widths[priority] for priority, _ in sent],
            "expired_from": self.expired_from,
            # Never empty: `item_id = ANY('{}')` is a contradiction, and a custom plan may
            # then read any partial index whole (the leased one, under an old snapshot,
            # holds every lease taken since it began). The nil UUID is no item's id.
            "active_ids": uuid_array(self.active or (NO_ITEM,)),
        }

    def moved(self, row: dict[str, Any], sent: list[Lane] | None = None) -> Cursor:
        """The cursor `advance_cursor` moved this one to, having been sent `sent` (None:
        every lane). A lane not sent keeps its place, or takes that of the first row made
        ready in it since this cursor's snapshot, if earlier (the advance read those rows
        from their index, and names their lanes): no ready row visible at the new snapshot
        lies before it, as none visible at this one did."""
        new = Cursor.from_row(row, fair=self.fair)
        if sent is None or len(sent) == len(self.lanes):
            return new
        read = set(sent)
        lanes = {lane: at for lane, at in self.lanes.items() if lane not in read}
        for lane, at in new.lanes.items():
            lanes[lane] = min(lanes[lane], at) if lane in lanes else at
        return replace(new, lanes=lanes)

    @classmethod
    def from_row(cls, row: dict[str, Any], *, fair: bool) -> Cursor:
        """The cursor `advance_cursor` moved to from one whose lanes were `fair`."""
        lanes = {
            (priority, key): (at, str(item_id))
            for priority, key, at, item_id in zip(
                row["priorities"], row["keys"], row["ats"], row["ids"], strict=True
            )
        }
        return cls(
            xmin=row["xmin"],
            lanes=lanes,
            fair=fair,
            fairness=row["fairness"],
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
    """Whether `a` came from a snapshot no earlier than `b`'s (a cold cursor is the
    oldest). Of two with one xmin (a session holding a snapshot keeps it from moving), the
    one moved last is kept and shared: it read the most."""
    return a.xmin is not None and (b.xmin is None or int(a.xmin) >= int(b.xmin))


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
    gone: the connection starts again from the indexes' start. So it does, with lanes of
    the other kind, when the queue's fairness is not the one its lanes were made for."""
    if used.server is not None and used.server != cursor.server:
        _cursors[conn] = {}
        cursor = Cursor(server=cursor.server, fairness=cursor.fairness)
    fair = cursor.fairness == "partition_key"
    if fair != cursor.fair:
        cursor = Cursor(server=cursor.server, fair=fair, fairness=cursor.fairness)
    _cursors.setdefault(conn, {})[(tenant, queue)] = cursor
    if cursor.server is None:
        return
    _servers[conn] = cursor.server
    key = (cursor.server, tenant, queue)
    shared = _shared.get(key)
    if shared is not None and shared.fair != fair:
        # Nor may another connection start from a cursor of the other kind: it would go
        # back to it at every acquire, each reading all that happened since it was made.
        del _shared[key]
        shared = None
    if shared is None or _fresher(cursor, shared):
        _shared[key] = cursor


# Per (tenant, queue) of a fair queue, each partition key's last turn in this process (a
# count that only grows): the lanes are read in that order, the key served longest ago (or
# never) first.
_turns: dict[tuple[str, str], dict[str, int]] = {}
_turn = itertools.count(1)


def turns(tenant: str, queue: str) -> dict[str, int]:
    """The keys' last turns on a queue in this process (a key never served: none)."""
    return _turns.get((tenant, queue), {})


def forget(tenant: str, queue: str) -> None:
    """Drop every cursor of this process on the queue (its fairness changed here): the
    next acquire reads one of the kind the queue now needs before it leases, instead of
    leasing once more in the former order. Another process learns of the change at its
    next acquire, which is its last in the former order."""
    for own in _cursors.values():
        own.pop((tenant, queue), None)
    for key in [key for key in _shared if key[1:] == (tenant, queue)]:
        del _shared[key]


def took_turns(
    tenant: str, queue: str, sent: list[Lane], leased: Iterable[Row], *, full: bool
) -> None:
    """After an acquire of a fair queue that was sent the lanes `sent` (in turn order) and
    leased `leased`: every key up to the last one it leased from had its turn (those before
    it with nothing due passed theirs), and when it found less than it asked for, every
    key sent did; so did a key leased from that was not sent (new since the last look).
    They go after every other key, in the order they had it."""
    served = {(row["priority"], row["partition_key"] or "") for row in leased}
    last = max((n for n, lane in enumerate(sent) if lane in served), default=-1)
    turned = [key for _, key in (sent if not full else sent[: last + 1])]
    turned += [key for _, key in sorted(served - set(sent))]
    taken = _turns.setdefault((tenant, queue), {})
    for key in turned:
        taken[key or ""] = next(_turn)
