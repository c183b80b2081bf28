"""Enqueue, the backlog cap, reading items and ledgers, and refusing bad input."""

from __future__ import annotations

import json
import socket
import uuid

import psycopg
import pytest

from tests.helpers.api import Api

ITEMS = "/v1/tenants/acme/queues/q/items"


def _count(db: psycopg.Connection[dict[str, object]], table: str) -> int:
    row = db.execute(f"SELECT count(*) AS n FROM {table}").fetchone()
    assert row is not None
    return int(str(row["n"]))


def test_enqueue_returns_the_new_ready_item(api: Api) -> None:
    item = api.enqueue(payload={"to": "a@example.com"}, priority=5)
    assert item["state"] == "ready"
    assert item["fence"] == 0
    assert item["acquisition_count"] == 0
    assert item["max_acquisitions"] == 3  # the tenant's default
    assert item["payload"] == {"to": "a@example.com"}
    assert item["priority"] == 5
    assert str(item["created_at"]).endswith("Z")
    fetched = api.worker.get(f"/v1/tenants/acme/items/{item['item_id']}").json()
    assert fetched == item


def test_batch_enqueue_keeps_order_and_writes_one_ledger_row_each(api: Api) -> None:
    response = api.worker.post(
        f"{ITEMS}:batch",
        json={"items": [{"payload": i} for i in range(10)]},
        headers={"Idempotency-Key": "b1"},
    )
    assert response.status_code == 201
    items = response.json()["items"]
    assert [item["payload"] for item in items] == list(range(10))
    ledger = api.worker.get(f"/v1/tenants/acme/items/{items[3]['item_id']}/ledger").json()
    assert [event["kind"] for event in ledger["events"]] == ["enqueued"]


def test_enqueue_at_the_cap_is_429_and_batch_is_all_or_nothing(
    api: Api, db: psycopg.Connection[dict[str, object]]
) -> None:
    api.admin.put("/v1/tenants/acme", json={"backlog_cap": 3})
    api.enqueue()
    refused = api.worker.post(
        f"{ITEMS}:batch",
        json={"items": [{"payload": 1}, {"payload": 2}, {"payload": 3}]},
        headers={"Idempotency-Key": "big"},
    )
    assert refused.status_code == 429
    assert refused.json()["code"] == "backlog-cap-reached"
    assert _count(db, "work_items") == 1
    fits = api.worker.post(
        f"{ITEMS}:batch",
        json={"items": [{"payload": 1}, {"payload": 2}]},
        headers={"Idempotency-Key": "fits"},
    )
    assert fits.status_code == 201
    full = api.worker.post(ITEMS, json={"payload": 9}, headers={"Idempotency-Key": "one-more"})
    assert full.status_code == 429


def test_a_429_is_not_kept_as_a_receipt(api: Api) -> None:
    api.admin.put("/v1/tenants/acme", json={"backlog_cap": 1})
    first = api.enqueue()
    refused = api.worker.post(ITEMS, json={"payload": 2}, headers={"Idempotency-Key": "retry-me"})
    assert refused.status_code == 429
    (lease,) = api.acquire()
    assert lease["item_id"] == first["item_id"]
    api.holder("complete", lease["item_id"], worker="w1", fence=lease["fence"])
    retried = api.worker.post(ITEMS, json={"payload": 2}, headers={"Idempotency-Key": "retry-me"})
    assert retried.status_code == 201
    assert "Idempotent-Replayed" not in retried.headers


def test_requeue_is_never_blocked_by_the_cap(api: Api) -> None:
    api.admin.put("/v1/tenants/acme", json={"backlog_cap": 1})
    api.enqueue()
    (lease,) = api.acquire()
    response = api.holder(
        "requeue", lease["item_id"], worker="w1", fence=lease["fence"], reason="x"
    )
    assert response.status_code == 200
    assert response.json()["state"] == "ready"


def test_validation_errors_are_422_problems_naming_the_fields(api: Api) -> None:
    response = api.worker.post(
        f"{ITEMS}:batch",
        json={"items": [{"payload": 1, "priority": "high", "surprise": True}]},
        headers={"Idempotency-Key": "v"},
    )
    assert response.status_code == 422
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["code"] == "invalid-request"
    locations = [".".join(map(str, err["loc"])) for err in body["errors"]]
    assert "body.items.0.priority" in locations
    assert "body.items.0.surprise" in locations


@pytest.mark.parametrize(
    "path",
    [
        "/v1/tenants/acme/queues/bad queue/items",
        "/v1/tenants/acme/queues/" + "q" * 65 + "/items",
        "/v1/tenants/acme/queues/-dash/items",
    ],
)
def test_bad_queue_names_are_refused(api: Api, path: str) -> None:
    response = api.worker.post(path, json={"payload": 1}, headers={"Idempotency-Key": "n"})
    assert response.status_code == 422


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ({"payload": "a\u0000b"}, "NUL in a string"),
        ({"payload": {"k\u0000": 1}}, "NUL in a key"),
        ({"payload": 1, "priority": 10**30}, "absurd priority"),
        ({"payload": {"n": 10**30}}, "an integer beyond 64 bits"),
        ({"payload": 1, "delay": 1e300}, "absurd delay"),
        ({"payload": 1, "max_acquisitions": 0}, "no budget"),
        ({"payload": 1, "max_acquisitions": 101}, "budget too large"),
    ],
)
def test_hostile_bodies_get_a_4xx_and_write_nothing(
    api: Api, db: psycopg.Connection[dict[str, object]], body: dict[str, object], why: str
) -> None:
    response = api.worker.post(ITEMS, json=body, headers={"Idempotency-Key": uuid.uuid4().hex})
    assert 400 <= response.status_code < 500, why
    assert response.headers["content-type"] == "application/problem+json"
    assert _count(db, "work_items") == 0
    assert _count(db, "idempotency_receipts") == 0


@pytest.mark.parametrize(
    "raw",
    [
        b'{"payload": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
        b'{"payload": "\\ud800"}',
        b'{"payload": 1e400}',
        b'{"payload": NaN}',
        b"not json",
    ],
)
def test_malformed_json_gets_a_4xx_problem(
    api: Api, db: psycopg.Connection[dict[str, object]], raw: bytes
) -> None:
    response = api.worker.post(
        ITEMS,
        content=raw,
        headers={"Idempotency-Key": "m", "Content-Type": "application/json"},
    )
    assert 400 <= response.status_code < 500
    assert response.headers["content-type"] == "application/problem+json"
    assert _count(db, "work_items") == 0


def test_bodies_over_one_mebibyte_get_413(api: Api) -> None:
    big = json.dumps({"payload": "x" * (1024 * 1024)}).encode()
    response = api.worker.post(
        ITEMS, content=big, headers={"Idempotency-Key": "big", "Content-Type": "application/json"}
    )
    assert response.status_code == 413
    assert response.json()["code"] == "payload-too-large"


def test_a_body_of_exactly_one_mebibyte_is_accepted_one_byte_more_is_413(api: Api) -> None:
    """The limit is inclusive: a Content-Length of exactly max_body_bytes is read."""
    limit = 1024 * 1024
    frame = len(json.dumps({"payload": ""}).encode())
    exact = json.dumps({"payload": "x" * (limit - frame)}).encode()
    assert len(exact) == limit
    headers = {"Content-Type": "application/json"}
    response = api.worker.post(ITEMS, content=exact, headers={**headers, "Idempotency-Key": "at"})
    assert response.status_code == 201, response.text[:200]
    over = exact[:-1] + b" }"
    response = api.worker.post(ITEMS, content=over, headers={**headers, "Idempotency-Key": "over"})
    assert response.status_code == 413
    assert response.json()["code"] == "payload-too-large"


def test_chunked_bodies_over_the_limit_get_413(api: Api) -> None:
    def chunks() -> object:
        yield b'{"payload": "'
        for _ in range(1100):
            yield b"x" * 1024
        yield b'"}'

    with api.client(api.keys["worker"]) as client:
        response = client.post(
            ITEMS,
            content=chunks(),  # type: ignore[arg-type]
            headers={"Idempotency-Key": "chunked", "Content-Type": "application/json"},
        )
    assert response.status_code == 413


def test_unknown_item_is_404_item_not_found(api: Api) -> None:
    for item_id in (str(uuid.uuid4()), "not-a-uuid"):
        response = api.worker.get(f"/v1/tenants/acme/items/{item_id}")
        assert response.status_code == 404
        assert response.json()["code"] == "item-not-found"


def test_delayed_item_is_not_acquired_before_it_is_due(api: Api) -> None:
    api.enqueue(payload="later", delay=60)
    assert api.acquire() == []


def test_higher_priority_is_acquired_first(api: Api) -> None:
    api.enqueue(payload="low", priority=0)
    api.enqueue(payload="high", priority=10)
    (lease,) = api.acquire()
    assert lease["payload"] == "high"


def test_oversized_headers_get_431(api: Api) -> None:
    response = api.worker.get(
        "/v1/tenants/acme/queues/q/concurrency", headers={"X-Padding": "x" * 40_000}
    )
    assert response.status_code == 431
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["code"] == "headers-too-large"


def test_an_accepted_enqueue_replays_even_when_the_backlog_is_now_full(api: Api) -> None:
    api.admin.put("/v1/tenants/acme", json={"backlog_cap": 1})
    first = api.worker.post(ITEMS, json={"payload": 1}, headers={"Idempotency-Key": "once"})
    assert first.status_code == 201
    again = api.worker.post(ITEMS, json={"payload": 1}, headers={"Idempotency-Key": "once"})
    assert again.status_code == 201
    assert again.content == first.content
    refused = api.worker.post(ITEMS, json={"payload": 2}, headers={"Idempotency-Key": "new"})
    assert refused.status_code == 429


@pytest.mark.live
def test_a_request_the_http_parser_refuses_still_gets_a_problem(api: Api) -> None:
    # httpx refuses to send so long a URL; a raw socket does not.
    host, port = api.url.removeprefix("http://").split(":")
    request = (
        f"GET /v1/tenants/acme/dead-letters?cursor={'x' * 100_000} HTTP/1.1\r\nHost: {host}\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request.encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400")
    assert b"content-type: application/problem+json" in head.lower()
    assert json.loads(body)["code"] == "malformed-request"


def test_refusals_at_the_cap_are_slowed_down(api: Api) -> None:
    """A tenant hammering its full backlog gets each 429 only after a pause."""
    api.admin.put("/v1/tenants/acme", json={"backlog_cap": 1})
    api.enqueue()
    delay = api.worker.post(ITEMS, json={"payload": 1}, headers={"Idempotency-Key": "a"})
    assert delay.status_code == 429
    assert delay.elapsed.total_seconds() >= 0.1  # the default cap_refusal_delay


def test_more_than_100_header_fields_get_431_however_small(api: Api) -> None:
    path = "/v1/tenants/acme/queues/q/concurrency"
    # The client's own fields (host, authorization, accept...) come on top of these.
    served = api.worker.get(path, headers={f"X-Pad-{i}": "x" for i in range(80)})
    assert served.status_code == 200, served.text
    refused = api.worker.get(path, headers={f"X-Pad-{i}": "x" for i in range(101)})
    assert refused.status_code == 431, refused.text
    assert refused.json()["code"] == "headers-too-large"
