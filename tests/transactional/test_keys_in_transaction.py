"""The keys of the REST enqueue, in an application's own transaction (migration 0034): an
ordering key lines items up, a unique key answers with the item holding it (for a period,
too), a partition key is kept for the rate limit; bad keys are refused naming the field, and
a call with keys replays under its idempotency key like any other. Dependencies too
(migration 0036): the item waits until the items it names have completed."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from queue_server.client import NewItem, enqueue_in, enqueue_many_in, errors
from tests.helpers.api import Api
from tests.helpers.items import complete_leases
from tests.helpers.roles import Roles

DB = psycopg.Connection[dict[str, object]]


def item(api: Api, item_id: str) -> dict[str, Any]:
    response = api.operator.get(f"/v1/tenants/{api.tenant}/items/{item_id}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_an_ordering_key_lines_the_items_of_a_transaction_up_behind_each_other(
    api: Api, roles: Roles
) -> None:
    app = roles.make("acme")
    with app.connect() as conn:
        ids = enqueue_many_in(
            conn,
            "acme",
            "ledger",
            [
                {"payload": 1, "ordering_key": "acct-9", "partition_key": "cust-1"},
                NewItem(payload=2, ordering_key="acct-9"),
                {"payload": 3},
            ],
            key="lines",
        )
        # And one more by the single function, behind the two.
        last = enqueue_in(conn, "acme", "ledger", 4, key="line-4", ordering_key="acct-9")
        conn.commit()
    first, second, free = (item(api, i) for i in ids)
    assert [first["state"], second["state"], free["state"], item(api, last)["state"]] == [
        "ready",
        "waiting",
        "ready",
        "waiting",
    ]
    assert (first["ordering_key"], first["partition_key"]) == ("acct-9", "cust-1")
    assert free["ordering_key"] is None
    api.approve("ledger", 10)
    leases = {x["item_id"]: x for x in api.acquire("ledger", max_items=10)}
    assert set(leases) == {ids[0], ids[2]}  # the first of the key, and the free one
    done = api.holder("complete", ids[0], worker="w1", fence=leases[ids[0]]["fence"], result=1)
    assert done.status_code == 200, done.text
    assert item(api, ids[1])["state"] == "ready"
    assert item(api, last)["state"] == "waiting"


def test_a_unique_key_held_answers_with_its_holder_in_the_call_and_across_calls(
    api: Api, db: DB, roles: Roles
) -> None:
    app = roles.make("acme")
    with app.connect() as conn:
        made = enqueue_in(conn, "acme", "reports", {"day": 1}, key="r1", unique_key="day-1")
        again = enqueue_in(conn, "acme", "reports", {"day": 1}, key="r2", unique_key="day-1")
        assert again == made
        # In one call: the second item with a key is answered with the first's id.
        pair = enqueue_many_in(
            conn,
            "acme",
            "reports",
            [{"payload": 2, "unique_key": "day-2"}, {"payload": 2, "unique_key": "day-2"}],
            key="r3",
        )
        assert pair[0] == pair[1] != made
        conn.commit()
        # The same idempotency key replays the same answer, holder included.
        assert (
            enqueue_many_in(
                conn,
                "acme",
                "reports",
                [{"payload": 2, "unique_key": "day-2"}, {"payload": 2, "unique_key": "day-2"}],
                key="r3",
            )
            == pair
        )
        conn.commit()
    count = db.execute("SELECT count(*) AS n FROM work_items WHERE queue = 'reports'").fetchone()
    assert count == {"n": 2}
    # Finished, the key is free again, unless a period says otherwise.
    [lease] = api.acquire("reports")
    assert lease["item_id"] == made
    assert api.holder("complete", made, worker="w1", fence=lease["fence"]).status_code == 200
    with app.connect() as conn:
        fresh = enqueue_in(conn, "acme", "reports", {"day": 1}, key="r4", unique_key="day-1")
        assert fresh != made
        within = enqueue_in(
            conn,
            "acme",
            "reports",
            {"day": 1},
            key="r5",
            unique_key="day-1",
            unique_for=timedelta(days=1),
        )
        assert within == fresh
        conn.commit()


def test_bad_keys_are_refused_naming_the_field_and_a_call_without_keys_is_unchanged(
    api: Api, roles: Roles
) -> None:
    app = roles.make("acme")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"ordering_key": "two words"}, "items[0]: ordering_key must be 1 to 255 printable"),
        ({"partition_key": ""}, "items[0]: partition_key must be 1 to 255 printable"),
        ({"unique_key": 7}, "items[0]: unique_key must be 1 to 255 printable"),
        ({"unique_key": "k", "unique_for": 0}, "items[0]: unique_for must be more than 0"),
        ({"unique_key": "k", "unique_for": "1d"}, "items[0]: unique_for must be a number"),
        ({"unique_for": 60}, "items[0]: unique_for is a period of a unique_key"),
    ]
    with app.connect() as conn:
        for fields, message in cases:
            with pytest.raises(errors.InvalidRequestError) as bad:
                enqueue_many_in(conn, "acme", "q", [{"payload": 1, **fields}], key="bad")
            conn.rollback()
            assert message in bad.value.detail, (fields, bad.value.detail)
        # The function's own arguments are checked the same way.
        with pytest.raises(errors.InvalidRequestError) as single:
            enqueue_in(conn, "acme", "q", 1, key="bad", ordering_key="x" * 256)
        conn.rollback()
        assert "items[0]: ordering_key must be 1 to 255" in single.value.detail
        # No key given: the item has none, and the call is the one an older server knows.
        plain = enqueue_in(conn, "acme", "q", 1, key="plain")
        conn.commit()
    body = item(api, plain)
    assert (body["unique_key"], body["ordering_key"], body["partition_key"]) == (None, None, None)


def test_an_item_enqueued_in_a_transaction_waits_for_its_dependencies(
    api: Api, roles: Roles
) -> None:
    api.approve("steps", 10)
    app = roles.make("acme")
    with app.connect() as conn:
        a, b = enqueue_many_in(
            conn, "acme", "steps", [{"payload": "a"}, {"payload": "b"}], key="ab"
        )
        joined = enqueue_in(
            conn, "acme", "album", "joined", key="joined", depends_on=[a, b],
            on_dependency_failure="wait",
        )  # fmt: skip
        (after,) = enqueue_many_in(
            conn, "acme", "album", [{"payload": "after", "depends_on": [joined]}], key="after"
        )
        conn.commit()
        # Again under the same keys: the same ids.
        assert enqueue_in(
            conn, "acme", "album", "joined", key="joined", depends_on=[a, b],
            on_dependency_failure="wait",
        ) == joined  # fmt: skip
        conn.commit()
        bad: list[tuple[dict[str, Any], str]] = [
            ({"depends_on": []}, "items[0]: depends_on must name 1 to 10,000 items"),
            ({"depends_on": [a] * 10_001}, "name at most 10,000 dependencies in all"),
            ({"depends_on": ["nope"]}, "items[0]: depends_on must be item ids (UUIDs)"),
            ({"depends_on": a}, "items[0]: depends_on must be an array of item ids"),
            ({"depends_on": [a], "on_dependency_failure": "skip"}, "must be cancel, run or wait"),
            ({"depends_on": [str(uuid.uuid4())]}, "depends_on: no item"),
        ]
        for fields, message in bad:
            with pytest.raises(errors.InvalidRequestError) as refused:
                enqueue_many_in(conn, "acme", "album", [{"payload": 1, **fields}], key="bad")
            conn.rollback()
            assert message in refused.value.detail, (fields, refused.value.detail)
    assert [item(api, i)["state"] for i in (joined, after)] == ["waiting", "waiting"]
    for lease in api.acquire("steps", max_items=10):
        done = api.holder("complete", lease["item_id"], worker="w1", fence=lease["fence"])
        assert done.status_code == 200, done.text
    assert [item(api, i)["state"] for i in (joined, after)] == ["ready", "waiting"]


def test_a_fan_in_larger_than_a_batch_is_one_transaction_all_or_nothing(
    api: Api, roles: Roles
) -> None:
    """1,200 items in three calls and the callback naming them all: rolled back, none of
    it is left; committed, the callback runs once the last of them is finished."""
    api.approve("parts", 100)
    assert api.admin.put(f"/v1/tenants/{api.tenant}", json={"backlog_cap": 2_000}).is_success
    app = roles.make("acme")
    payloads = list(range(1_200))

    def fan_in(conn: psycopg.Connection[Any], key: str) -> tuple[list[str], str]:
        ids: list[str] = []
        for n, at in enumerate(range(0, len(payloads), 500)):
            chunk = [{"payload": p} for p in payloads[at : at + 500]]
            ids += enqueue_many_in(conn, "acme", "parts", chunk, key=f"{key}/{n}")
        callback = enqueue_in(
            conn, "acme", "sums", "sum", key=f"{key}/callback", depends_on=ids,
            on_dependency_failure="run",
        )  # fmt: skip
        return ids, callback

    with app.connect() as conn:
        _, dropped = fan_in(conn, "dropped")
        conn.rollback()
        ids, callback = fan_in(conn, "kept")
        many = [{"payload": 1, "depends_on": ids * 5}, {"payload": 2, "depends_on": ids * 4}]
        with pytest.raises(errors.InvalidRequestError) as refused:
            enqueue_many_in(conn, "acme", "sums", many, key="too-many")
        assert "at most 10,000 dependencies in all" in refused.value.detail
        conn.rollback()
        ids, callback = fan_in(conn, "kept")
        conn.commit()
    gone = api.operator.get(f"/v1/tenants/{api.tenant}/items/{dropped}")
    assert gone.status_code == 404, gone.text
    assert item(api, callback)["state"] == "waiting"
    finished = 0
    while leases := api.acquire("parts", max_items=100):
        complete_leases(api, leases)
        finished += len(leases)
        assert item(api, callback)["state"] == ("ready" if finished == 1_200 else "waiting")
    assert finished == 1_200


def test_periods_as_timedeltas_and_a_null_payload_are_taken_and_refusals_typed_on_every_driver(
    api: Api, roles: Roles
) -> None:
    app = roles.make("acme")
    with app.connect() as conn:
        empty, later = enqueue_many_in(
            conn,
            "acme",
            "emails",
            [
                {"payload": None},  # a null payload is a payload
                {"payload": 1, "unique_key": "u-1", "unique_for": timedelta(minutes=5)},
            ],
            key="periods",
        )
        # A period in seconds, as the REST enqueue's.
        seconds = enqueue_in(conn, "acme", "emails", 2, key="k-s", unique_key="u-2", unique_for=90)
        conn.commit()
    assert item(api, empty)["payload"] is None
    assert item(api, later)["unique_key"] == "u-1"
    assert item(api, seconds)["unique_key"] == "u-2"

    # A refusal is the SDK's typed error whichever connection the call was made on.
    async def on_async() -> None:
        async with await psycopg.AsyncConnection.connect(app.conninfo) as conn:
            await enqueue_in(conn, "acme", "no spaces", {}, key="k")

    with pytest.raises(errors.InvalidRequestError, match="No queue can be named"):
        asyncio.run(on_async())
    engine = create_engine(app.url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with (
            pytest.raises(errors.InvalidRequestError, match="No queue can be named"),
            Session(engine) as session,
            session.begin(),
        ):
            enqueue_in(session, "acme", "no spaces", {}, key="k")
    finally:
        engine.dispose()
