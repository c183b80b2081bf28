"""100 application transactions, each on its own connection as the application's role, race
REST enqueues for the last room under the tenant's backlog cap: the cap is never exceeded,
every admitted item's transaction committed its order row, every refused one left nothing."""

from __future__ import annotations

import random
import threading
import time
import uuid

import psycopg

from queue_server.client import enqueue_in, errors
from tests.helpers.api import Api
from tests.helpers.invariants import assert_backlog_counter_matches, assert_ledgers_fold_to_rows
from tests.helpers.roles import Roles

DB = psycopg.Connection[dict[str, object]]
CAP = 60
PREFILLED = 20
APP_TRANSACTIONS = 100
REST_ENQUEUES = 30


def test_racing_application_transactions_and_rest_enqueues_never_overshoot_the_cap(
    api: Api, db: DB, roles: Roles
) -> None:
    assert api.admin.put("/v1/tenants/acme", json={"backlog_cap": CAP}).status_code == 200
    response = api.worker.post(
        "/v1/tenants/acme/queues/emails/items:batch",
        json={"items": [{"payload": {"prefill": n}} for n in range(PREFILLED)]},
        headers={"Idempotency-Key": "prefill"},
    )
    assert response.status_code == 201, response.text
    app = roles.make("acme")
    connections = [app.connect() for _ in range(APP_TRANSACTIONS)]
    start = threading.Barrier(APP_TRANSACTIONS + REST_ENQUEUES)
    lock = threading.Lock()
    admitted: list[tuple[int, str]] = []  # (order_id, item_id) of committed transactions
    refused: list[str] = []
    rest_admitted: list[str] = []
    failures: list[str] = []

    def application(n: int) -> None:
        conn = connections[n]
        start.wait()
        try:
            row = conn.execute(
                "INSERT INTO orders (customer) VALUES (%s) RETURNING order_id", (f"c{n}",)
            ).fetchone()
            assert row is not None
            order_id = int(str(row[0]))
            item_id = enqueue_in(conn, "acme", "emails", {"order": order_id}, key=f"order-{n}")
            # Hold the admission lock a moment: the others queue behind it.
            time.sleep(random.uniform(0, 0.005))
            conn.commit()
            with lock:
                admitted.append((order_id, item_id))
        except errors.BacklogCapReachedError as exc:
            conn.rollback()
            with lock:
                refused.append(exc.detail)
        except Exception as exc:  # the test fails on it below
            with lock:
                failures.append(repr(exc))
        finally:
            conn.close()

    def rest(n: int) -> None:
        with api.client(api.keys["worker"]) as client:
            start.wait()
            response = client.post(
                "/v1/tenants/acme/queues/emails/items",
                json={"payload": {"rest": n}},
                headers={"Idempotency-Key": uuid.uuid4().hex},
            )
        with lock:
            if response.status_code == 201:
                rest_admitted.append(response.json()["item_id"])
            elif response.json().get("code") != "backlog-cap-reached":
                failures.append(response.text)

    threads = [threading.Thread(target=application, args=(n,)) for n in range(APP_TRANSACTIONS)]
    threads += [threading.Thread(target=rest, args=(n,)) for n in range(REST_ENQUEUES)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert failures == []
    assert len(admitted) + len(refused) == APP_TRANSACTIONS
    # Exactly the room there was, shared between the two ways in; not one item more.
    assert PREFILLED + len(admitted) + len(rest_admitted) == CAP
    assert admitted
    assert refused
    items = db.execute(
        "SELECT item_id::text AS item_id, payload FROM work_items WHERE tenant_id = 'acme'"
    ).fetchall()
    assert len(items) == CAP
    assert api.operator.get("/v1/tenants/acme").json()["backlog"] == CAP
    # Each admitted item is the one its committed transaction enqueued, beside its order;
    # a refused transaction left neither its order nor a ledger row.
    by_id = {str(i["item_id"]): i["payload"] for i in items}
    assert {item_id: {"order": order_id} for order_id, item_id in admitted} == {
        item_id: payload
        for item_id, payload in by_id.items()
        if "order" in payload  # type: ignore[operator]
    }
    orders = db.execute("SELECT order_id FROM orders").fetchall()
    assert sorted(int(str(o["order_id"])) for o in orders) == sorted(o for o, _ in admitted)
    enqueued = db.execute("SELECT count(*) AS n FROM item_events WHERE kind = 'enqueued'")
    assert enqueued.fetchone() == {"n": CAP}
    assert_backlog_counter_matches(db)
    assert_ledgers_fold_to_rows(db)
