"""Ordered keys: the items of a queue that share an `ordering_key` are handed out one at a
time, in enqueue order. The next waits (`waiting`) until the one before it completes, is
cancelled, or goes to dead letters; a queue set to `hold` keeps the key waiting behind a
dead letter until it is replayed or discarded. Many workers racing never hold two items of
one key at once, nor take them out of order; enqueues racing the completions of their key
strand nothing; every ledger folds to its row."""

from __future__ import annotations

import itertools
import threading
import uuid
from typing import Any

import httpx
import psycopg

from tests.helpers.api import Api
from tests.helpers.items import ledger_mismatches, quarantine_lease

Db = psycopg.Connection[dict[str, object]]
ITEMS = "/v1/tenants/acme/queues/q/items"


def enqueue(client: httpx.Client, payload: Any, ordering_key: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {"payload": payload}
    if ordering_key is not None:
        body["ordering_key"] = ordering_key
    response = client.post(ITEMS, json=body, headers={"Idempotency-Key": uuid.uuid4().hex})
    assert response.status_code == 201, response.text
    item: dict[str, Any] = response.json()
    return item


def state(api: Api, item_id: object) -> str:
    answer = api.worker.get(f"/v1/tenants/acme/items/{item_id}")
    assert answer.status_code == 200, answer.text
    return str(answer.json()["state"])


def discard_dead_letter_of(api: Api, item_id: str) -> None:
    """Discard the item's open dead letter, as an operator does with bad input."""
    letters = api.operator.get("/v1/tenants/acme/dead-letters").json()["dead_letters"]
    (letter,) = [x for x in letters if x["item_id"] == item_id]
    discarded = api.operator.post(
        f"/v1/tenants/acme/dead-letters/{letter['dead_letter_id']}/discard",
        json={"reason": "bad input"},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert discarded.status_code == 200, discarded.text


def test_a_key_hands_out_one_item_at_a_time_in_enqueue_order(api: Api) -> None:
    api.approve("q", 10)  # more than one lease at a time: only the keys hold items back
    first = enqueue(api.worker, 1, "customer-7")
    second = enqueue(api.worker, 2, "customer-7")
    batch = api.worker.post(
        f"{ITEMS}:batch",
        json={"items": [{"payload": 3, "ordering_key": "customer-7"}, {"payload": "free"}]},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert batch.status_code == 201, batch.text
    third, free = batch.json()["items"]
    assert [first["state"], second["state"], third["state"], free["state"]] == [
        "ready",
        "waiting",
        "waiting",
        "ready",
    ]
    assert second["ordering_key"] == "customer-7"
    # Only the key's first item and the item without a key are handed out.
    leases = api.acquire(max_items=10)
    assert sorted(str(x["item_id"]) for x in leases) == sorted([first["item_id"], free["item_id"]])
    assert api.acquire(max_items=10) == []
    by_id = {x["item_id"]: x for x in leases}
    done = api.holder(
        "complete", first["item_id"], worker="w1", fence=by_id[first["item_id"]]["fence"]
    )
    assert done.status_code == 200, done.text
    # The next in line is ready, the one after it still waits.
    assert (state(api, second["item_id"]), state(api, third["item_id"])) == ("ready", "waiting")
    (lease,) = api.acquire(max_items=10)
    assert lease["item_id"] == second["item_id"]
    # A requeue keeps the key's turn: the same item comes back, the third still waits.
    back = api.holder("requeue", lease["item_id"], worker="w1", fence=lease["fence"])
    assert back.status_code == 200, back.text
    assert state(api, third["item_id"]) == "waiting"
    (lease,) = api.acquire(max_items=10)
    assert lease["item_id"] == second["item_id"]
    # Cancelled: the next goes.
    cancelled = api.operator.post(
        f"/v1/tenants/acme/items/{second['item_id']}/cancel",
        json={"reason": "withdrawn"},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert cancelled.status_code == 200, cancelled.text
    (lease,) = api.acquire(max_items=10)
    assert lease["item_id"] == third["item_id"]
    ledger = api.worker.get(f"/v1/tenants/acme/items/{third['item_id']}/ledger").json()
    kinds = [e["kind"] for e in ledger["events"]]
    assert kinds == ["enqueued", "unblocked", "acquired"]
    assert ledger["events"][0]["data"]["state"] == "waiting"
    assert ledger["events"][1]["data"]["after"] == second["item_id"]
    assert ledger_mismatches(api) == []


def test_a_dead_letter_releases_the_key_unless_the_queue_holds_it(api: Api) -> None:
    poisoned = enqueue(api.worker, "poison", "k")
    after = enqueue(api.worker, "after", "k")
    (lease,) = api.acquire(max_items=10)
    quarantine_lease(api, lease)
    assert state(api, after["item_id"]) == "ready"
    # Replayed while the key is busy: to the back of the key's line, waiting.
    (letter,) = api.operator.get("/v1/tenants/acme/dead-letters").json()["dead_letters"]
    replayed = api.operator.post(
        f"/v1/tenants/acme/dead-letters/{letter['dead_letter_id']}/replay",
        json={},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert replayed.status_code == 200, replayed.text
    assert state(api, poisoned["item_id"]) == "waiting"
    (lease,) = api.acquire(max_items=10)
    assert lease["item_id"] == after["item_id"]
    assert api.holder("complete", after["item_id"], worker="w1", fence=lease["fence"]).is_success
    (lease,) = api.acquire(max_items=10)
    assert lease["item_id"] == poisoned["item_id"]
    assert api.holder("complete", lease["item_id"], worker="w1", fence=lease["fence"]).is_success

    # `hold`: the key waits behind its dead letter until it is discarded (or replayed).
    put = api.operator.put(
        "/v1/tenants/acme/queues/q/settings",
        json={"ordering_dead_letters": "hold"},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert put.status_code == 200, put.text
    assert put.json()["ordering_dead_letters"] == {"value": "hold", "source": "queue"}
    blocker = enqueue(api.worker, "blocker", "k")
    behind = enqueue(api.worker, "behind", "k")
    (lease,) = api.acquire(max_items=10)
    assert lease["item_id"] == blocker["item_id"]
    quarantine_lease(api, lease)
    assert api.acquire(max_items=10) == []
    assert state(api, behind["item_id"]) == "waiting"
    # A new item of the held key waits too.
    assert enqueue(api.worker, "later", "k")["state"] == "waiting"
    discard_dead_letter_of(api, blocker["item_id"])
    (lease,) = api.acquire(max_items=10)
    assert lease["item_id"] == behind["item_id"]
    assert ledger_mismatches(api) == []


def test_racing_workers_never_hold_two_items_of_a_key_nor_take_them_out_of_order(
    api: Api, db: Db
) -> None:
    api.approve("q", 20)
    keys = [f"key-{n}" for n in range(4)]
    enqueued: dict[str, list[str]] = {k: [] for k in keys}
    for n in range(12):
        for k in keys:
            enqueued[k].append(enqueue(api.worker, {"key": k, "n": n}, k)["item_id"])
    lock = threading.Lock()
    problems: list[str] = []
    active: dict[str, str] = {}
    taken: dict[str, list[str]] = {k: [] for k in keys}
    stop = threading.Event()
    total = sum(len(v) for v in enqueued.values())

    def work(n: int) -> None:
        with api.client(api.keys["worker"]) as client:
            while not stop.is_set():
                answer = client.post(
                    "/v1/tenants/acme/queues/q/leases",
                    json={"worker": f"w{n}", "lease_ttl": 30, "max_items": 3},
                )
                if answer.status_code == 503:
                    continue
                assert answer.status_code == 200, answer.text
                leases = answer.json()["leases"]
                with lock:
                    for lease in leases:
                        k = lease["payload"]["key"]
                        if k in active:
                            problems.append(f"{k}: {lease['item_id']} beside {active[k]}")
                        active[k] = lease["item_id"]
                        taken[k].append(lease["item_id"])
                for lease in leases:
                    with lock:
                        del active[lease["payload"]["key"]]
                    done = client.post(
                        f"/v1/tenants/acme/items/{lease['item_id']}/complete",
                        json={"worker": f"w{n}", "fence": lease["fence"]},
                        headers={"Idempotency-Key": uuid.uuid4().hex},
                    )
                    assert done.status_code == 200, done.text
                with lock:
                    if sum(len(v) for v in taken.values()) >= total:
                        stop.set()

    threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    assert not any(thread.is_alive() for thread in threads)
    assert problems == []
    assert taken == enqueued
    # From the ledgers: each item of a key leased after the one before it completed, by when
    # their transactions committed. (An event's `at` is its statement's start: an acquire
    # that waited for the key's lock, held by the complete of the item before, starts first
    # and commits after.)
    rows = db.execute(
        "SELECT w.ordering_key AS k, w.item_id::text AS item_id,"
        " (SELECT min(pg_xact_commit_timestamp(e.xmin)) FROM item_events e"
        "   WHERE e.tenant_id = w.tenant_id AND e.item_id = w.item_id"
        "   AND e.kind = 'acquired') AS leased,"
        " (SELECT max(pg_xact_commit_timestamp(e.xmin)) FROM item_events e"
        "   WHERE e.tenant_id = w.tenant_id AND e.item_id = w.item_id"
        "   AND e.kind = 'completed') AS completed"
        " FROM work_items w WHERE w.tenant_id = 'acme' ORDER BY w.ordering_seq"
    ).fetchall()
    for k in keys:
        line = [r for r in rows if r["k"] == k]
        assert [r["item_id"] for r in line] == enqueued[k]
        for before, after in itertools.pairwise(line):
            assert before["completed"] <= after["leased"]  # type: ignore[operator]
    assert ledger_mismatches(api) == []


def test_enqueues_racing_the_completions_of_their_key_strand_nothing(api: Api, db: Db) -> None:
    """Producers add to a key while a worker completes its items: every item is handed out
    in the end, none is left waiting behind a finished key."""
    produced = threading.Event()
    start = threading.Barrier(3)

    def produce(n: int) -> None:
        with api.client(api.keys["worker"]) as client:
            start.wait()
            for i in range(40):
                enqueue(client, {"producer": n, "i": i}, "hot")

    def consume() -> None:
        start.wait()
        with api.client(api.keys["worker"]) as client:
            idle = 0
            while idle < 50:
                answer = client.post(
                    "/v1/tenants/acme/queues/q/leases",
                    json={"worker": "w", "lease_ttl": 30, "wait": 0.05},
                )
                leases = answer.json()["leases"] if answer.status_code == 200 else []
                if not leases:
                    idle = idle + 1 if produced.is_set() else 0
                    continue
                idle = 0
                for lease in leases:
                    client.post(
                        f"/v1/tenants/acme/items/{lease['item_id']}/complete",
                        json={"worker": "w", "fence": lease["fence"]},
                        headers={"Idempotency-Key": uuid.uuid4().hex},
                    )

    producers = [threading.Thread(target=produce, args=(n,)) for n in range(2)]
    consumer = threading.Thread(target=consume)
    for thread in [*producers, consumer]:
        thread.start()
    for thread in producers:
        thread.join(timeout=60)
    produced.set()
    consumer.join(timeout=60)
    left = db.execute(
        "SELECT state::text AS state, count(*) AS n FROM work_items"
        " WHERE tenant_id = 'acme' GROUP BY state"
    ).fetchall()
    assert left == [{"state": "completed", "n": 80}]
    assert ledger_mismatches(api) == []


def test_an_enqueue_seen_busy_is_made_ready_by_the_completion_it_raced(
    api: Api, db: Db, database_url: str
) -> None:
    """An enqueue that found its key's item leased, still uncommitted while that item
    completes: the completion waits for it and then makes it ready (without the key's lock
    on the completion's side, it would look before the enqueue commits and miss it)."""
    head = enqueue(api.worker, "head", "k")
    (lease,) = api.acquire()
    late = str(uuid.uuid4())
    items = psycopg.types.json.Jsonb([{"item_id": late, "payload": "late", "ordering_key": "k"}])
    answers: list[httpx.Response] = []
    with psycopg.connect(database_url) as producer:
        (made,) = producer.execute(
            "SELECT state::text FROM queue_server.admit_rows('acme', 'q', %s, 'test', 10, 1000)",
            (items,),
        ).fetchall()
        assert made == ("waiting",)
        completion = threading.Thread(
            target=lambda: answers.append(
                api.holder("complete", head["item_id"], worker="w1", fence=lease["fence"])
            )
        )
        completion.start()
        completion.join(timeout=0.5)  # it waits for the enqueue's commit, or is done
        producer.commit()
    completion.join(timeout=30)
    (answer,) = answers
    assert answer.status_code == 200, answer.text
    assert state(api, late) == "ready"
    assert ledger_mismatches(api) == []


def test_a_completion_uncommitted_makes_an_enqueue_of_its_key_wait_for_it_not_strand(
    api: Api, database_url: str
) -> None:
    """The other side: a completion of the key's item not yet committed when an enqueue of
    the key looks. The enqueue waits for it (the key's lock) and then finds the key free;
    without the admission's lock it would see the item leased, wait behind it, and stay
    waiting once the completion, which looked first, committed."""
    head = enqueue(api.worker, "head", "k")
    api.acquire()
    answers: list[dict[str, Any]] = []
    with psycopg.connect(database_url) as finisher:
        finisher.execute(
            "UPDATE work_items SET state = 'completed', lease_holder = NULL,"
            " lease_expires_at = NULL WHERE tenant_id = 'acme' AND item_id = %s",
            (head["item_id"],),
        )
        producer = threading.Thread(target=lambda: answers.append(enqueue(api.worker, "next", "k")))
        producer.start()
        producer.join(timeout=0.5)  # it waits for the completion's commit, or is done
        finisher.commit()
    producer.join(timeout=30)
    (made,) = answers
    assert made["state"] == "ready"
    assert state(api, made["item_id"]) == "ready"


def test_under_hold_a_new_item_waits_behind_its_keys_only_item_in_dead_letters(
    api: Api,
) -> None:
    """The key's newest item is its dead letter (nothing behind it yet): under `hold`, an
    item enqueued with the key waits, and is ready once the dead letter is discarded."""
    put = api.operator.put(
        "/v1/tenants/acme/queues/q/settings",
        json={"ordering_dead_letters": "hold"},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert put.status_code == 200, put.text
    blocker = enqueue(api.worker, "blocker", "k")
    (lease,) = api.acquire(max_items=10)
    assert lease["item_id"] == blocker["item_id"]
    quarantine_lease(api, lease)
    later = enqueue(api.worker, "later", "k")
    assert later["state"] == "waiting"
    assert api.acquire(max_items=10) == []
    assert len(api.operator.get("/v1/tenants/acme/dead-letters").json()["dead_letters"]) == 1
    discard_dead_letter_of(api, blocker["item_id"])
    (lease,) = api.acquire(max_items=10)
    assert lease["item_id"] == later["item_id"]
    assert ledger_mismatches(api) == []
