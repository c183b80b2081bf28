"""queue_server.enqueue inside an application's own transaction, as the application's own
database role: rolled back it leaves nothing, committed it is an item like any other (listed,
acquired, ledgered, counted), refusals are SQL errors with their own SQLSTATE, and a role
may enqueue only for the tenants it was granted."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from queue_server.client import enqueue_in, enqueue_many_in, errors
from queue_server.settings import Settings
from tests.helpers.api import Api, setup_tenant
from tests.helpers.roles import Roles
from tests.helpers.wake import ParkedAcquire

DB = psycopg.Connection[dict[str, object]]
ENQUEUE = "SELECT queue_server.enqueue(%s, %s, %s, %s)"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """A poll far longer than the wake measured here: only the NOTIFY delivered at the
    application's commit can hand the parked acquire its item in time."""
    return Settings(data_dir=tmp_path, poll_interval=5.0, lock_timeout_ms=2000)


def backlog(api: Api) -> int:
    response = api.operator.get(f"/v1/tenants/{api.tenant}")
    assert response.status_code == 200, response.text
    return int(response.json()["backlog"])


def listed(api: Api, queue: str = "emails") -> list[dict[str, object]]:
    response = api.operator.get(f"/v1/tenants/{api.tenant}/items", params={"queue": queue})
    assert response.status_code == 200, response.text
    items: list[dict[str, object]] = response.json()["items"]
    return items


def count(db: DB, sql: str, *params: object) -> int:
    row = db.execute(sql, params).fetchone()
    assert row is not None
    return int(str(next(iter(row.values()))))


def test_a_rolled_back_transaction_leaves_no_item_no_ledger_row_and_no_backlog(
    api: Api, db: DB, roles: Roles
) -> None:
    app = roles.make("acme")
    with app.connect() as conn:
        conn.execute("INSERT INTO orders (customer) VALUES ('ada')")
        item_id = conn.execute(ENQUEUE, ("acme", "emails", Jsonb({"order": 1}), "order-1"))
        assert item_id.fetchone() is not None
        conn.rollback()
    assert listed(api) == []
    assert count(db, "SELECT count(*) FROM work_items") == 0
    assert count(db, "SELECT count(*) FROM item_events") == 0
    assert count(db, "SELECT count(*) FROM orders") == 0
    assert count(db, "SELECT count(*) FROM idempotency_receipts") == 0
    assert backlog(api) == 0
    # The key was never used: a later transaction with it enqueues.
    with app.connect() as conn:
        assert enqueue_in(conn, "acme", "emails", {"order": 1}, key="order-1")
    assert len(listed(api)) == 1


def test_a_committed_enqueue_is_ready_listed_acquired_and_ledgered_as_the_role(
    api: Api, db: DB, roles: Roles
) -> None:
    app = roles.make("acme")
    with app.connect() as conn:
        row = conn.execute("INSERT INTO orders (customer) VALUES ('ada') RETURNING order_id")
        order_id = row.fetchone()[0]  # type: ignore[index]
        item_id = enqueue_in(conn, "acme", "emails", {"order": order_id}, key=f"order-{order_id}")
        # Not visible to anyone before the application commits.
        assert listed(api) == []
        conn.commit()
    [item] = listed(api)
    assert item["item_id"] == item_id
    assert (item["state"], item["payload"], item["queue"]) == ("ready", {"order": 1}, "emails")
    assert item["max_acquisitions"] == 3  # the tenant's default
    assert backlog(api) == 1
    [lease] = api.acquire("emails")
    assert (lease["item_id"], lease["payload"]) == (item_id, {"order": 1})
    ledger = api.operator.get(f"/v1/tenants/acme/items/{item_id}/ledger").json()["events"]
    assert [(e["kind"], e["actor"]) for e in ledger] == [
        ("enqueued", f"role:{app.name}"),
        ("acquired", ledger[1]["actor"]),
    ]
    assert ledger[0]["data"]["payload"] == {"order": 1}


def test_a_commit_wakes_a_waiting_long_poll_acquire_within_100_ms(api: Api, roles: Roles) -> None:
    """The watch sees the item once the application commits (its transaction was in
    progress at the watch's earlier looks); without it the parked acquire would sleep to
    its next poll (5 s). Best of three within 100 ms (a loaded machine can stall
    one), every one well before the poll."""
    app = roles.make("acme")

    def one_wake(queue: str) -> float:
        parked = ParkedAcquire(api, queue)
        with app.connect() as conn:
            conn.execute("INSERT INTO orders (customer) VALUES ('ada')")
            enqueue_in(conn, "acme", queue, {"n": 1}, key=uuid.uuid4().hex)
            # A later transaction commits meanwhile: the watch's next looks see this one in
            # progress below their snapshot's xmax, and must look for it again.
            api.enqueue(f"{queue}-other", {"n": 2})
            time.sleep(0.3)  # uncommitted: nothing to wake for yet
            assert not parked.answered
            conn.commit()
            committed_at = time.monotonic()
        count, leased_at = parked.join()
        assert count == 1
        return leased_at - committed_at

    wakes = [one_wake(queue) for queue in ("q1", "q2", "q3")]
    assert min(wakes) < 0.1, wakes
    assert max(wakes) < 1.0, wakes


def test_the_same_key_and_arguments_return_the_same_item_and_other_arguments_are_refused(
    api: Api, db: DB, roles: Roles
) -> None:
    app = roles.make("acme")
    with app.connect() as conn:
        first = enqueue_in(conn, "acme", "emails", {"order": 7}, key="order-7", priority=2)
        # Again in the same transaction, and after the commit: the same item.
        assert enqueue_in(conn, "acme", "emails", {"order": 7}, key="order-7", priority=2) == first
        conn.commit()
        assert enqueue_in(conn, "acme", "emails", {"order": 7}, key="order-7", priority=2) == first
        conn.commit()
        with pytest.raises(errors.IdempotencyKeyReuseError) as reused:
            enqueue_in(conn, "acme", "emails", {"order": 8}, key="order-7", priority=2)
        conn.rollback()
        with pytest.raises(errors.IdempotencyKeyReuseError):
            enqueue_in(conn, "acme", "emails", {"order": 7}, key="order-7", priority=3)
        conn.rollback()
    assert reused.value.sqlstate == "QS409"
    assert isinstance(reused.value.__cause__, psycopg.Error)
    assert "order-7" in reused.value.detail
    assert [i["item_id"] for i in listed(api)] == [first]
    assert backlog(api) == 1
    # A key an API key used on the REST route is that API key's: the role's key of the
    # same name is a receipt of its own, which neither replays nor blocks the other.
    rest = api.worker.post(
        "/v1/tenants/acme/queues/emails/items",
        json={"payload": {"order": 9}},
        headers={"Idempotency-Key": "rest-9"},
    )
    assert rest.status_code == 201
    with app.connect() as conn:
        assert (
            enqueue_in(conn, "acme", "emails", {"order": 10}, key="rest-9")
            != rest.json()["item_id"]
        )


def test_at_the_cap_the_function_raises_backlog_cap_reached_with_its_own_sqlstate(
    api: Api, roles: Roles
) -> None:
    assert api.admin.put("/v1/tenants/acme", json={"backlog_cap": 2}).status_code == 200
    app = roles.make("acme")
    with app.connect() as conn:
        enqueue_many_in(conn, "acme", "emails", [{"payload": 1}, {"payload": 2}], key="two")
        conn.commit()
        with pytest.raises(psycopg.Error) as raw:
            conn.execute(ENQUEUE, ("acme", "emails", Jsonb(3), "three"))
        conn.rollback()
        with pytest.raises(errors.BacklogCapReachedError) as typed:
            enqueue_in(conn, "acme", "emails", 3, key="three")
        conn.rollback()
    assert raw.value.sqlstate == "QS429"
    assert raw.value.diag.message_primary == "backlog-cap-reached"
    assert raw.value.diag.message_detail == "Backlog 2 + 1 new would exceed the cap of 2."
    assert (typed.value.code, typed.value.sqlstate) == ("backlog-cap-reached", "QS429")
    assert backlog(api) == 2
    # The REST route is refused by the same admission, with its figures.
    refused = api.worker.post(
        "/v1/tenants/acme/queues/emails/items",
        json={"payload": 3},
        headers={"Idempotency-Key": "rest-3"},
    )
    assert refused.status_code == 429
    assert refused.json()["code"] == "backlog-cap-reached"


def test_enqueue_many_is_all_or_nothing_against_the_cap_and_keeps_the_order_given(
    api: Api, db: DB, roles: Roles
) -> None:
    assert api.admin.put("/v1/tenants/acme", json={"backlog_cap": 3}).status_code == 200
    app = roles.make("acme")
    with app.connect() as conn:
        with pytest.raises(errors.BacklogCapReachedError):
            enqueue_many_in(conn, "acme", "emails", [{"payload": n} for n in range(4)], key="k4")
        conn.rollback()
        assert listed(api) == []
        assert api.admin.put("/v1/tenants/acme", json={"backlog_cap": 10}).status_code == 200
        batch = [{"payload": n} for n in range(10)]
        batch[1] = {"payload": 1, "priority": 5, "delay": 60}
        ids = enqueue_many_in(conn, "acme", "emails", batch, key="k10")
        conn.commit()
        # The key again: the same ids, in the same order.
        assert enqueue_many_in(conn, "acme", "emails", batch, key="k10") == ids
        conn.commit()
    items = {i["item_id"]: i for i in listed(api)}
    assert [items[i]["payload"] for i in ids] == list(range(10))
    assert items[ids[1]]["priority"] == 5
    assert count(db, "SELECT count(*) FROM work_items WHERE available_at > now()") == 1
    assert len(set(ids)) == 10
    assert all(uuid.UUID(i).version == 7 for i in ids)  # time-ordered, like the REST route's


def test_above_the_envelope_the_function_names_the_cell_and_bad_arguments_name_the_field(
    api: Api, roles: Roles
) -> None:
    app = roles.make("acme")
    with app.connect() as conn:
        with pytest.raises(errors.PolicyEnvelopeError) as above:
            enqueue_in(conn, "acme", "emails", {}, key="k", max_acquisitions=6)
        conn.rollback()
        cases: list[tuple[dict[str, Any], str]] = [
            ({"queue": "no spaces"}, "No queue can be named"),
            ({"key": ""}, "idempotency_key must be 1 to 255 printable ASCII"),
            ({"priority": 2_000_000}, "items[0]: priority must be a whole number from"),
            ({"delay": -1}, "items[0]: delay must be 0 to 31536000 seconds"),
            ({"max_acquisitions": 0}, "items[0]: max_acquisitions must be a whole number"),
        ]
        for change, message in cases:
            call: dict[str, Any] = {"queue": "emails", "key": "k", **change}
            with pytest.raises(errors.InvalidRequestError) as bad:
                enqueue_in(conn, "acme", payload={}, **call)
            conn.rollback()
            assert bad.value.sqlstate == "QS400", change
            assert message in bad.value.detail, (change, bad.value.detail)
        with pytest.raises(errors.InvalidRequestError) as unknown:
            enqueue_many_in(conn, "acme", "emails", [{"payload": 1, "colour": "red"}], key="k")
        conn.rollback()
    assert above.value.sqlstate == "QS422"
    assert "durable-leased-work/retry" in above.value.detail
    assert "attempt cap of 5" in above.value.detail
    assert "only payload, priority, delay, max_acquisitions, unique_key" in unknown.value.detail
    assert "depends_on and on_dependency_failure are known" in unknown.value.detail
    assert listed(api) == []


def test_a_role_without_the_grant_gets_permission_denied_and_sees_no_table(
    api: Api, db: DB, roles: Roles
) -> None:
    outsider = roles.make(member=False)
    member_only = roles.make()  # a member of queue_server_enqueuer, no tenant granted
    granted = roles.make("acme")
    for role, message in (
        (outsider, "permission denied for function enqueue"),
        (member_only, "permission denied to enqueue for tenant acme"),
    ):
        with role.connect() as conn:
            with pytest.raises(errors.EnqueueNotGrantedError) as denied:
                enqueue_in(conn, "acme", "emails", {}, key=uuid.uuid4().hex)
            assert denied.value.sqlstate == "42501"
            assert message in str(denied.value.__cause__), role
    # EXECUTE on the two functions and nothing else: no table, no inner function.
    for statement, refusal in (
        ("SELECT count(*) FROM work_items", "permission denied for table work_items"),
        (
            "INSERT INTO tenants (tenant_id, backlog_cap, default_max_acquisitions,"
            " default_lease_ttl) VALUES ('x', 1, 1, '1 s')",
            "permission denied for table tenants",
        ),
        # admit runs with its caller's rights: none on the tables.
        (
            "SELECT * FROM queue_server.admit('acme', 'q', '[]', 'me', 100, 1000000)",
            "permission denied for table",
        ),
        (
            "SELECT queue_server.enqueue_items('acme', 'q', '[{\"payload\": 1}]', 'k', 'x',"
            " NULL, NULL)",
            "permission denied for function enqueue_items",
        ),
        (
            "SELECT queue_server.grant_enqueue('someone', 'acme', 'pw')",
            "permission denied for function grant_enqueue",
        ),
        (
            "SELECT queue_server.revoke_enqueue('someone', 'acme')",
            "permission denied for function revoke_enqueue",
        ),
    ):
        with (
            granted.connect() as conn,
            pytest.raises(psycopg.errors.InsufficientPrivilege, match=refusal),
        ):
            conn.execute(statement)
    assert count(db, "SELECT count(*) FROM work_items") == 0


def test_a_role_granted_one_tenant_cannot_enqueue_for_another(
    api: Api, db: DB, roles: Roles
) -> None:
    beta = setup_tenant(api.url, api.admin, "beta")
    app = roles.make("acme")
    both = roles.make("acme", "beta")
    with app.connect() as conn:
        with pytest.raises(errors.EnqueueNotGrantedError) as denied:
            enqueue_in(conn, "beta", "emails", {}, key="k")
        conn.rollback()
        assert "permission denied to enqueue for tenant beta" in str(denied.value.__cause__)
        enqueue_in(conn, "acme", "emails", {}, key="k")
        conn.commit()
    with both.connect() as conn:
        enqueue_in(conn, "beta", "emails", {}, key="k")
        conn.commit()
    assert len(listed(api)) == 1
    assert len(listed(beta)) == 1
    # Revoked: the next call is refused at once.
    db.execute("SELECT queue_server.revoke_enqueue(%s, 'beta')", (both.name,))
    with both.connect() as conn, pytest.raises(errors.EnqueueNotGrantedError):
        enqueue_in(conn, "beta", "emails", {}, key="k2")
