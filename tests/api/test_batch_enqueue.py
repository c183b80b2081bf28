"""The batch enqueue's lean path: its body read by orjson exactly as `json.loads` reads it,
its fingerprint the model's dump, an answer rendered without reading its rows back that
says what was stored, and the tenant's admission lock taken last."""

from __future__ import annotations

import json
import threading
import time
import uuid
from typing import Any

import httpx
import orjson
import psycopg
import pytest

from queue_server.api import body, schemas
from queue_server.idempotency import Idempotency
from tests.helpers.api import Api

Db = psycopg.Connection[dict[str, object]]

BATCH = "/v1/tenants/acme/queues/q/items:batch"

BODIES: list[dict[str, Any]] = [
    {"items": [{"payload": {"n": 1}}]},
    {"items": [{"payload": None, "priority": -5, "delay": 3, "max_acquisitions": 2}]},
    {"items": [{}, {"payload": [1, 2.5, "x", True, None, {"b": 1, "a": [{}]}]}]},
    {"items": [{"payload": "é\u2028", "delay": 0.25}, {"payload": 2**63 - 1, "delay": 0}]},
    {"items": [{"payload": {"z": -(2**63), "y": 1e300, "x": -0.0}, "priority": 1_000_000}]},
    {
        "items": [{"payload": 1, "depends_on": ["01a248cb-426b-7cbd-aaae-1ab8fdb6cd7b"]}],
        "callback": {"queue": "albums", "payload": {"album": 1}, "priority": 2},
    },
]


@pytest.mark.parametrize("body", BODIES)
def test_the_batch_fingerprint_is_the_fingerprint_of_the_models_dump(body: dict[str, Any]) -> None:
    batch = schemas.BatchIn.model_validate(body)
    assert batch.canonical() == batch.model_dump(mode="json")
    fingerprint = Idempotency.of(
        "k", caller="k1", method="POST", path=BATCH, body=batch.canonical()
    )
    dumped = Idempotency.of(
        "k", caller="k1", method="POST", path=BATCH, body=batch.model_dump(mode="json")
    )
    assert fingerprint == dumped


RAW = [
    b'{"items": [{"payload": {"n": 1}}]}',
    b'{"items": [{"payload": 123456789012345678}]}',
    b'{"items": [{"payload": 1234567890123456789}]}',
    b'{"items": [{"payload": -9999999999999999999}]}',
    b'{"items": [{"payload": 18446744073709551615}]}',
    b'{"items": [{"payload": 123456789012345678901234567890}]}',
    b'{"items": [{"payload": 0.1234567890123456789}]}',
    b'{"items": [{"payload": [1e300, -0.0, 1E2, 5e-324]}]}',
    b'{"items": [{"payload": NaN}]}',
    b'{"items": [{"payload": "\\ud800"}]}',
    b'{"a": 1, "b": {"c": "\\u0000", "a": "x:y"}}',
    b'{"a:b": "\\u003a", "c": "\\\\u003A"}',
    '{"items": [{"payload": "\u00fc:"}]}'.encode(),
]

# Bytes the server refuses, all but the last read by json.loads: a member named twice (at
# any depth, whatever escapes surround it), and a JSON text that is not UTF-8.
REFUSED = [
    b'{"a": 1, "a": 2}',
    b'{"items": [{"payload": {"n": 1, "n": 1}}]}',
    b'{"items": [{"priority": 1, "payload": {}, "priority": 9}]}',
    b'{"k\\u003a": 1, "a": 1, "a": 2}',
    b'{"k\\u003A\\u003a": ":", "a": 1, "\\u0061": 2}',
    b'{"items": [{"payload": 123456789012345678901234567890, "payload": 1}]}',
    b'{"items": [{"payload": NaN, "payload": 1}]}',
    '\ufeff{"items": []}'.encode(),
    '{"items": [{"payload": "\u00fc"}]}'.encode("utf-16"),
    '{"items": [{"payload": "\u00fc"}]}'.encode("utf-16-le"),
    '{"items": []}'.encode("utf-32"),
    b'{"items": [{"payload": "\xff"}]}',
]


def _typed(value: Any) -> Any:
    """A value with each number's type kept: 1 and 1.0 (and True) compare unequal."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    return (type(value).__name__, repr(value))


@pytest.mark.parametrize("raw", RAW)
def test_a_body_reads_as_json_loads_reads_it(raw: bytes) -> None:
    assert _typed(body.loads(raw)) == _typed(json.loads(raw))


@pytest.mark.parametrize("raw", REFUSED)
def test_a_repeated_member_name_or_a_text_not_in_utf8_is_not_json_to_the_server(
    raw: bytes,
) -> None:
    with pytest.raises(json.JSONDecodeError):
        body.loads(raw)


@pytest.mark.parametrize(
    ("content_type", "read"),
    [
        ("application/json", True),
        ("application/json; charset=utf-8", True),
        ('application/json;charset="UTF-8"', True),
        ("application/json; charset=utf-16", False),
        ("application/json; charset=latin-1", False),
    ],
)
def test_a_charset_other_than_utf8_is_refused(content_type: str, read: bool) -> None:
    if read:
        assert body.loads(b'{"a": 1}', content_type) == {"a": 1}
    else:
        with pytest.raises(json.JSONDecodeError, match="UTF-8"):
            body.loads(b'{"a": 1}', content_type)


def test_a_batch_with_an_integer_beyond_64_bits_is_refused_as_a_single_enqueue_is(
    api: Api,
) -> None:
    # orjson would read it as a float and let it in; json reads the int the check refuses.
    for path, raw in (
        (BATCH, b'{"items": [{"payload": {"n": 123456789012345678901234567890}}]}'),
        (BATCH.removesuffix(":batch"), b'{"payload": {"n": 123456789012345678901234567890}}'),
    ):
        response = api.worker.post(
            path,
            content=raw,
            headers={"Idempotency-Key": uuid.uuid4().hex, "Content-Type": "application/json"},
        )
        assert response.status_code == 422, response.text
        assert "integers must fit in 64 bits" in response.text


def test_a_batch_answer_shows_each_item_as_stored_and_replays_byte_for_byte(
    api: Api, db: Db
) -> None:
    db.execute("UPDATE tenants SET default_max_acquisitions = 4 WHERE tenant_id = 'acme'")
    items = [
        {"payload": {"n": i, "nested": [i, {"k": "v"}]}, "priority": i % 3 - 1, "delay": delay}
        for i, delay in enumerate([0, 0.000001, 0.0000005, 0.0000015, 1.2345678, 59.9999995, 3])
    ]
    items[2]["max_acquisitions"] = 2
    items[4].pop("priority")
    key = uuid.uuid4().hex
    first = api.worker.post(BATCH, json={"items": items}, headers={"Idempotency-Key": key})
    assert first.status_code == 201, first.text
    answer = first.json()["items"]
    assert [a["payload"] for a in answer] == [i["payload"] for i in items]
    assert len({a["item_id"] for a in answer}) == len(items)
    for shown in answer:
        stored = api.worker.get(f"/v1/tenants/acme/items/{shown['item_id']}")
        assert stored.status_code == 200
        assert shown == stored.json()
    assert [a["max_acquisitions"] for a in answer] == [4, 4, 2, 4, 4, 4, 4]
    again = api.worker.post(BATCH, json={"items": items}, headers={"Idempotency-Key": key})
    assert again.status_code == 201
    assert again.content == first.content
    assert again.headers["Idempotent-Replayed"] == "true"
    row = db.execute("SELECT count(*) AS n FROM work_items").fetchone()
    assert row == {"n": len(items)}


def test_a_batch_enqueue_passes_over_the_admission_shards_another_transaction_holds(
    api: Api, db: Db, database_url: str
) -> None:
    with psycopg.connect(database_url) as holder:
        # Other admissions of the tenant, not yet committed, hold every even shard.
        holder.execute(
            "SELECT 1 FROM admission_shards WHERE tenant_id = 'acme' AND shard % 2 = 0"
            " FOR NO KEY UPDATE"
        )
        started = time.monotonic()
        response = api.worker.post(
            BATCH,
            json={"items": [{"payload": i} for i in range(50)]},
            headers={"Idempotency-Key": uuid.uuid4().hex},
        )
        assert response.status_code == 201, response.text
        assert time.monotonic() - started < 2.0
        # Charged to shards nobody else held (each holds 31 or 32 of the cap of 1,000).
        rows = db.execute(
            "SELECT admission_shard AS shard, count(*) AS n FROM work_items"
            " GROUP BY admission_shard"
        ).fetchall()
        counts = {int(str(r["shard"])): int(str(r["n"])) for r in rows}
        assert sum(counts.values()) == 50
        assert all(shard % 2 == 1 and n <= 32 for shard, n in counts.items()), counts
        holder.rollback()


def test_with_every_admission_shard_held_a_batch_enqueue_waits_for_one_to_be_let_go(
    api: Api, db: Db, database_url: str
) -> None:
    outcome: list[httpx.Response] = []
    with psycopg.connect(database_url) as holder:
        holder.execute("SELECT 1 FROM admission_shards WHERE tenant_id = 'acme' FOR NO KEY UPDATE")
        thread = threading.Thread(
            target=lambda: outcome.append(
                api.worker.post(
                    BATCH,
                    json={"items": [{"payload": i} for i in range(20)]},
                    headers={"Idempotency-Key": uuid.uuid4().hex},
                )
            )
        )
        thread.start()
        time.sleep(0.5)
        # It waits, polling (it holds no shard while it does: nothing to deadlock on).
        assert outcome == []
        assert db.execute("SELECT count(*) AS n FROM work_items").fetchone() == {"n": 0}
        holder.rollback()
    thread.join(timeout=10)
    assert len(outcome) == 1
    assert outcome[0].status_code == 201, outcome[0].text
    assert len(orjson.loads(outcome[0].content)["items"]) == 20


def test_the_routes_refuse_a_repeated_member_and_a_body_not_in_utf8_and_store_nothing(
    api: Api, db: Db
) -> None:
    """The single and batch enqueues (FastAPI's path), the complete (the hot path) and an
    operator's route answer 422 `invalid-request` naming why; nothing is stored."""
    items = f"/v1/tenants/{api.tenant}/items"
    enqueue = BATCH.removesuffix(":batch")
    api.enqueue(payload={"n": 0})
    (lease,) = api.acquire()
    complete = f"{items}/{lease['item_id']}/complete"
    fence = lease["fence"]
    utf8 = "application/json; charset=utf-8"
    cases: list[tuple[str, bytes, str, str]] = [
        (enqueue, b'{"payload": {"n": 1}, "priority": 1, "priority": 9}', utf8, "repeated"),
        (enqueue, b'{"payload": {"n": 1, "n": 2}}', utf8, "repeated"),
        (BATCH, b'{"items": [{"payload": 1, "delay": 0, "delay": 60}]}', utf8, "repeated"),
        (BATCH, '{"items": [{"payload": "\u00fc"}]}'.encode("utf-16"), utf8, "UTF-8"),
        (enqueue, b'{"payload": 1}', "application/json; charset=utf-16", "UTF-8"),
        (complete, f'{{"worker": "w1", "fence": {fence}, "fence": 99}}'.encode(), utf8, "repeated"),
        (complete, f'{{"worker": "w1", "fence": {fence}}}'.encode("utf-16"), utf8, "UTF-8"),
    ]
    for path, raw, content_type, why in cases:
        response = api.worker.post(
            path,
            content=raw,
            headers={"Idempotency-Key": uuid.uuid4().hex, "Content-Type": content_type},
        )
        assert response.status_code == 422, (path, raw, response.text)
        problem = response.json()
        assert problem["code"] == "invalid-request"
        assert why in problem["errors"][0]["msg"], problem
    stored = db.execute(
        "SELECT state::text AS state, count(*) AS n FROM work_items GROUP BY state"
    ).fetchall()
    assert stored == [{"state": "leased", "n": 1}]
    # The same bodies, each name once and in UTF-8, are taken.
    done = api.worker.post(
        complete,
        content=f'{{"worker": "w1", "fence": {fence}}}'.encode(),
        headers={"Idempotency-Key": uuid.uuid4().hex, "Content-Type": utf8},
    )
    assert done.status_code == 200, done.text
