"""GET /items in six orders: created, priority or attempts, ascending or descending, each
then by creation. Keyset pages in each order skip and repeat no item, also while other
connections enqueue; a cursor continues its own order only."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

import httpx
import pytest

from tests.helpers.api import Api

SORTS = ["created", "-created", "priority", "-priority", "attempts", "-attempts"]
KEY: dict[str, Callable[[dict[str, Any]], int]] = {
    "created": lambda item: 0,
    "priority": lambda item: int(item["priority"]),
    "attempts": lambda item: int(item["acquisition_count"]),
}


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def _order(sort: str) -> Callable[[dict[str, Any]], tuple[int, datetime, str]]:
    key = KEY[sort.lstrip("-")]
    return lambda item: (key(item), datetime.fromisoformat(item["created_at"]), item["item_id"])


def _pages(client: httpx.Client, sort: str, limit: int, **query: str) -> list[list[dict[str, Any]]]:
    pages: list[list[dict[str, Any]]] = []
    cursor = None
    while len(pages) < 200:
        params: dict[str, Any] = {"sort": sort, "limit": limit, **query}
        if cursor:
            params["cursor"] = cursor
        response = client.get("/v1/tenants/acme/items", params=params)
        assert response.status_code == 200, response.text
        body = response.json()
        pages.append(body["items"])
        cursor = body["next_cursor"]
        if cursor is None:
            return pages
    raise AssertionError("the pages never ended")


def _mixed_items(api: Api) -> list[dict[str, Any]]:
    """Items of three queues and four states, priorities and attempts of every kind."""
    for n in range(18):
        api.enqueue(("a", "b", "c")[n % 3], {"n": n}, priority=(0, 5, -3, 5, 2, 0)[n % 6])
    # Attempts: lease and give back a different number of items of each queue each round.
    for round_, count in enumerate((5, 3, 2)):
        for queue in ("a", "b", "c"):
            for lease in api.acquire(queue, max_items=count - round_ % 2):
                api.holder("requeue", lease["item_id"], worker="w1", fence=lease["fence"])
    (done,) = api.acquire("a")
    assert api.holder("complete", done["item_id"], worker="w1", fence=done["fence"]).is_success
    (bad,) = api.acquire("b")
    failure = {"class": "E", "message": "no"}
    response = api.holder(
        "triage", bad["item_id"], worker="w1", fence=bad["fence"], failure=failure,
        decision="quarantine",
    )  # fmt: skip
    assert response.is_success
    api.acquire("c")  # one leased item: the leased branch of every order
    items = _pages(api.operator, "created", 500)[0]
    assert {i["state"] for i in items} == {"ready", "leased", "completed", "quarantined"}
    assert len({i["acquisition_count"] for i in items}) >= 3
    return items


def test_each_order_pages_every_item_once_in_that_order(api: Api) -> None:
    items = _mixed_items(api)
    # The payload and time filters too, in each branch of each order (the leased one too):
    # one ready item's payload, and a window that leaves out the first and last three.
    oldest_first = sorted(items, key=_order("created"))
    after, before = (_at(oldest_first[k]["created_at"]) for k in (3, -3))
    ready = next(i for i in items if i["state"] == "ready")
    narrowed = (
        (
            {"payload": json.dumps(ready["payload"])},
            {i["item_id"] for i in items if i["payload"] == ready["payload"]},
        ),
        (
            {"created_after": after.isoformat(), "created_before": before.isoformat()},
            {i["item_id"] for i in items if after < _at(i["created_at"]) < before},
        ),
    )
    for sort in SORTS:
        expected = sorted(items, key=_order(sort), reverse=sort.startswith("-"))
        pages = _pages(api.operator, sort, 4)
        listed = [i["item_id"] for page in pages for i in page]
        assert listed == [i["item_id"] for i in expected], sort
        assert all(len(page) == 4 for page in pages[:-1])

        # A filter keeps the order: one queue, one state, both.
        queries = (
            {"queue": "b"},
            {"state": "ready"},
            {"queue": "c", "state": "ready"},
            {"state": "leased"},
            {"queue": "a", "state": "completed"},
        )
        for query in queries:
            want = [
                i["item_id"]
                for i in expected
                if all(i[field] == value for field, value in query.items())
            ]
            got = [i["item_id"] for page in _pages(api.operator, sort, 3, **query) for i in page]
            assert got == want, (sort, query)

        for query, ids in narrowed:
            want = [i["item_id"] for i in expected if i["item_id"] in ids]
            got = [i["item_id"] for page in _pages(api.operator, sort, 3, **query) for i in page]
            assert got == want, (sort, query)


def test_leased_items_at_a_page_boundary_are_neither_repeated_nor_skipped(api: Api) -> None:
    # Leased items come from their own branch of each order's statement: its cursor
    # comparison alone decides whether the last item of a page comes back on the next.
    # Each with its own priority and number of attempts, so that every order tells them apart.
    for n, queue in enumerate(("a", "b", "c")):
        api.enqueue(queue, {"n": n}, priority=n)
        for _ in range((n * 2) % 3):
            (lease,) = api.acquire(queue)
            api.holder("requeue", lease["item_id"], worker="w1", fence=lease["fence"], delay=0)
        assert len(api.acquire(queue)) == 1
    items = _pages(api.operator, "created", 500)[0]
    assert {i["state"] for i in items} == {"leased"}
    for sort in SORTS:
        expected = sorted(items, key=_order(sort), reverse=sort.startswith("-"))
        pages = _pages(api.operator, sort, 1)
        listed = [i["item_id"] for page in pages for i in page]
        assert listed == [i["item_id"] for i in expected], sort


def test_the_default_order_is_oldest_first_and_minus_created_is_newest_first(api: Api) -> None:
    made = [api.enqueue("q", n)["item_id"] for n in range(4)]
    default = api.operator.get("/v1/tenants/acme/items").json()["items"]
    assert [i["item_id"] for i in default] == made
    newest = api.operator.get("/v1/tenants/acme/items", params={"sort": "-created"}).json()
    assert [i["item_id"] for i in newest["items"]] == made[::-1]


def test_an_unknown_order_and_a_cursor_of_another_order_are_refused(api: Api) -> None:
    for n in range(3):
        api.enqueue("q", n, priority=n)
    response = api.operator.get("/v1/tenants/acme/items", params={"sort": "payload"})
    assert response.status_code == 422, response.text
    assert response.json()["code"] == "invalid-request"
    assert response.json()["errors"][0]["loc"] == ["query", "sort"]
    for first, then in (
        ("priority", "-priority"),
        ("priority", "created"),
        ("created", "attempts"),
    ):
        page = api.operator.get("/v1/tenants/acme/items", params={"sort": first, "limit": 1}).json()
        again = api.operator.get(
            "/v1/tenants/acme/items",
            params={"sort": then, "limit": 1, "cursor": page["next_cursor"]},
        )
        assert again.status_code == 422, (first, then, again.text)
        assert again.json()["code"] == "invalid-request"


@pytest.mark.live
@pytest.mark.parametrize("sort", ["-created", "-priority", "attempts"])
def test_paging_while_other_connections_enqueue_skips_and_repeats_nothing(
    api: Api, sort: str
) -> None:
    before = [api.enqueue(("a", "b")[n % 2], n, priority=n % 7)["item_id"] for n in range(40)]
    stop = threading.Event()
    added: list[str] = []
    lock = threading.Lock()

    def enqueue(worker: int) -> None:
        with api.client(api.keys["worker"]) as client:
            n = 0
            while not stop.is_set() and n < 40:
                response = client.post(
                    f"/v1/tenants/acme/queues/{('a', 'b')[worker % 2]}/items",
                    json={"payload": [worker, n], "priority": (worker + n) % 7},
                    headers={"Idempotency-Key": uuid.uuid4().hex},
                )
                assert response.status_code == 201, response.text
                with lock:
                    added.append(response.json()["item_id"])
                n += 1

    threads = [threading.Thread(target=enqueue, args=(w,)) for w in range(6)]
    for thread in threads:
        thread.start()
    try:
        pages = _pages(api.operator, sort, 3)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    listed = [i for page in pages for i in page]
    ids = [i["item_id"] for i in listed]
    assert len(ids) == len(set(ids)), "an item was shown twice"
    assert set(before) <= set(ids), "an item that was there all along was skipped"
    assert set(ids) <= set(before) | set(added)
    assert added, "nothing was enqueued while paging"
    keys = [_order(sort)(i) for i in listed]
    assert keys == sorted(keys, reverse=sort.startswith("-"))
