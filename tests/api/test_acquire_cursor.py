"""An acquire resumes the ready index from its connection's cursor (queue_server/store/
cursors.py), so that its cost does not grow with the rows taken under an old snapshot; and
still finds every ready row: one enqueued by a transaction that commits after later
enqueues were taken, one made ready again behind the cursor, one of a priority the cursor
never saw. Each check runs on one connection whose cursor has moved past the row."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from queue_server.store import cursors, transitions
from tests.helpers.api import Api

Db = psycopg.Connection[dict[str, object]]

_TERMS: dict[str, Any] = {
    "ttl": timedelta(seconds=30),
    "max_ttl": timedelta(seconds=30),
    "deadline": timedelta(seconds=300),
    "base_limit": 100,
    "key_id": "k",
}


def _on_one_connection(
    database_url: str, steps: Callable[[Callable[[], Awaitable[list[Any]]]], Awaitable[None]]
) -> None:
    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(
            database_url, autocommit=True, row_factory=dict_row
        ) as conn:

            async def take_one() -> list[Any]:
                got = await transitions.acquire(
                    conn, tenant="acme", queue="q", worker="w", max_items=1, **_TERMS
                )
                return [row["payload"] for row in got.leased]

            await steps(take_one)
            assert cursors.get(conn, "acme", "q").xmin is not None  # the cursor was used

    asyncio.run(run())


Take = Callable[..., Awaitable[list[Any]]]


def _taking(database_url: str, steps: Callable[[Take], Awaitable[None]]) -> None:
    """`steps` run with `take(limit, ttl=30)`: one item's acquire on one connection, under
    a queue limit of `limit` and a lease of `ttl` seconds; the payloads leased."""

    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(
            database_url, autocommit=True, row_factory=dict_row
        ) as conn:

            async def take(limit: int, ttl: float = 30) -> list[Any]:
                terms = {**_TERMS, "base_limit": limit, "ttl": timedelta(seconds=ttl)}
                got = await transitions.acquire(
                    conn, tenant="acme", queue="q", worker="w", max_items=1, **terms
                )
                return [row["payload"] for row in got.leased]

            await steps(take)

    asyncio.run(run())


def _enqueued_left_open(database_url: str, payload: str) -> psycopg.Connection[Any]:
    """An item written as the admission writes one (its instant is its statement's), in a
    transaction left open: the caller commits it later, after other enqueues."""
    late = psycopg.connect(database_url)
    late.execute(
        "INSERT INTO work_items (tenant_id, queue, payload, max_acquisitions)"
        " VALUES ('acme', 'q', %s, 5)",
        (Jsonb(payload),),
    )
    return late


def test_a_row_inserted_by_a_transaction_that_commits_after_later_ones_were_taken_is_next(
    api: Api, database_url: str
) -> None:
    late = _enqueued_left_open(database_url, "late")
    for name in ("c", "d", "e"):  # enqueued after it, committed before it
        api.enqueue("q", name)

    async def steps(take_one: Callable[[], Awaitable[list[Any]]]) -> None:
        assert await take_one() == ["c"]
        assert await take_one() == ["d"]  # the cursor now lies at "e", past "late"
        await asyncio.to_thread(late.commit)
        assert await take_one() == ["late"]
        assert await take_one() == ["e"]
        assert await take_one() == []

    try:
        _on_one_connection(database_url, steps)
    finally:
        late.close()


def test_a_late_row_that_commits_while_the_queue_is_full_is_taken_once_it_has_room(
    api: Api, database_url: str
) -> None:
    # As above, but the acquire that first looks after the late commit finds the queue at
    # its limit and takes nothing: its cursor must not move past the row for good.
    late = _enqueued_left_open(database_url, "late")
    api.enqueue("q", "c")  # enqueued after it, committed before it

    async def steps(take: Take) -> None:
        assert await take(1) == ["c"]
        await asyncio.to_thread(late.commit)
        assert await take(1) == []  # c's lease fills the queue
        assert await take(2) == ["late"]  # room for one more
        assert await take(2) == []

    try:
        _taking(database_url, steps)
    finally:
        late.close()


def test_a_lease_that_expires_while_the_queue_is_full_is_taken_over_once_it_has_room(
    api: Api, database_url: str
) -> None:
    # A lease made before the cursor's snapshot expires while the other lease fills the
    # queue: the acquire that looks just after the expiry takes nothing, and its cursor must
    # not move past the expired lease for good.
    api.enqueue("q", "a")
    api.enqueue("q", "b")

    async def steps(take: Take) -> None:
        assert await take(2, ttl=1) == ["a"]
        assert await take(2) == ["b"]
        assert await take(2) == []  # full; the cursor's snapshot is now past both leases
        await asyncio.sleep(1.2)  # a's lease has just expired
        assert await take(1) == []  # b's lease fills a limit of one
        assert await take(2) == ["a"]  # taken over, with room again

    _taking(database_url, steps)


def test_an_expired_lease_no_longer_fills_the_queue_wherever_the_cursor_found_it(
    api: Api, database_url: str
) -> None:
    # The queue leases one at a time, and its only item's lease expires twice: first a lease
    # made since the cursor's snapshot, then one the cursor saw active (the acquire that
    # found the queue full moved it). Each time the next acquire on the connection counts
    # the expired lease no more and takes the item over, instead of finding the queue full.
    api.enqueue("q", "a")

    async def steps(take: Take) -> None:
        assert await take(1, ttl=1) == ["a"]
        await asyncio.sleep(1.2)
        assert await take(1, ttl=1) == ["a"]  # a lease placed since the cursor's snapshot
        assert await take(1) == []  # full: the cursor now lists a's lease as active
        await asyncio.sleep(1.2)
        assert await take(1) == ["a"]  # a lease the cursor saw active

    _taking(database_url, steps)


def test_the_lease_expired_longest_is_taken_over_first(api: Api, database_url: str) -> None:
    # Two leases made before the cursor's snapshot expire, a's first: an acquire of one item
    # takes a over, then b.
    api.enqueue("q", "a")
    api.enqueue("q", "b")

    async def steps(take: Take) -> None:
        assert await take(2, ttl=1) == ["a"]
        assert await take(2, ttl=1.5) == ["b"]
        assert await take(2) == []  # full; the cursor's snapshot is now past both leases
        await asyncio.sleep(1.7)
        assert await take(2) == ["a"]
        assert await take(2) == ["b"]

    _taking(database_url, steps)


def test_a_due_row_made_ready_since_the_cursor_is_not_hidden_by_one_not_yet_due(
    api: Api, database_url: str
) -> None:
    # Both rows come after the cursor's snapshot, the one not yet due at a higher priority:
    # the acquire passes over it and takes the due one.
    async def steps(take_one: Callable[[], Awaitable[list[Any]]]) -> None:
        assert await take_one() == []  # the cursor's snapshot: an empty queue
        api.enqueue("q", "later", priority=5, delay=60)
        api.enqueue("q", "now", priority=0)
        assert await take_one() == ["now"]

    _on_one_connection(database_url, steps)


def test_a_row_made_ready_again_behind_the_cursor_is_acquired_next(
    api: Api, database_url: str
) -> None:
    api.enqueue("q", "x")
    later = psycopg.connect(database_url)

    async def steps(take_one: Callable[[], Awaitable[list[Any]]]) -> None:
        assert await take_one() == ["x"]
        # Released by a transaction that commits after later rows were taken: its instant
        # lies before theirs, its row before the cursor.
        await asyncio.to_thread(
            later.execute,
            "UPDATE work_items SET state = 'ready', lease_holder = NULL,"
            " lease_expires_at = NULL, available_at = statement_timestamp()"
            " WHERE tenant_id = 'acme' AND payload = '\"x\"'",
        )
        for name in ("p1", "p2", "p3"):
            await asyncio.to_thread(api.enqueue, "q", name)
        assert await take_one() == ["p1"]
        assert await take_one() == ["p2"]
        await asyncio.to_thread(later.commit)
        assert await take_one() == ["x"]
        assert await take_one() == ["p3"]

    try:
        _on_one_connection(database_url, steps)
    finally:
        later.close()


def test_a_new_priority_and_a_higher_one_come_first_after_the_cursor_moved(
    api: Api, database_url: str
) -> None:
    for name in ("a", "b", "c"):
        api.enqueue("q", name)

    async def steps(take_one: Callable[[], Awaitable[list[Any]]]) -> None:
        assert await take_one() == ["a"]
        await asyncio.to_thread(api.enqueue, "q", "urgent", priority=5)
        await asyncio.to_thread(api.enqueue, "q", "low", priority=-5)
        assert await take_one() == ["urgent"]
        assert await take_one() == ["b"]
        assert await take_one() == ["c"]
        assert await take_one() == ["low"]
        assert await take_one() == []

    _on_one_connection(database_url, steps)


def test_a_lease_extended_by_a_transaction_that_commits_late_is_taken_over_once_expired(
    api: Api, database_url: str
) -> None:
    for name in ("x", "y"):
        api.enqueue("q", name)
    lease = (
        "UPDATE work_items SET state = 'leased', fence = fence + 1,"
        " acquisition_count = acquisition_count + 1, lease_holder = 'other',"
        " lease_expires_at = statement_timestamp() + %s::interval,"
        " lease_deadline_at = statement_timestamp() + interval '300 seconds',"
        " leased_at = statement_timestamp() WHERE tenant_id = 'acme' AND payload = %s"
    )
    other = psycopg.connect(database_url, autocommit=True)
    for name in ("x", "y"):
        other.execute(lease, ("30 seconds", Jsonb(name)))
    late = psycopg.connect(database_url)

    async def steps(take_one: Callable[[], Awaitable[list[Any]]]) -> None:
        assert await take_one() == []  # neither has expired
        # y's lease ends in half a second; a heartbeat of x, its commit late, ends x's lease
        # before y's (the order does not hang on how fast this machine runs the two).
        await asyncio.to_thread(
            other.execute,
            "UPDATE work_items SET lease_expires_at = statement_timestamp()"
            " + interval '500 milliseconds' WHERE tenant_id = 'acme' AND payload = '\"y\"'",
        )
        await asyncio.to_thread(
            late.execute,
            "UPDATE work_items SET lease_expires_at = (SELECT lease_expires_at - interval"
            " '200 milliseconds' FROM work_items WHERE tenant_id = 'acme' AND payload = '\"y\"')"
            " WHERE tenant_id = 'acme' AND payload = '\"x\"'",
        )
        await asyncio.sleep(1.0)
        assert await take_one() == ["y"]  # taken over; the cursor is now past x's new expiry
        assert await take_one() == []
        await asyncio.to_thread(late.commit)
        assert await take_one() == ["x"]

    try:
        _on_one_connection(database_url, steps)
    finally:
        late.close()
        other.close()


def test_the_concurrency_limit_counts_leases_seen_before_and_leases_made_since(
    api: Api, database_url: str
) -> None:
    # A limit of 2: the count joins the leases active at the cursor's snapshot (each probed
    # by its key) and those made since, by this connection or another.
    for name in ("a", "b", "c", "d"):
        api.enqueue("q", name)
    terms = {**_TERMS, "base_limit": 2}

    async def run() -> None:
        async with (
            await psycopg.AsyncConnection.connect(
                database_url, autocommit=True, row_factory=dict_row
            ) as mine,
            await psycopg.AsyncConnection.connect(
                database_url, autocommit=True, row_factory=dict_row
            ) as other,
        ):

            async def take(conn: psycopg.AsyncConnection[Any]) -> list[Any]:
                got = await transitions.acquire(
                    conn, tenant="acme", queue="q", worker="w", max_items=1, **terms
                )
                return [row["payload"] for row in got.leased]

            assert await take(mine) == ["a"]
            assert await take(mine) == ["b"]
            assert await take(mine) == []  # a (seen active before) and b (made since)
            assert await take(other) == []
            done = await mine.execute(
                "UPDATE work_items SET state = 'completed', lease_holder = NULL,"
                " lease_expires_at = NULL WHERE tenant_id = 'acme' AND payload = %s",
                (Jsonb("a"),),
            )
            assert done.rowcount == 1
            assert await take(other) == ["c"]  # room for one: a ended
            assert await take(mine) == []  # b, and c made by the other connection

    asyncio.run(run())


def test_connections_to_one_server_share_the_freshest_cursor_and_a_new_server_starts_over(
    api: Api, database_url: str
) -> None:
    """An acquire starts from the last place any connection of the process reached on the
    server (what it walks is what happened since), a new connection's too. A connection that finds another running
    server behind it (a failover or a restart behind a pooler) starts from the index's
    start, and finds what a cursor of the old server would have passed over."""
    for n in range(30):
        api.enqueue("q", n)

    async def run() -> None:
        connect = psycopg.AsyncConnection.connect
        async with (
            await connect(database_url, autocommit=True, row_factory=dict_row) as a,
            await connect(database_url, autocommit=True, row_factory=dict_row) as b,
            await connect(database_url, autocommit=True, row_factory=dict_row) as c,
            await connect(database_url, autocommit=True, row_factory=dict_row) as d,
        ):

            async def take(conn: Any) -> list[Any]:
                got = await transitions.acquire(
                    conn, tenant="acme", queue="q", worker="w", max_items=10, **_TERMS
                )
                return [row["payload"] for row in got.leased]

            assert await take(a) == list(range(10))
            first = cursors.get(a, "acme", "q")
            assert first.server is not None
            assert await take(b) == list(range(10, 20))
            # b's cursor is the freshest: a starts from it. (Its xmin may be a's, when a
            # session of another test holds a snapshot: then b's, moved last, is kept.)
            assert cursors.get(a, "acme", "q") is cursors.get(b, "acme", "q")
            assert int(cursors.get(a, "acme", "q").xmin or 0) >= int(first.xmin or 0)
            assert cursors.get(a, "acme", "q") is not first
            # A connection that never read the queue starts there too, not from the start
            # (which, under an old snapshot, walks every row taken since it began).
            await cursors.learn_server(d)
            assert cursors.get(d, "acme", "q") is cursors.get(b, "acme", "q")
            # c held a cursor of a server that ran before this one, past every row.
            past = datetime(9999, 1, 1, tzinfo=UTC)
            stale = cursors.Cursor(
                xmin=cursors.get(b, "acme", "q").xmin,
                lanes={(0, None): (past, "00000000-0000-0000-0000-000000000000")},
                expired_from=past,
                server="a server before the failover",
            )
            cursors.put(c, "acme", "q", stale, used=cursors.Cursor())
            assert await take(c) == []  # read from the old server's places: nothing
            # Dropped: c now reads from this server's freshest cursor.
            assert cursors.get(c, "acme", "q").server == first.server
            assert await take(c) == list(range(20, 30))

    asyncio.run(run())
