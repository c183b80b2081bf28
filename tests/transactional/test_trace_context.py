"""The caller's W3C trace context through an enqueue in the application's own transaction:
`queue_server.enqueue(..., traceparent, tracestate)` and `enqueue_many` keep it with each
item (the lease's `trace`, the ledger's `enqueued` event), a malformed one is dropped and
the enqueue still succeeds, `enqueue_in` passes the current OpenTelemetry span's context on
its own, and a retry from another trace is the same request."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
from typing import Any

import psycopg
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import format_span_id, format_trace_id
from psycopg.types.json import Jsonb
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from queue_server.client import enqueue_in, enqueue_many_in, errors
from tests.helpers.api import Api
from tests.helpers.roles import AppRole, Roles

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
TRACESTATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
DB = psycopg.Connection[dict[str, object]]
OTHER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture(autouse=True)
def approved(api: Api) -> None:
    """Up to 20 leases of `emails` at once (the policy's default concurrency is 1)."""
    api.approve("emails", 20)


def leased_trace(api: Api, item_id: str, queue: str = "emails") -> Any:
    """The `trace` of the item's lease."""
    leases = api.acquire(queue)
    by_id = {lease["item_id"]: lease for lease in leases}
    assert item_id in by_id, leases
    return by_id[item_id]["trace"]


def enqueued_data(api: Api, item_id: str) -> dict[str, Any]:
    response = api.operator.get(f"/v1/tenants/acme/items/{item_id}/ledger")
    assert response.status_code == 200, response.text
    event = response.json()["events"][0]
    assert event["kind"] == "enqueued"
    data: dict[str, Any] = event["data"]
    return data


def kept(trace: Any) -> dict[str, str] | None:
    """A lease's `trace` without its age."""
    return None if trace is None else {k: v for k, v in trace.items() if k != "age"}


def test_the_function_keeps_the_trace_context_for_the_lease_and_the_ledger(
    api: Api, roles: Roles
) -> None:
    app = roles.make("acme")
    with app.connect() as conn:
        conn.execute("INSERT INTO orders (customer) VALUES ('ada')")
        row = conn.execute(
            "SELECT queue_server.enqueue('acme', 'emails', %s, 'order-1',"
            " traceparent => %s, tracestate => %s)",
            (Jsonb({"order": 1}), TRACEPARENT, TRACESTATE),
        ).fetchone()
        conn.commit()
    assert row is not None
    item_id = str(row[0])
    trace = leased_trace(api, item_id)
    assert kept(trace) == {"traceparent": TRACEPARENT, "tracestate": TRACESTATE}
    assert 0 <= trace["age"] < 60
    assert enqueued_data(api, item_id)["trace"] == {
        "traceparent": TRACEPARENT,
        "tracestate": TRACESTATE,
    }
    # Positional, after the other defaults: the same.
    with app.connect() as conn:
        row = conn.execute(
            "SELECT queue_server.enqueue('acme', 'emails', %s, 'order-2', 0, '0', NULL, %s)",
            (Jsonb({"order": 2}), OTHER),
        ).fetchone()
        conn.commit()
    assert row is not None
    assert kept(leased_trace(api, str(row[0]))) == {"traceparent": OTHER}


def test_enqueue_many_gives_every_item_the_trace_context(api: Api, roles: Roles) -> None:
    app = roles.make("acme")
    with app.connect() as conn:
        ids = enqueue_many_in(
            conn,
            "acme",
            "emails",
            [{"payload": {"page": n}} for n in range(3)],
            key="pages",
            traceparent=TRACEPARENT,
            tracestate=TRACESTATE,
        )
        conn.commit()
    leases = api.acquire("emails", max_items=3)
    assert sorted(str(lease["item_id"]) for lease in leases) == sorted(ids)
    for lease in leases:
        assert kept(lease["trace"]) == {"traceparent": TRACEPARENT, "tracestate": TRACESTATE}
    for item_id in ids:
        assert enqueued_data(api, item_id)["trace"]["traceparent"] == TRACEPARENT


@pytest.mark.parametrize(
    ("traceparent", "tracestate", "expected"),
    [
        # A malformed traceparent: no trace context at all (its tracestate goes with it).
        (TRACEPARENT.upper(), TRACESTATE, None),
        (f"00-{'0' * 32}-00f067aa0ba902b7-01", None, None),
        ("not a traceparent", None, None),
        # A malformed tracestate alone is dropped; the traceparent is kept.
        (TRACEPARENT, "k=v,k=w", {"traceparent": TRACEPARENT}),
    ],
)
def test_a_malformed_trace_context_is_dropped_and_the_enqueue_succeeds(
    api: Api, roles: Roles, traceparent: str, tracestate: str | None, expected: Any
) -> None:
    app = roles.make("acme")
    with app.connect() as conn:
        item_id = enqueue_in(
            conn,
            "acme",
            "emails",
            {"order": 3},
            key="order-3",
            traceparent=traceparent,
            tracestate=tracestate,
        )
        [many_id] = enqueue_many_in(
            conn,
            "acme",
            "emails",
            [{"payload": {"order": 4}}],
            key="order-4",
            traceparent=traceparent,
            tracestate=tracestate,
        )
        conn.commit()
    leases = {lease["item_id"]: lease for lease in api.acquire("emails", max_items=2)}
    assert set(leases) == {item_id, many_id}
    for one in (item_id, many_id):
        assert kept(leases[one]["trace"]) == expected
        assert enqueued_data(api, one).get("trace") == expected


def spans() -> tuple[Any, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("orders"), exporter


def traceparent_of(span: ReadableSpan) -> str:
    context = span.get_span_context()
    assert context is not None
    trace_id, span_id = format_trace_id(context.trace_id), format_span_id(context.span_id)
    return f"00-{trace_id}-{span_id}-{context.trace_flags:02x}"


def test_enqueue_in_records_the_current_spans_context_on_each_kind_of_connection(
    api: Api, roles: Roles
) -> None:
    app = roles.make("acme")
    tracer, exporter = spans()
    ids: dict[str, str] = {}
    with app.connect() as conn:
        with tracer.start_as_current_span("place order psycopg"):
            ids["place order psycopg"] = enqueue_in(conn, "acme", "emails", 1, key="k-sync")
        with tracer.start_as_current_span("place orders psycopg"):
            [ids["place orders psycopg"]] = enqueue_many_in(
                conn, "acme", "emails", [{"payload": 2}], key="k-many"
            )
        # Outside any span: none.
        untraced = enqueue_in(conn, "acme", "emails", 3, key="k-none")
        conn.commit()

    async def in_async() -> None:
        async with await psycopg.AsyncConnection.connect(app.conninfo) as conn:
            with tracer.start_as_current_span("place order async"):
                ids["place order async"] = await enqueue_in(
                    conn, "acme", "emails", 4, key="k-async"
                )
            with tracer.start_as_current_span("place orders async"):
                [ids["place orders async"]] = await enqueue_many_in(
                    conn, "acme", "emails", [{"payload": 5}], key="k-async-many"
                )
            await conn.commit()

    asyncio.run(in_async())
    engine = create_engine(app.url.replace("postgresql://", "postgresql+psycopg://", 1))
    try:
        with Session(engine) as session, session.begin():
            with tracer.start_as_current_span("place order sqlalchemy"):
                ids["place order sqlalchemy"] = enqueue_in(session, "acme", "emails", 6, key="k-sa")
            with tracer.start_as_current_span("place orders sqlalchemy"):
                [ids["place orders sqlalchemy"]] = enqueue_many_in(
                    session, "acme", "emails", [{"payload": 7}], key="k-sa-many"
                )
    finally:
        engine.dispose()
    finished = {span.name: span for span in exporter.get_finished_spans()}
    assert set(finished) == set(ids)
    leases = {lease["item_id"]: lease for lease in api.acquire("emails", max_items=10)}
    assert set(leases) == {*ids.values(), untraced}
    for name, item_id in ids.items():
        assert kept(leases[item_id]["trace"]) == {"traceparent": traceparent_of(finished[name])}
        assert enqueued_data(api, item_id)["trace"]["traceparent"] == traceparent_of(finished[name])
    assert leases[untraced]["trace"] is None


def test_a_given_trace_context_wins_over_the_current_span(api: Api, roles: Roles) -> None:
    app = roles.make("acme")
    tracer, _ = spans()
    with app.connect() as conn, tracer.start_as_current_span("place order"):
        item_id = enqueue_in(conn, "acme", "emails", 1, key="k", traceparent=OTHER)
        conn.commit()
    assert kept(leased_trace(api, item_id)) == {"traceparent": OTHER}


def test_a_replay_from_another_trace_is_the_same_request(api: Api, roles: Roles) -> None:
    app = roles.make("acme")
    tracer, _ = spans()
    with app.connect() as conn:
        first = enqueue_in(conn, "acme", "emails", {"order": 5}, key="order-5", traceparent=OTHER)
        [many] = enqueue_many_in(
            conn, "acme", "emails", [{"payload": 6}], key="order-6", traceparent=OTHER
        )
        conn.commit()
        # A retry with another context, with none, from inside another span: the same ids.
        retries = [(TRACEPARENT, TRACESTATE), (None, None)]
        for tp, ts in retries:
            assert (
                enqueue_in(
                    conn,
                    "acme",
                    "emails",
                    {"order": 5},
                    key="order-5",
                    traceparent=tp,
                    tracestate=ts,
                )
                == first
            )
            assert enqueue_many_in(
                conn,
                "acme",
                "emails",
                [{"payload": 6}],
                key="order-6",
                traceparent=tp,
                tracestate=ts,
            ) == [many]
            conn.commit()
        with tracer.start_as_current_span("retry"):
            assert enqueue_in(conn, "acme", "emails", {"order": 5}, key="order-5") == first
        conn.commit()
    # One item each, with the first call's context.
    leases = api.acquire("emails", max_items=10)
    assert sorted(str(lease["item_id"]) for lease in leases) == sorted([first, many])
    assert all(kept(lease["trace"]) == {"traceparent": OTHER} for lease in leases)


_WITHOUT_OPENTELEMETRY = """
import sys
# As if opentelemetry were not installed: every import of it fails.
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError(f"no module named {name!r}")
        return None
sys.meta_path.insert(0, Refuse())
import psycopg
from queue_server.client import enqueue_in, enqueue_many_in, errors
with psycopg.connect(sys.argv[1]) as conn:
    print(enqueue_in(conn, "acme", "emails", {"n": 1}, key="plain"))
    print(enqueue_in(conn, "acme", "emails", {"n": 2}, key="given", traceparent=sys.argv[2]))
    print(enqueue_many_in(conn, "acme", "emails", [{"payload": {"n": 3}}], key="many")[0])
assert not any(m.startswith("opentelemetry") for m in sys.modules), sorted(sys.modules)
"""


def test_without_opentelemetry_installed_enqueue_in_works_as_before(api: Api, roles: Roles) -> None:
    app: AppRole = roles.make("acme")
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_WITHOUT_OPENTELEMETRY), app.url, OTHER],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
    )
    assert done.returncode == 0, done.stderr
    plain, given, many = done.stdout.split()
    leases = {lease["item_id"]: lease for lease in api.acquire("emails", max_items=3)}
    assert set(leases) == {plain, given, many}
    assert leases[plain]["trace"] is None
    assert kept(leases[given]["trace"]) == {"traceparent": OTHER}
    assert leases[many]["trace"] is None


def test_a_trace_context_inside_an_item_of_enqueue_many_is_refused_by_name(
    api: Api, roles: Roles
) -> None:
    """One context per call: an item object with its own is an unknown field, and the
    refusal says where the context goes."""
    app = roles.make("acme")
    with app.connect() as conn, pytest.raises(errors.InvalidRequestError) as refused:
        enqueue_many_in(
            conn, "acme", "emails", [{"payload": 1}, {"payload": 2, "traceparent": TRACEPARENT}],
            key="k",
        )  # fmt: skip
    assert refused.value.detail == (
        "items[1]: only payload, priority, delay, max_acquisitions, unique_key, unique_for,"
        " partition_key, ordering_key, depends_on and on_dependency_failure are known (the"
        " trace context is an argument of the call, for every item)."
    )


def test_concurrent_retries_from_different_traces_make_one_item(
    api: Api, roles: Roles, db: DB
) -> None:
    """Eight transactions, each in its own trace, race the same key: every one commits with
    the same id, one item and one receipt exist, and the item keeps one of their contexts."""
    app = roles.make("acme")
    parents = [f"00-{n + 1:032x}-{n + 1:016x}-01" for n in range(8)]
    start = threading.Barrier(len(parents))
    ids: list[str] = []
    failures: list[BaseException] = []

    def retry(traceparent: str) -> None:
        try:
            with app.connect() as conn:
                start.wait(timeout=30)
                ids.append(
                    enqueue_in(
                        conn, "acme", "emails", {"order": 9}, key="order-9",
                        traceparent=traceparent,
                    )
                )  # fmt: skip
                conn.commit()
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=retry, args=(p,)) for p in parents]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert failures == []
    assert len(ids) == len(parents)
    assert len(set(ids)) == 1
    rows = db.execute("SELECT item_id, traceparent FROM work_items").fetchall()
    assert [str(r["item_id"]) for r in rows] == [ids[0]]
    assert rows[0]["traceparent"] in parents
    receipts = db.execute(
        "SELECT count(*) AS n FROM idempotency_receipts WHERE idempotency_key = 'order-9'"
    ).fetchone()
    assert receipts == {"n": 1}
