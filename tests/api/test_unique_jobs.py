"""Unique jobs: while an item of the queue with a unique key is ready or leased, an enqueue
with that key makes nothing and is answered with that item, far beyond any idempotency
receipt (each call here has a key of its own); 20 producers racing with one key make one
item; the key is free again once its item is finished; a hit is not charged to the cap."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import httpx
import psycopg

from tests.helpers.api import Api
from tests.helpers.console import sign_in

Db = psycopg.Connection[dict[str, object]]
ITEMS = "/v1/tenants/acme/queues/q/items"


def enqueue(client: httpx.Client, payload: Any, unique_key: str | None = None) -> httpx.Response:
    body: dict[str, Any] = {"payload": payload}
    if unique_key is not None:
        body["unique_key"] = unique_key
    return client.post(ITEMS, json=body, headers={"Idempotency-Key": uuid.uuid4().hex})


def test_an_enqueue_with_a_held_key_is_answered_with_the_holder_until_it_is_finished(
    api: Api, db: Db
) -> None:
    first = enqueue(api.worker, {"n": 1}, "report-2026-12")
    assert first.status_code == 201, first.text
    made = first.json()
    assert made["unique_key"] == "report-2026-12"
    again = enqueue(api.worker, {"n": 2}, "report-2026-12")
    assert again.status_code == 200, again.text
    assert (again.json()["item_id"], again.json()["payload"]) == (made["item_id"], {"n": 1})
    # Another key, another queue, or no key: new items.
    assert enqueue(api.worker, {"n": 3}, "report-2026-11").status_code == 201
    assert enqueue(api.worker, {"n": 4}).status_code == 201
    other = api.worker.post(
        "/v1/tenants/acme/queues/other/items",
        json={"payload": 5, "unique_key": "report-2026-12"},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert other.status_code == 201, other.text
    # Leased: still held.
    leases = api.acquire(max_items=10)
    (lease,) = [x for x in leases if x["item_id"] == made["item_id"]]
    assert enqueue(api.worker, {"n": 6}, "report-2026-12").json()["item_id"] == made["item_id"]
    # Finished: the key is free; the next enqueue makes a new item.
    done = api.holder("complete", made["item_id"], worker="w1", fence=lease["fence"])
    assert done.status_code == 200, done.text
    fresh = enqueue(api.worker, {"n": 7}, "report-2026-12")
    assert fresh.status_code == 201, fresh.text
    assert fresh.json()["item_id"] != made["item_id"]
    # The ledger keeps the key with the enqueue; a hit wrote nothing.
    (enqueued,) = api.worker.get(f"/v1/tenants/acme/items/{made['item_id']}/ledger").json()[
        "events"
    ][:1]
    assert enqueued["data"]["unique_key"] == "report-2026-12"
    n = db.execute(
        "SELECT count(*) AS n FROM work_items WHERE tenant_id = 'acme' AND queue = 'q'"
        " AND unique_key = 'report-2026-12'"
    ).fetchone()
    assert n == {"n": 2}


def test_twenty_producers_racing_with_one_key_make_one_item(api: Api, db: Db) -> None:
    start = threading.Barrier(20)
    answers: list[httpx.Response] = []
    lock = threading.Lock()

    def produce(n: int) -> None:
        with api.client(api.keys["worker"]) as client:
            start.wait()
            answer = enqueue(client, {"producer": n}, "nightly-export")
        with lock:
            answers.append(answer)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(a.status_code for a in answers) == [200] * 19 + [201], [
        a.text for a in answers if a.status_code not in (200, 201)
    ]
    assert len({a.json()["item_id"] for a in answers}) == 1
    rows = db.execute(
        "SELECT count(*) AS n FROM work_items WHERE tenant_id = 'acme'"
        " AND unique_key = 'nightly-export'"
    ).fetchall()
    assert rows == [{"n": 1}]
    # The backlog counts the one item made.
    assert api.operator.get("/v1/tenants/acme/queues").json()["backlog"] == 1


def test_a_batch_answers_each_entry_with_its_keys_holder_and_charges_only_what_it_makes(
    api: Api,
) -> None:
    held = enqueue(api.worker, "held", "k1").json()
    batch = api.worker.post(
        f"{ITEMS}:batch",
        json={
            "items": [
                {"payload": "a", "unique_key": "k1"},
                {"payload": "b", "unique_key": "k2"},
                {"payload": "c", "unique_key": "k2"},
                {"payload": "d"},
            ]
        },
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert batch.status_code == 201, batch.text
    items = batch.json()["items"]
    assert items[0]["item_id"] == held["item_id"]
    assert items[1]["item_id"] == items[2]["item_id"] != items[3]["item_id"]
    assert [i["payload"] for i in items] == ["held", "b", "b", "d"]
    assert api.operator.get("/v1/tenants/acme/queues").json()["backlog"] == 3


def test_a_held_key_is_answered_even_at_the_backlog_cap(api: Api) -> None:
    capped = api.admin.put("/v1/tenants/acme", json={"backlog_cap": 1})
    assert capped.status_code in (200, 201), capped.text
    made = enqueue(api.worker, "one", "only")
    assert made.status_code == 201, made.text
    assert enqueue(api.worker, "two").status_code == 429
    again = enqueue(api.worker, "three", "only")
    assert again.status_code == 200, again.text
    assert again.json()["item_id"] == made.json()["item_id"]


def test_a_unique_key_is_printable_ascii_of_at_most_255(api: Api) -> None:
    for bad in ("", "has space", "é", "x" * 256):
        answer = enqueue(api.worker, 1, bad)
        assert answer.status_code == 422, answer.text


def test_the_items_console_page_shows_its_unique_key(api: Api) -> None:
    made = enqueue(api.worker, 1, "invoice-42").json()
    plain = enqueue(api.worker, 2).json()
    client, _ = sign_in(api.url, api.keys["operator"])
    page = client.get(f"/console/tenants/acme/items/{made['item_id']}").text
    assert "<dt>Unique key</dt><dd><code>invoice-42</code></dd>" in page
    assert "Unique key" not in client.get(f"/console/tenants/acme/items/{plain['item_id']}").text


def test_unique_for_a_period_holds_the_key_after_its_item_finished(api: Api, db: Db) -> None:
    """A report a day: with `unique_for`, an item made within the period holds the key in any
    state; past it (here, the first item's creation moved back), a new one is made."""

    def daily(payload: Any) -> httpx.Response:
        body = {"payload": payload, "unique_key": "daily", "unique_for": 86400}
        return api.worker.post(ITEMS, json=body, headers={"Idempotency-Key": uuid.uuid4().hex})

    first = daily(1)
    assert first.status_code == 201, first.text
    (lease,) = api.acquire()
    assert api.holder("complete", lease["item_id"], worker="w1", fence=lease["fence"]).is_success
    # Completed, and still the day's: answered with it (without a period, a new one is made).
    again = daily(2)
    assert again.status_code == 200, again.text
    assert (again.json()["item_id"], again.json()["state"]) == (
        first.json()["item_id"],
        "completed",
    )
    # Two producers racing within the period still make nothing new.
    assert daily(3).json()["item_id"] == first.json()["item_id"]
    db.execute(
        "UPDATE work_items SET created_at = created_at - interval '2 days'"
        " WHERE tenant_id = 'acme' AND item_id = %s",
        (first.json()["item_id"],),
    )
    fresh = daily(4)
    assert fresh.status_code == 201, fresh.text
    # Without a period the key is free once its item is finished.
    (lease,) = api.acquire()
    assert api.holder("complete", lease["item_id"], worker="w1", fence=lease["fence"]).is_success
    assert enqueue(api.worker, 5, "daily").status_code == 201


def test_unique_for_answers_with_the_unfinished_holder_else_the_newest_made_in_the_period(
    api: Api,
) -> None:
    """Two items of the key made within the period, the older finished: an enqueue with
    `unique_for` is answered with the unfinished one, and once both are finished with the
    newer, never the older."""

    def daily(payload: Any) -> httpx.Response:
        body = {"payload": payload, "unique_key": "daily", "unique_for": 86400}
        return api.worker.post(ITEMS, json=body, headers={"Idempotency-Key": uuid.uuid4().hex})

    def finish() -> None:
        (lease,) = api.acquire()
        done = api.holder("complete", lease["item_id"], worker="w1", fence=lease["fence"])
        assert done.is_success, done.text

    older = enqueue(api.worker, 1, "daily")
    assert older.status_code == 201, older.text
    finish()
    newer = enqueue(api.worker, 2, "daily")
    assert newer.status_code == 201, newer.text
    # The newer is unfinished: it holds the key, not the finished older one.
    held = daily(3)
    assert held.status_code == 200, held.text
    assert (held.json()["item_id"], held.json()["state"]) == (newer.json()["item_id"], "ready")
    # Both finished: the newest made within the period answers.
    finish()
    again = daily(4)
    assert again.status_code == 200, again.text
    assert (again.json()["item_id"], again.json()["state"]) == (
        newer.json()["item_id"],
        "completed",
    )
