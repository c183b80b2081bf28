"""Fairness between partition keys (migration 0040): a queue set to `fairness:
partition_key` hands out a priority's due items round-robin between their keys, so a key
that floods the queue does not hold back another key's items."""

from __future__ import annotations

import multiprocessing
import time
import uuid
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest

from queue_server.settings import Settings
from tests.helpers import worker_processes
from tests.helpers.api import Api, policy_file
from tests.helpers.items import complete_leases, enqueue_many, put_settings

Db = psycopg.Connection[dict[str, object]]

FLOOD = 50_000


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """A policy whose backlog ceiling holds the flood."""
    backpressure = {
        "mechanism": "durable-backlog-cap",
        "max-queued": FLOOD + 1_000,
        "reserve-for-active": True,
    }
    cells: dict[str, dict[str, object]] = {"durable-leased-work": {"backpressure": backpressure}}
    policy = policy_file(tmp_path / "flood.json", cells, version="test.flood")
    return Settings(data_dir=tmp_path, policy=str(policy))


def keys_of(api: Api, leases: list[dict[str, Any]]) -> Counter[str]:
    return Counter(
        api.worker.get(f"/v1/tenants/acme/items/{lease['item_id']}").json()["partition_key"] or ""
        for lease in leases
    )


def test_a_key_that_floods_the_queue_does_not_hold_back_another_keys_items(api: Api) -> None:
    grown = api.admin.put("/v1/tenants/acme", json={"backlog_cap": FLOOD + 1_000})
    assert grown.status_code == 200, grown.text
    api.approve("q", 50)
    assert put_settings(api, fairness="partition_key").status_code == 200
    enqueue_many(api, [{"payload": n, "partition_key": "A"} for n in range(FLOOD)])
    for _ in range(2):  # the workers are busy with A's backlog
        leases = api.acquire(max_items=10)
        assert keys_of(api, leases) == {"A": 10}
        complete_leases(api, leases)
    enqueue_many(api, [{"payload": n, "partition_key": "B"} for n in range(10)])
    seen: Counter[str] = Counter()
    for _ in range(2):  # B's ten are handed out beside A's, not after its 49,980
        leases = api.acquire(max_items=10)
        seen += keys_of(api, leases)
        complete_leases(api, leases)
    assert seen == {"A": 10, "B": 10}


def test_keys_take_turns_and_an_item_without_a_key_is_one_more_key(api: Api) -> None:
    api.approve("q", 50)
    answer = put_settings(api, fairness="partition_key")
    assert answer.json()["fairness"] == {"value": "partition_key", "source": "queue"}
    enqueue_many(
        api,
        [{"payload": n, "partition_key": "a"} for n in range(20)]
        + [{"payload": n, "partition_key": "b"} for n in range(20)]
        + [{"payload": n} for n in range(20)]
        + [{"payload": n, "partition_key": "c"} for n in range(2)],
    )
    first = keys_of(api, api.acquire(max_items=12))
    # A share each (12 over 4 keys), c's two, then one more of the key whose turn is first.
    assert first["c"] == 2, first
    assert sum(first.values()) == 12, first
    assert sorted(first[k] for k in ("a", "b", "")) == [3, 3, 4], first
    # c has none left: the three others have at least their share of the next twelve (the
    # acquire still counts c among the keys it shares the room between: its lanes are of
    # the look before), and the room c leaves goes to the key whose turn is first.
    second = keys_of(api, api.acquire(max_items=12))
    assert sum(second.values()) == 12, second
    assert set(second) == {"a", "b", ""}, second
    assert min(second.values()) >= 3, second
    # Then the three share it evenly.
    assert keys_of(api, api.acquire(max_items=12)) == {"a": 4, "b": 4, "": 4}


def test_with_more_keys_than_an_acquire_reads_every_key_has_its_turn_before_any_twice(
    api: Api,
) -> None:
    """An acquire of 5 reads 9 keys' places; the other keys keep theirs until their turn."""
    api.approve("q", 50)
    assert put_settings(api, fairness="partition_key").status_code == 200
    enqueue_many(
        api, [{"payload": n, "partition_key": f"key-{k:03}"} for k in range(100) for n in range(3)]
    )
    rounds = []
    for _ in range(20):
        leases = api.acquire(max_items=5)
        rounds.append(keys_of(api, leases))
        complete_leases(api, leases)
    first = sum(rounds, Counter())
    assert first == {f"key-{k:03}": 1 for k in range(100)}, first
    # And the next hundred: the second item of each.
    second: Counter[str] = Counter()
    for _ in range(20):
        leases = api.acquire(max_items=5)
        second += keys_of(api, leases)
        complete_leases(api, leases)
    assert second == first


def test_when_the_keys_whose_turn_it_is_have_nothing_the_others_items_are_leased(
    api: Api,
) -> None:
    """An acquire of 1 reads 10 keys' places; the items of the next ten in turn are
    cancelled meanwhile: the acquire still leases what the other keys have due."""
    api.approve("q", 50)
    assert put_settings(api, fairness="partition_key").status_code == 200
    made = [api.enqueue(payload=k, partition_key=f"key-{k:02}") for k in range(40)]
    assert keys_of(api, api.acquire(max_items=1)) == {"key-00": 1}
    for item in made[1:21]:
        cancelled = api.operator.post(
            f"/v1/tenants/acme/items/{item['item_id']}/cancel",
            json={"reason": "gone"},
            headers={"Idempotency-Key": uuid.uuid4().hex},
        )
        assert cancelled.status_code == 200, cancelled.text
    leased = [keys_of(api, api.acquire(max_items=1)) for _ in range(19)]
    assert all(sum(got.values()) == 1 for got in leased), leased
    assert sum(leased, Counter()) == {f"key-{k:02}": 1 for k in range(21, 40)}


def test_a_key_whose_items_keep_coming_waits_for_its_turn_like_the_others(api: Api) -> None:
    """Its new items are among the rows made ready since each acquire's last look: they
    must not jump the keys whose turn it is."""
    api.approve("q", 50)
    assert put_settings(api, fairness="partition_key").status_code == 200
    keys = [f"key-{k:02}" for k in range(30)] + ["hot"]
    enqueue_many(api, [{"payload": n, "partition_key": key} for key in keys for n in range(5)])
    hot = 0
    for _ in range(10):
        api.enqueue(payload={"more": True}, partition_key="hot")
        leases = api.acquire(max_items=3)
        hot += keys_of(api, leases)["hot"]
        complete_leases(api, leases)
    # 31 keys, 3 a time: its turn comes once in about ten acquires, not at each.
    assert hot <= 2, hot


def test_priorities_come_first_and_keys_share_within_a_priority(api: Api) -> None:
    api.approve("q", 50)
    assert put_settings(api, fairness="partition_key").status_code == 200
    enqueue_many(
        api,
        [{"payload": n, "partition_key": "A"} for n in range(20)]
        + [{"payload": n, "partition_key": "B", "priority": 5} for n in range(3)]
        + [{"payload": n, "partition_key": "C", "priority": 5} for n in range(3)]
        + [{"payload": n, "partition_key": "C"} for n in range(20)],
    )
    # Both keys' urgent items first, then the room they leave shared between A and C.
    assert keys_of(api, api.acquire(max_items=10)) == {"B": 3, "C": 3 + 2, "A": 2}
    assert keys_of(api, api.acquire(max_items=6)) == {"A": 3, "C": 3}


def test_a_higher_priority_comes_first_with_more_keys_than_an_acquire_reads(api: Api) -> None:
    """An acquire of 1 reads 5 keys' places: the urgent key's is among them, whatever the
    other keys' turns."""
    api.approve("q", 50)
    assert put_settings(api, fairness="partition_key").status_code == 200
    enqueue_many(api, [{"payload": k, "partition_key": f"calm-{k:02}"} for k in range(12)])
    api.enqueue(payload="urgent", partition_key="urgent", priority=5)
    assert keys_of(api, api.acquire(max_items=1)) == {"urgent": 1}


def test_a_key_given_an_item_while_it_waits_for_its_turn_still_hands_out_its_oldest_first(
    api: Api,
) -> None:
    """An acquire of 1 reads 5 of the 12 keys' places; a key not read gets a new item
    meanwhile: in its turn, its items go in the order they came."""
    api.approve("q", 50)
    assert put_settings(api, fairness="partition_key").status_code == 200
    # Keys of this test only: the process remembers each key's last turn on the queue.
    keys = [f"waits-{k:02}" for k in range(12)]
    for n in range(3):  # a batch each: each key's items in the order they came
        enqueue_many(api, [{"payload": n, "partition_key": key} for key in keys])
    order: dict[str, list[object]] = {key: [] for key in keys}

    def take_one() -> None:
        leases = api.acquire(max_items=1)
        assert len(leases) == 1, f"nothing handed out, with items ready: {order}"
        (lease,) = leases
        item = api.worker.get(f"/v1/tenants/acme/items/{lease['item_id']}").json()
        order[item["partition_key"]].append(item["payload"])
        complete_leases(api, [lease])

    take_one()
    api.enqueue(payload=3, partition_key="waits-10")
    for _ in range(12 * 3):
        take_one()
    assert api.acquire(max_items=1) == []
    assert order == {key: [0, 1, 2, 3] if key == "waits-10" else [0, 1, 2] for key in keys}


def test_with_a_rate_limit_per_key_the_keys_share_their_room_in_turn(api: Api) -> None:
    """Fairness and a rate limit per key together: each key at most its limit, and the
    room shared between the keys rather than given to the oldest first."""
    api.approve("q", 50)
    answer = put_settings(
        api, fairness="partition_key", rate_limit={"limit": 3, "per": 60, "partitioned": True}
    )
    assert answer.status_code == 200, answer.text
    enqueue_many(api, [{"payload": n, "partition_key": "A"} for n in range(20)])
    enqueue_many(api, [{"payload": n, "partition_key": "B"} for n in range(20)])
    assert keys_of(api, api.acquire(max_items=4)) == {"A": 2, "B": 2}  # by age: A 3, B 1
    assert keys_of(api, api.acquire(max_items=4)) == {"A": 1, "B": 1}  # each at its 3
    assert api.acquire(max_items=4) == []


def test_switched_back_to_arrival_the_queue_hands_out_by_age_again(api: Api, db: Db) -> None:
    api.approve("q", 50)
    assert put_settings(api, fairness="partition_key").status_code == 200
    # Z's items are the older: by age they go first, though Z's turn comes after A's.
    enqueue_many(api, [{"payload": n, "partition_key": "Z"} for n in range(30)])
    enqueue_many(api, [{"payload": n, "partition_key": "A"} for n in range(30)])
    assert keys_of(api, api.acquire(max_items=10)) == {"A": 5, "Z": 5}
    answer = put_settings(api, fairness="arrival")
    assert answer.json()["fairness"] == {"value": "arrival", "source": "default"}
    # At once: the process's cursors of the fair kind are dropped with the change.
    assert keys_of(api, api.acquire(max_items=10)) == {"Z": 10}
    assert put_settings(api, fairness="partition_key").status_code == 200
    assert keys_of(api, api.acquire(max_items=10)) == {"A": 5, "Z": 5}
    # Each change is the queue's settings event, with the values before and after.
    events = db.execute(
        "SELECT data FROM queue_events WHERE tenant_id = 'acme' AND queue = 'q'"
        " AND kind = 'settings' ORDER BY seq"
    ).fetchall()
    assert [e["data"]["after"]["fairness"] for e in events] == [  # type: ignore[index]
        "partition_key", "arrival", "partition_key",
    ]  # fmt: skip


def test_a_bad_fairness_is_refused_naming_the_field(api: Api) -> None:
    refused = put_settings(api, fairness="weighted")
    assert refused.status_code == 422, refused.text
    assert refused.json()["errors"][0]["loc"] == ["body", "fairness"]
    assert api.operator.get("/v1/tenants/acme/queues/q/settings").json()["fairness"] == {
        "value": "arrival",
        "source": "default",
    }


@pytest.mark.live
def test_four_worker_processes_drain_a_fair_queue_each_item_once_keys_in_turn(
    api: Api, db: Db
) -> None:
    api.approve("q", 50)
    assert put_settings(api, fairness="partition_key").status_code == 200
    # Key by key: by age, the first forty leases would all be key-0's.
    enqueue_many(
        api, [{"payload": n, "partition_key": f"key-{k}"} for k in range(10) for n in range(40)]
    )
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        assert pool.map(worker_processes.ready, range(8)) == [True] * 8
        until = time.time() + 60
        runs = pool.starmap(
            partial(worker_processes.work, drain=True),
            [(api.url, api.keys["worker"], f"w{n}", until) for n in range(4)],
        )
    assert sorted(s for run in runs for s in run) == [200] * 400
    items = db.execute(
        "SELECT w.state::text AS state, w.partition_key AS key, count(e.*) AS acquired,"
        " min(e.at) AS first FROM work_items w JOIN item_events e USING (tenant_id, item_id)"
        " WHERE w.tenant_id = 'acme' AND e.kind = 'acquired'"
        " GROUP BY w.item_id, w.state, w.partition_key ORDER BY min(e.at)"
    ).fetchall()
    # Every item leased once (no two workers held one) and completed.
    assert len(items) == 400
    assert {(i["state"], i["acquired"]) for i in items} == {("completed", 1)}
    # The first forty leases went to every key.
    assert {i["key"] for i in items[:40]} == {f"key-{k}" for k in range(10)}
