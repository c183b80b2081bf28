"""A lease committed after its client left is released at once and not charged."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import psycopg
from psycopg.rows import dict_row

from queue_server.services.ledgers import mismatches
from queue_server.store import transitions
from tests.helpers.api import Api

Db = psycopg.Connection[dict[str, object]]


def test_released_lease_goes_back_to_ready_uncharged_and_the_next_acquire_raises_the_fence(
    api: Api, db: Db, database_url: str
) -> None:
    item = api.enqueue(max_acquisitions=1)

    async def acquire_then_release() -> int:
        conn = await psycopg.AsyncConnection.connect(
            database_url, autocommit=True, row_factory=dict_row
        )
        async with conn:
            acquired = await transitions.acquire(
                conn,
                tenant="acme",
                queue="q",
                worker="gone",
                key_id="0123456789abcdef",
                ttl=timedelta(seconds=30),
                max_ttl=timedelta(seconds=30),
                deadline=timedelta(seconds=900),
                max_items=1,
            )
            leased = acquired.leased
            assert [str(row["item_id"]) for row in leased] == [item["item_id"]]
            async with conn.transaction():
                return await transitions.release_unsent(
                    conn, tenant="acme", worker="gone", key_id="0123456789abcdef", leases=leased
                )

    assert asyncio.run(acquire_then_release()) == 1
    row = api.worker.get(f"/v1/tenants/acme/items/{item['item_id']}").json()
    assert row["state"] == "ready"
    assert row["acquisition_count"] == 0
    assert row["fence"] == 1
    # The budget of one acquisition is still whole: the next acquire gets the item.
    (lease,) = api.acquire(worker="present")
    assert lease["fence"] == 2
    assert lease["acquisition_count"] == 1
    stored = db.execute("SELECT * FROM work_items").fetchone()
    events = db.execute(
        "SELECT seq, kind, fence, actor, data FROM item_events ORDER BY seq"
    ).fetchall()
    assert [e["kind"] for e in events] == ["enqueued", "acquired", "released", "acquired"]
    assert stored is not None
    assert mismatches(dict(stored), [dict(e) for e in events]) == []
