"""The deliveries in flight are bounded by the policy's watcher-delivery/concurrency across
all `queue-server deliver` processes together, counted in the database."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psycopg
import pytest
from psycopg.rows import dict_row

from queue_server.policy import default_policy
from queue_server.policy.v2 import OPERATION_RELIABILITY_V2
from queue_server.settings import Settings
from queue_server.store import outbox
from tests.helpers.api import Api
from tests.helpers.receiver import Seen
from tests.helpers.watchers import (
    Db,
    DeliverProcess,
    ModeReceiver,
    complete_one,
    deliver,
    register,
    rows,
    wait_until,
)

WATCHERS = 6
EVENTS = 4


class HoldingReceiver(ModeReceiver):
    """Holds each `/hook?watcher=n` request 0.1 * (n + 1) s before its 200, and counts the
    requests it holds at once: a slot of a slow watcher frees later than a fast one's."""

    def __init__(self) -> None:
        super().__init__()
        self.holding = 0
        self.most = 0
        self._count = threading.Lock()

    def _answer(self, conn: Any, seen: Seen) -> None:
        if not seen.target.startswith("/hook"):
            super()._answer(conn, seen)
            return
        watcher = int(parse_qs(urlsplit(seen.target).query)["watcher"][0])
        with self._count:
            self.holding += 1
            self.most = max(self.most, self.holding)
        try:
            self.release.wait(0.1 * (watcher + 1))
            super()._answer(conn, seen)
        finally:
            with self._count:
                self.holding -= 1


@pytest.fixture
def holding() -> Iterator[HoldingReceiver]:
    r = HoldingReceiver()
    yield r
    r.close()


def test_two_deliverers_keep_at_most_the_class_concurrency_in_flight(
    api: Api, db: Db, holding: HoldingReceiver, database_url: str, tmp_path: Path
) -> None:
    bound = default_policy().delivery.concurrency
    for n in range(WATCHERS):
        register(api, holding.url(f"/hook?watcher={n}"))
    for n in range(EVENTS):
        complete_one(api, payload=n)
    keys = sorted(r["delivery_key"] for r in rows(db))
    assert len(keys) == WATCHERS * EVENTS

    # Each process alone may claim and send `bound` at once: together they could send twice
    # as many, were the bound counted per process.
    each = {"DELIVERY_BATCH_SIZE": str(bound), "DELIVERY_ATTEMPT_TIMEOUT": "5"}
    deliverers = [
        DeliverProcess(database_url, tmp_path / f"deliver-{n}.log", **each) for n in (1, 2)
    ]
    try:
        wait_until(
            lambda: all(r["state"] == "delivered" for r in rows(db)),
            "every delivery delivered",
            timeout=60,
        )
    finally:
        for d in deliverers:
            d.stop()

    # Both processes delivered; never more than the class value in flight at the receiver;
    # each delivery sent once.
    for d in deliverers:
        assert "attempt 1: delivered" in d.text(), d.text()
    assert 2 <= holding.most <= bound, holding.most
    sent = sorted(r.headers["webhook-id"] for r in holding.hook_requests())
    assert sent == keys


def test_one_deliverer_keeps_at_most_the_class_concurrency_in_flight(
    api: Api, db: Db, holding: HoldingReceiver, settings: Settings, database_url: str
) -> None:
    # The document's value, as written: the deliverer reads it through the loaded policy.
    bound = OPERATION_RELIABILITY_V2["classes"]["watcher-delivery"]["concurrency"]["limit"]
    for _ in range(2 * bound):
        register(api, holding.url("/hook?watcher=1"))  # each request held 0.2 s
    complete_one(api)
    assert deliver(settings, database_url).delivered == 2 * bound
    assert 2 <= holding.most <= bound, holding.most


def test_racing_claims_never_take_more_than_the_class_concurrency(
    api: Api, db: Db, database_url: str
) -> None:
    """Many claims at once, each on its own connection: together they take the rows of as
    many watchers as the bound (one watcher's rows go out one at a time)."""
    bound = default_policy().delivery.concurrency
    for n in range(2 * bound):
        register(api, f"http://127.0.0.1:9/hook?watcher={n}")
    for n in range(3):
        complete_one(api, payload=n)

    async def race() -> list[int]:
        conns = [
            await psycopg.AsyncConnection.connect(database_url, row_factory=dict_row)
            for _ in range(12)
        ]
        start = asyncio.Event()

        async def one(conn: psycopg.AsyncConnection[Any]) -> int:
            await start.wait()
            async with conn.transaction():
                claimed = await outbox.claim(
                    conn,
                    limit=32,
                    concurrency=bound,
                    token=uuid.uuid4().hex,
                    lease=timedelta(seconds=30),
                    delays=[1.0] * 4,
                    deadline=86400,
                )
            return len(claimed)

        try:
            tasks = [asyncio.create_task(one(c)) for c in conns]
            await asyncio.sleep(0.05)
            start.set()
            return await asyncio.gather(*tasks)
        finally:
            for c in conns:
                await c.close()

    taken = asyncio.run(race())
    in_flight = [r for r in rows(db) if r["claim_token"] is not None]
    assert sum(taken) == len(in_flight)
    # Every due row of `bound` watchers, the first watchers in due order; nothing else.
    assert len({r["watcher_id"] for r in in_flight}) == bound, taken
    assert len(in_flight) == 3 * bound


async def _claim(
    conn: psycopg.AsyncConnection[Any],
    *,
    limit: int = 32,
    exclude: list[str] | None = None,
    concurrency: int | None = None,
) -> list[dict[str, Any]]:
    """One claim as a deliverer makes it (the class's concurrency unless given), in the
    caller's transaction."""
    return await outbox.claim(
        conn,
        limit=limit,
        concurrency=concurrency or default_policy().delivery.concurrency,
        token=uuid.uuid4().hex,
        lease=timedelta(seconds=30),
        delays=[1.0] * 4,
        deadline=86400,
        exclude=exclude,
    )


def test_a_claim_waits_for_the_claim_before_it_to_commit(
    api: Api, db: Db, database_url: str
) -> None:
    """Claims are serialized: a claim that started while another was uncommitted counts that
    one's rows once it commits, instead of claiming past the bound beside it."""
    bound = default_policy().delivery.concurrency
    for n in range(2 * bound):
        register(api, f"http://127.0.0.1:9/hook?watcher={n}")
    complete_one(api)
    first = rows(db)[0]

    async def race() -> tuple[int, int]:
        a = await psycopg.AsyncConnection.connect(database_url, row_factory=dict_row)
        b = await psycopg.AsyncConnection.connect(database_url, row_factory=dict_row)
        try:
            async with a.transaction():
                # A run's second claim (its first row excluded) takes the next `bound` watchers.
                taken_a = await _claim(a, exclude=[str(first["delivery_id"])])

                async def claim_b() -> int:
                    async with b.transaction():
                        return len(await _claim(b))

                later = asyncio.create_task(claim_b())
                # The second claim has had time to run (or to wait) before the first commits.
                await asyncio.sleep(0.5)
            return len(taken_a), await later
        finally:
            await a.close()
            await b.close()

    taken_a, taken_b = asyncio.run(race())
    assert (taken_a, taken_b) == (bound, 0)
    assert len([r for r in rows(db) if r["claim_token"] is not None]) == bound


def test_a_watcher_with_a_delivery_in_flight_gets_no_other(
    api: Api, db: Db, database_url: str
) -> None:
    """Its next row waits until the one in flight is recorded, whichever deliverer asks."""
    register(api, "http://127.0.0.1:9/hook")
    complete_one(api, payload=1)
    complete_one(api, payload=2)

    async def claims() -> list[list[int]]:
        conn = await psycopg.AsyncConnection.connect(
            database_url, row_factory=dict_row, autocommit=True
        )
        try:
            seen: list[list[int]] = []
            for limit in (1, 32):
                async with conn.transaction():
                    seen.append([int(r["seq"]) for r in await _claim(conn, limit=limit)])
            await conn.execute(
                "UPDATE outbox_deliveries SET state = 'delivered', claim_token = NULL,"
                " claimed_until = NULL WHERE seq = %s",
                (seen[0][0],),
            )
            async with conn.transaction():
                seen.append([int(r["seq"]) for r in await _claim(conn)])
            return seen
        finally:
            await conn.close()

    one, two = (int(r["seq"]) for r in rows(db))
    assert asyncio.run(claims()) == [[one], [], [two]]


def test_recording_a_delivery_renews_the_claims_of_its_watchers_next_ones(
    api: Api, db: Db, database_url: str
) -> None:
    """A watcher's claimed rows wait for one another: each record renews the rest's claims,
    so they are not taken over (and sent twice) while they wait their turn."""
    register(api, "http://127.0.0.1:9/hook")
    for n in range(3):
        complete_one(api, payload=n)
    lease = timedelta(seconds=2)

    async def run() -> list[list[int]]:
        conn = await psycopg.AsyncConnection.connect(
            database_url, row_factory=dict_row, autocommit=True
        )
        try:
            token = uuid.uuid4().hex
            async with conn.transaction():
                held = await outbox.claim(
                    conn,
                    limit=32,
                    concurrency=default_policy().delivery.concurrency,
                    token=token,
                    lease=lease,
                    delays=[1.0] * 4,
                    deadline=86400,
                )
            await asyncio.sleep(1.2)
            await outbox.record(
                conn,
                row=held[0],
                token=token,
                state="delivered",
                outcome={"attempt": 1, "outcome": "succeeded", "status": 200},
                receipts=[],
                omitted=0,
                lease=lease,
            )
            # Past the first claim's lease, within the renewed one.
            await asyncio.sleep(1.2)
            async with conn.transaction():
                again = await _claim(conn)
            return [[int(r["seq"]) for r in held], [int(r["seq"]) for r in again]]
        finally:
            await conn.close()

    held, again = asyncio.run(run())
    assert (len(held), again) == (3, [])


def test_a_claim_takes_the_watchers_whose_rows_have_been_due_longest_first(
    api: Api, db: Db, database_url: str
) -> None:
    """Room for one watcher: the row due first goes, not the row written first (a row
    written earlier may be due later, after a failed attempt)."""
    for n in range(2):
        register(api, f"http://127.0.0.1:9/hook?watcher={n}")
    complete_one(api)
    first, second = rows(db)
    db.execute(
        "UPDATE outbox_deliveries SET due_at = now() - make_interval(secs => %s)"
        " WHERE delivery_id = %s",
        (1, first["delivery_id"]),
    )
    db.execute(
        "UPDATE outbox_deliveries SET due_at = now() - make_interval(secs => %s)"
        " WHERE delivery_id = %s",
        (10, second["delivery_id"]),
    )

    async def claim_one() -> list[dict[str, Any]]:
        async with (
            await psycopg.AsyncConnection.connect(database_url, row_factory=dict_row) as conn,
            conn.transaction(),
        ):
            return await _claim(conn, concurrency=1)

    claimed = asyncio.run(claim_one())
    assert [r["delivery_id"] for r in claimed] == [second["delivery_id"]]
