"""The producer's W3C trace context travels with its item: kept at enqueue (single, batch,
schedules), handed to each lease as `trace`, and on the ledger's `enqueued` event; a
malformed header is dropped, never refused."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from queue_server import tracecontext
from queue_server.services.ledgers import mismatches
from tests.helpers.api import Api

Db = psycopg.Connection[dict[str, object]]

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
TRACESTATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"


def enqueue(api: Api, headers: dict[str, str], queue: str = "q") -> dict[str, object]:
    response = api.worker.post(
        f"/v1/tenants/acme/queues/{queue}/items",
        json={"payload": {"n": 1}},
        headers={"Idempotency-Key": uuid.uuid4().hex, **headers},
    )
    assert response.status_code == 201, response.text
    item: dict[str, object] = response.json()
    return item


def enqueued_event(api: Api, item_id: object) -> dict[str, object]:
    events = api.worker.get(f"/v1/tenants/acme/items/{item_id}/ledger").json()["events"]
    assert events[0]["kind"] == "enqueued"
    event: dict[str, object] = events[0]
    return event


def test_the_lease_and_the_ledger_carry_the_enqueues_trace_context(api: Api, db: Db) -> None:
    item = enqueue(api, {"traceparent": TRACEPARENT, "tracestate": TRACESTATE})
    (lease,) = api.acquire()
    assert lease["item_id"] == item["item_id"]
    trace = lease["trace"]
    assert isinstance(trace, dict)
    assert trace["traceparent"] == TRACEPARENT
    assert trace["tracestate"] == TRACESTATE
    assert 0 <= trace["age"] < 60
    data = enqueued_event(api, item["item_id"])["data"]
    assert isinstance(data, dict)
    assert data["trace"] == {"traceparent": TRACEPARENT, "tracestate": TRACESTATE}
    # The ledger still folds to the row, trace context included.
    row = db.execute("SELECT * FROM work_items WHERE item_id = %s", [item["item_id"]]).fetchone()
    assert row is not None
    assert row["traceparent"] == TRACEPARENT
    events = db.execute(
        "SELECT * FROM item_events WHERE item_id = %s ORDER BY seq", [item["item_id"]]
    ).fetchall()
    assert mismatches(row, events) == []
    db.execute("UPDATE work_items SET traceparent = NULL WHERE item_id = %s", [item["item_id"]])
    row = db.execute("SELECT * FROM work_items WHERE item_id = %s", [item["item_id"]]).fetchone()
    assert row is not None
    assert mismatches(row, events) != []


def test_without_a_header_the_lease_has_no_trace(api: Api) -> None:
    item = enqueue(api, {})
    (lease,) = api.acquire()
    assert lease["trace"] is None
    assert "trace" not in enqueued_event(api, item["item_id"])["data"]  # type: ignore[operator]


@pytest.mark.parametrize(
    "headers",
    [
        {"traceparent": "garbage"},
        {"traceparent": f"01-{TRACE_ID}-00f067aa0ba902b7-01"},  # a version we do not read
        {"traceparent": f"00-{'0' * 32}-00f067aa0ba902b7-01"},  # the invalid trace id
        {"traceparent": f"00-{TRACE_ID}-{'0' * 16}-01"},  # the invalid parent id
        {"traceparent": TRACEPARENT.upper()},  # upper-case hex
        {"traceparent": TRACEPARENT + "-00"},  # version 00 has exactly four fields
        {"traceparent": f"00-{TRACE_ID[:-1]}-00f067aa0ba902b7-01"},  # one digit short
        {"traceparent": TRACEPARENT.replace("-01", "-1x")},
        {"tracestate": TRACESTATE},  # a tracestate alone
    ],
)
def test_a_malformed_traceparent_is_ignored_and_the_enqueue_succeeds(
    api: Api, headers: dict[str, str]
) -> None:
    enqueue(api, headers)
    (lease,) = api.acquire()
    assert lease["trace"] is None


def test_two_traceparent_headers_are_malformed_and_ignored(api: Api) -> None:
    response = api.worker.post(
        "/v1/tenants/acme/queues/q/items",
        json={"payload": None},
        headers=[
            ("Idempotency-Key", uuid.uuid4().hex),
            ("traceparent", TRACEPARENT),
            ("traceparent", f"00-{'1' * 32}-00f067aa0ba902b7-01"),
        ],
    )
    assert response.status_code == 201
    (lease,) = api.acquire()
    assert lease["trace"] is None


@pytest.mark.parametrize(
    "tracestate",
    ["no-equals-sign", "a=1,a=2", "x" * 600, "UPPER=1", "k=" + "v" * 300, "k=1,=2"],
)
def test_a_malformed_tracestate_is_dropped_and_the_traceparent_kept(
    api: Api, tracestate: str
) -> None:
    enqueue(api, {"traceparent": TRACEPARENT, "tracestate": tracestate})
    (lease,) = api.acquire()
    assert lease["trace"] is not None
    assert lease["trace"]["traceparent"] == TRACEPARENT  # type: ignore[index]
    assert "tracestate" not in lease["trace"]  # type: ignore[operator]


def test_every_item_of_a_batch_carries_the_requests_trace_context(api: Api) -> None:
    api.approve("q", 5)
    response = api.worker.post(
        "/v1/tenants/acme/queues/q/items:batch",
        json={"items": [{"payload": n} for n in range(3)]},
        headers={"Idempotency-Key": uuid.uuid4().hex, "traceparent": TRACEPARENT},
    )
    assert response.status_code == 201
    leases = api.acquire(max_items=3)
    assert len(leases) == 3
    assert [lease["trace"]["traceparent"] for lease in leases] == [TRACEPARENT] * 3  # type: ignore[index]


def test_a_schedules_items_carry_the_trace_context_it_was_put_with(api: Api) -> None:
    put = api.operator.put(
        "/v1/tenants/acme/schedules/nightly",
        json={"queue": "q", "payload": {"job": "nightly"}, "every": 3600},
        headers={"Idempotency-Key": uuid.uuid4().hex, "traceparent": TRACEPARENT},
    )
    assert put.status_code == 201, put.text

    def trigger(headers: dict[str, str]) -> None:
        response = api.operator.post(
            "/v1/tenants/acme/schedules/nightly/trigger",
            headers={"Idempotency-Key": uuid.uuid4().hex, **headers},
        )
        assert response.status_code == 201, response.text

    trigger({})
    (lease,) = api.acquire()
    assert lease["trace"]["traceparent"] == TRACEPARENT  # type: ignore[index]
    api.holder("complete", lease["item_id"], worker="w1", fence=lease["fence"], result=None)
    # A trigger's own header wins over the schedule's.
    own = f"00-{'a' * 32}-{'b' * 16}-01"
    trigger({"traceparent": own})
    (lease,) = api.acquire()
    assert lease["trace"]["traceparent"] == own  # type: ignore[index]
    api.holder("complete", lease["item_id"], worker="w1", fence=lease["fence"], result=None)
    # Put again under another trace: the fires from then on belong to it.
    again = f"00-{'c' * 32}-{'d' * 16}-01"
    put = api.operator.put(
        "/v1/tenants/acme/schedules/nightly",
        json={"queue": "q", "payload": {"job": "nightly"}, "every": 3600},
        headers={"Idempotency-Key": uuid.uuid4().hex, "traceparent": again},
    )
    assert put.status_code == 200, put.text
    trigger({})
    (lease,) = api.acquire()
    assert lease["trace"]["traceparent"] == again  # type: ignore[index]


def test_the_reader_follows_the_recommendation() -> None:
    parsed = tracecontext.parse(TRACEPARENT, TRACESTATE)
    assert parsed is not None
    assert (parsed.trace_id, parsed.parent_id) == (TRACE_ID, "00f067aa0ba902b7")
    assert tracecontext.parse(TRACEPARENT, " congo=t61 , tenant@vendor=x ") is not None
    assert tracecontext.valid_tracestate("tenant@vendor=x")
    assert not tracecontext.valid_tracestate(",".join(f"k{n}=v" for n in range(33)))
    assert not tracecontext.valid_tracestate("k=")
    headers = [
        (b"traceparent", TRACEPARENT.encode()),
        (b"tracestate", b"a=1"),
        (b"tracestate", b"b=2"),
    ]
    combined = tracecontext.from_headers(headers)
    assert combined is not None
    assert combined.tracestate == "a=1,b=2"
