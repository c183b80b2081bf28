"""When the database goes away or stops taking writes (a failover), the API answers 503
problems, never 500s, and the pool lets go of its connections to the old primary."""

from __future__ import annotations

import time
import uuid

import httpx
import psycopg

from queue_server.infra.embedded import EmbeddedPostgres
from tests.helpers.api import Api

Db = psycopg.Connection[dict[str, object]]


def _app_backends(db: Db, name: str = "queue-server%") -> set[int]:
    rows = db.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND application_name LIKE %s",
        (name,),
    ).fetchall()
    return {int(str(row["pid"])) for row in rows}


def _terminate_app_backends(db: Db) -> None:
    for pid in _app_backends(db):
        db.execute("SELECT pg_terminate_backend(%s)", (pid,))


def _enqueue(api: Api, key: str) -> httpx.Response:
    return api.worker.post(
        f"/v1/tenants/{api.tenant}/queues/q/items",
        json={"payload": {"n": 1}},
        headers={"Idempotency-Key": key},
    )


def _assert_unavailable_problem(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    assert response.json()["code"] == "service-unavailable"


def _until_created(api: Api, key: str, timeout: float = 15.0) -> httpx.Response:
    """Retry with the same key, as a client would, until the enqueue is answered."""
    deadline = time.monotonic() + timeout
    while True:
        response = _enqueue(api, key)
        if response.status_code != 503 or time.monotonic() > deadline:
            return response
        time.sleep(0.2)


def test_a_database_that_refuses_connections_gets_503_problems_then_recovers(
    api: Api, db: Db, pg: EmbeddedPostgres
) -> None:
    name = db.execute("SELECT current_database() AS d").fetchone()
    assert name is not None
    with psycopg.connect(pg.url(), autocommit=True) as server:
        server.execute(f'ALTER DATABASE "{name["d"]}" WITH ALLOW_CONNECTIONS false')
        try:
            _terminate_app_backends(db)
            _assert_unavailable_problem(_enqueue(api, uuid.uuid4().hex))
            _assert_unavailable_problem(api.worker.get(f"/v1/tenants/{api.tenant}/queues"))
            assert api.client(None).get("/readyz").status_code == 503
        finally:
            server.execute(f'ALTER DATABASE "{name["d"]}" WITH ALLOW_CONNECTIONS true')
    key = uuid.uuid4().hex
    assert _until_created(api, key).status_code == 201
    metrics = api.admin.get("/metrics").text
    assert 'queue_server_database_unavailable_total{cause="' in metrics


def test_a_demoted_primary_gets_503_problems_and_the_pool_drops_its_connections(
    api: Api, db: Db
) -> None:
    name = db.execute("SELECT current_database() AS d").fetchone()
    assert name is not None
    database = f'"{name["d"]}"'
    # Every new session is read-only, as on a primary that became a standby.
    db.execute(f"ALTER DATABASE {database} SET default_transaction_read_only = on")
    try:
        _terminate_app_backends(db)
        # Reads still work: the pool fills up with connections to the "standby".
        deadline = time.monotonic() + 10
        while api.worker.get(f"/v1/tenants/{api.tenant}/queues").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        held = _app_backends(db, "queue-server")  # the pool's, not the listener's
        assert held
        _assert_unavailable_problem(_enqueue(api, uuid.uuid4().hex))
    finally:
        db.execute(f"ALTER DATABASE {database} RESET default_transaction_read_only")
    # One refused write was enough: every connection the pool held then is gone.
    deadline = time.monotonic() + 5
    while _app_backends(db) & held:
        assert time.monotonic() < deadline, "the pool kept connections to the old primary"
        time.sleep(0.05)
    assert _until_created(api, uuid.uuid4().hex).status_code == 201
    metrics = api.admin.get("/metrics").text
    assert 'queue_server_database_unavailable_total{cause="read-only"}' in metrics
