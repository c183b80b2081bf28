"""Idempotency-Key: receipts survive the lease, keys are per tenant and per API key, one effect per key."""

from __future__ import annotations

import threading

import httpx
import psycopg

from tests.helpers.api import Api, setup_tenant
from tests.helpers.items import expire

Db = psycopg.Connection[dict[str, object]]


def test_effecting_request_without_a_key_is_400(api: Api) -> None:
    for headers in ({}, {"Idempotency-Key": ""}, {"Idempotency-Key": "has space"}):
        response = api.worker.post(
            "/v1/tenants/acme/queues/q/items", json={"payload": 1}, headers=headers
        )
        assert response.status_code == 400
        assert response.json()["code"] == "idempotency-key-required"


def test_same_key_same_request_replays_the_original_answer(api: Api, db: Db) -> None:
    first = api.worker.post(
        "/v1/tenants/acme/queues/q/items", json={"payload": 1}, headers={"Idempotency-Key": "k1"}
    )
    again = api.worker.post(
        "/v1/tenants/acme/queues/q/items", json={"payload": 1}, headers={"Idempotency-Key": "k1"}
    )
    assert again.status_code == first.status_code == 201
    assert again.content == first.content
    assert again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    row = db.execute("SELECT count(*) AS n FROM work_items").fetchone()
    assert row == {"n": 1}


def test_same_key_different_request_is_422(api: Api) -> None:
    api.worker.post(
        "/v1/tenants/acme/queues/q/items", json={"payload": 1}, headers={"Idempotency-Key": "k"}
    )
    reused = api.worker.post(
        "/v1/tenants/acme/queues/q/items", json={"payload": 2}, headers={"Idempotency-Key": "k"}
    )
    assert reused.status_code == 422
    assert reused.json()["code"] == "idempotency-key-reuse"


def test_same_key_same_body_on_another_queue_is_422(api: Api, db: Db) -> None:
    """The path is part of the request: queue b's enqueue is not queue a's replayed."""
    first = api.worker.post(
        "/v1/tenants/acme/queues/a/items", json={"payload": 1}, headers={"Idempotency-Key": "k"}
    )
    assert first.status_code == 201, first.text
    other = api.worker.post(
        "/v1/tenants/acme/queues/b/items", json={"payload": 1}, headers={"Idempotency-Key": "k"}
    )
    assert other.status_code == 422, other.text
    assert other.json()["code"] == "idempotency-key-reuse"
    rows = db.execute("SELECT queue, count(*) AS n FROM work_items GROUP BY queue").fetchall()
    assert rows == [{"queue": "a", "n": 1}]


def test_refusal_is_kept_and_replayed(api: Api) -> None:
    item = api.enqueue()
    first = api.holder("complete", item["item_id"], key="c", worker="w1", fence=0)
    assert first.status_code == 409
    again = api.holder("complete", item["item_id"], key="c", worker="w1", fence=0)
    assert again.status_code == 409
    assert again.content == first.content
    assert again.headers["content-type"] == "application/problem+json"
    assert again.headers["Idempotent-Replayed"] == "true"


def test_refused_422_is_kept_and_replayed_after_its_cause_is_gone(api: Api) -> None:
    """A 422 is kept like a 409: the same key replays it even once the request would pass."""
    path = "/v1/tenants/acme/queues/q/concurrency"
    body = {"concurrency": 2, "reason": "r"}
    first = api.operator.put(path, json=body, headers={"Idempotency-Key": "c422"})
    assert first.status_code == 422, first.text
    api.approve("q", 5)
    again = api.operator.put(path, json=body, headers={"Idempotency-Key": "c422"})
    assert again.status_code == 422, again.text
    assert again.content == first.content
    assert again.headers["content-type"] == "application/problem+json"
    assert again.headers["Idempotent-Replayed"] == "true"
    limits = api.worker.get(path).json()
    assert (limits["concurrency"], limits["limit"]) == (None, 5)


def test_accepted_requeue_replays_after_a_successor_took_the_item(api: Api, db: Db) -> None:
    """The receipt is read before any authority check."""
    api.approve("q", 5)
    api.enqueue()
    (lease,) = api.acquire(worker="w1")
    body = {"worker": "w1", "fence": lease["fence"], "reason": "r"}
    first = api.holder("requeue", lease["item_id"], key="rq", **body)
    assert first.status_code == 200
    (successor,) = api.acquire(worker="w2")
    expire(db, successor["item_id"])
    (third,) = api.acquire(worker="w3")
    assert third["fence"] == 3
    replay = api.holder("requeue", lease["item_id"], key="rq", **body)
    assert replay.status_code == 200
    assert replay.content == first.content
    assert replay.headers["Idempotent-Replayed"] == "true"


def test_keys_are_scoped_to_the_tenant(api: Api) -> None:
    other = setup_tenant(api.url, api.admin, "globex")
    mine = api.worker.post(
        "/v1/tenants/acme/queues/q/items", json={"payload": 1}, headers={"Idempotency-Key": "same"}
    )
    theirs = other.worker.post(
        "/v1/tenants/globex/queues/q/items",
        json={"payload": 1},
        headers={"Idempotency-Key": "same"},
    )
    assert theirs.status_code == 201
    assert "Idempotent-Replayed" not in theirs.headers
    assert theirs.json()["item_id"] != mine.json()["item_id"]
    assert theirs.json()["tenant"] == "globex"


def test_concurrent_same_key_completes_make_one_effect(api: Api, db: Db) -> None:
    api.enqueue()
    (lease,) = api.acquire()
    barrier = threading.Barrier(8)
    answers: list[httpx.Response] = []

    def complete() -> None:
        with api.client(api.keys["worker"]) as client:
            barrier.wait()
            answers.append(
                client.post(
                    f"/v1/tenants/acme/items/{lease['item_id']}/complete",
                    json={"worker": "w1", "fence": lease["fence"], "result": "done"},
                    headers={"Idempotency-Key": "once"},
                )
            )

    threads = [threading.Thread(target=complete) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {answer.status_code for answer in answers} == {200}
    assert len({answer.content for answer in answers}) == 1
    assert sum(answer.headers.get("Idempotent-Replayed") == "true" for answer in answers) == 7
    events = db.execute("SELECT count(*) AS n FROM item_events WHERE kind = 'completed'").fetchone()
    assert events == {"n": 1}


def test_concurrent_same_key_enqueues_store_one_item(api: Api, db: Db) -> None:
    barrier = threading.Barrier(6)

    def enqueue() -> None:
        with api.client(api.keys["worker"]) as client:
            barrier.wait()
            response = client.post(
                "/v1/tenants/acme/queues/q/items",
                json={"payload": "x"},
                headers={"Idempotency-Key": "race"},
            )
            assert response.status_code == 201

    threads = [threading.Thread(target=enqueue) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert db.execute("SELECT count(*) AS n FROM work_items").fetchone() == {"n": 1}


def test_another_keys_refused_complete_cannot_squat_the_holders_idempotency_key(
    api: Api,
) -> None:
    """K2, another worker key of the tenant, sends the holder's predictable key first (the
    same body, its fence read from the item): refused, and kept as K2's answer only. The
    holder's complete then does what it asks, and each key's retry replays its own answer.
    Refusing the holder instead (a conflict on the key) would still let any key of the
    tenant block any holder's complete by guessing its key: a demanding user wants theirs."""
    created = api.admin.post("/v1/tenants/acme/keys", json={"role": "worker"})
    assert created.status_code == 201, created.text
    other = api.client(created.json()["secret"])
    item = api.enqueue()
    [lease] = api.acquire()
    done_x = f"done-{item['item_id']}"
    body = {"worker": "w1", "fence": lease["fence"]}
    path = f"/v1/tenants/acme/items/{item['item_id']}/complete"

    squat = other.post(path, json=body, headers={"Idempotency-Key": done_x})
    assert squat.status_code == 409, squat.text

    done = api.worker.post(path, json=body, headers={"Idempotency-Key": done_x})
    assert done.status_code == 200, done.text
    assert "Idempotent-Replayed" not in done.headers
    assert done.json()["state"] == "completed"

    again = api.worker.post(path, json=body, headers={"Idempotency-Key": done_x})
    assert again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.content == done.content
    squat_again = other.post(path, json=body, headers={"Idempotency-Key": done_x})
    assert squat_again.headers["Idempotent-Replayed"] == "true"
    assert squat_again.content == squat.content
