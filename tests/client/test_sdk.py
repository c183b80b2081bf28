"""The SDK against the real server: typed answers, typed problems, retries that keep their key."""

from __future__ import annotations

import asyncio
import copy
import logging
import re
import time
from datetime import UTC, datetime, timedelta

import httpx
import psycopg
import pytest

from queue_server.client import AsyncQueueClient, NewItem, QueueClient, errors, is_transient
from queue_server.policy.loader import load_policy
from queue_server.policy.v2 import OPERATION_RELIABILITY_V2
from tests.helpers import web
from tests.helpers.api import Api
from tests.helpers.rawhttp import ScriptedServer, answer
from tests.helpers.server import LiveServer

DB = psycopg.Connection[dict[str, object]]


def client(api: Api, role: str, **options: object) -> QueueClient:
    return QueueClient(api.url, api.keys[role], tenant=api.tenant, **options)  # type: ignore[arg-type]


def test_typed_methods_cover_a_whole_item_life(api: Api, live: LiveServer) -> None:
    admin_key = api.admin.headers["Authorization"].removeprefix("Bearer ")
    with QueueClient(live.url, admin_key) as admin:
        tenant = admin.put_tenant("initech", backlog_cap=10, default_lease_ttl=5)
        assert (tenant.tenant, tenant.backlog_cap) == ("initech", 10)
        key = admin.create_key("worker", tenant="initech")
        assert key.role == "worker"
        assert admin.whoami().role == "admin"
    with QueueClient(live.url, key.secret, tenant="initech") as worker:
        assert worker.whoami().tenant == "initech"
        item = worker.enqueue("q", {"n": 1}, priority=5)
        batch = worker.enqueue_batch("q", [NewItem(payload=i) for i in range(3)])
        assert [i.payload for i in batch] == [0, 1, 2]
        (lease,) = worker.acquire("q", worker="w1", lease_ttl=5)
        assert lease.item_id == item.item_id
        beat = worker.heartbeat(lease.item_id, worker="w1", fence=lease.fence, lease_ttl=5)
        assert beat.lease_expires_at > datetime.now(UTC)
        done = worker.complete(lease.item_id, worker="w1", fence=lease.fence, result={"ok": 1})
        assert (done.state, done.result) == ("completed", {"ok": 1})
        assert [e.kind for e in worker.ledger(item.item_id)] == [
            "enqueued",
            "acquired",
            "heartbeat",
            "completed",
        ]
        status = worker.status()
        assert status.queues[0].ready == 3
        assert worker.concurrency("q").limit == 1
    with QueueClient(live.url, admin_key) as admin:
        admin.revoke_key(key.key_id, tenant="initech")
    with (
        QueueClient(live.url, key.secret, tenant="initech") as revoked,
        pytest.raises(errors.UnauthorizedError) as refused,
    ):
        revoked.get_item(item.item_id)
    assert refused.value.code == "unauthorized"


def test_problems_are_raised_as_typed_exceptions_with_their_code(api: Api) -> None:
    with client(api, "worker") as worker, client(api, "operator") as operator:
        worker.enqueue("q", 1)
        (first,) = worker.acquire("q", worker="w1", lease_ttl=30)
        worker.requeue(first.item_id, worker="w1", fence=first.fence)
        (lease,) = worker.acquire("q", worker="w1", lease_ttl=30)
        with pytest.raises(errors.StaleFenceError) as stale:
            worker.complete(lease.item_id, worker="w1", fence=first.fence)
        assert stale.value.code == "stale-fence"
        assert stale.value.status == 409
        assert isinstance(stale.value, errors.LeaseLostError)
        with pytest.raises(errors.NotLeaseHolderError):
            worker.complete(lease.item_id, worker="w2", fence=lease.fence)
        with pytest.raises(errors.ForbiddenError) as forbidden:
            worker.list_dead_letters()
        assert forbidden.value.code == "forbidden-role"
        with pytest.raises(errors.TenantNotFoundError):
            operator.get_tenant("globex")
        with pytest.raises(errors.ItemNotFoundError) as missing:
            operator.get_item("00000000-0000-0000-0000-000000000000")
        assert "item" in missing.value.title.lower()
        with pytest.raises(errors.InvalidRequestError) as invalid:
            worker.acquire("q", worker="not a name!")
        assert invalid.value.code == "invalid-request"
        expires = datetime.now(UTC) + timedelta(hours=1)
        approval = operator.approve_spend(
            "q", max_concurrency=4, expires_at=expires, reason="launch"
        )
        assert approval.max_concurrency == 4
        assert operator.concurrency("q").limit == 4


class DropFirstResponse(httpx.HTTPTransport):
    """The request reaches the real server, but the first answer is lost on the way back."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[httpx.Request] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.calls.append(request)
        response = super().handle_request(request)
        if len(self.calls) == 1:
            response.read()
            raise httpx.ReadError("connection reset", request=request)
        return response


def test_a_write_whose_answer_was_lost_is_not_retried_and_its_key_finds_the_outcome(
    api: Api, db: DB
) -> None:
    # An enqueue is a confirmed mutation: one attempt (a timeout is not permission to retry
    # a write). Sending the same Idempotency-Key again returns the retained outcome.
    transport = DropFirstResponse()
    http = httpx.Client(base_url=api.url, transport=transport)
    with QueueClient(api.url, api.keys["worker"], tenant="acme", http=http) as worker:
        with pytest.raises(errors.ConnectionFailedError):
            worker.enqueue("q", {"once": True}, idempotency_key="lost-1")
        assert len(transport.calls) == 1
        item = worker.enqueue("q", {"once": True}, idempotency_key="lost-1")
    keys = [r.headers["Idempotency-Key"] for r in transport.calls]
    assert keys == ["lost-1", "lost-1"]
    rows = db.execute("SELECT item_id FROM work_items").fetchall()
    assert [str(r["item_id"]) for r in rows] == [item.item_id]
    http.close()


def test_a_read_is_retried_as_its_class_allows(api: Api) -> None:
    transport = DropFirstResponse()
    http = httpx.Client(base_url=api.url, transport=transport)
    with QueueClient(api.url, api.keys["worker"], tenant="acme", http=http) as worker:
        assert worker.status().queues == []
    assert len(transport.calls) == 2  # read-only-dependency: transport errors are retried
    http.close()


def test_separate_operations_get_separate_keys(api: Api, db: DB) -> None:
    with client(api, "worker") as worker:
        worker.enqueue("q", 1)
        worker.enqueue("q", 1)
    row = db.execute("SELECT count(*) AS n FROM work_items").fetchone()
    assert row is not None
    assert row["n"] == 2


def test_backlog_cap_429_on_a_write_is_raised_at_once_with_its_retry_after(api: Api) -> None:
    api.admin.put("/v1/tenants/acme", json={"backlog_cap": 1})
    with client(api, "worker") as worker:
        worker.enqueue("q", 1)
        started = time.monotonic()
        with pytest.raises(errors.BacklogCapReachedError) as capped:
            worker.enqueue("q", 2)
        assert time.monotonic() - started < 1.0  # one attempt, no retry loop
    assert capped.value.retry_after is not None
    assert capped.value.code == "backlog-cap-reached"


def test_an_unreachable_server_is_a_connection_error_not_a_traceback() -> None:
    with (
        QueueClient("http://127.0.0.1:9", "qsk_x", tenant="t", attempts=2, max_wait=0.01) as qs,
        pytest.raises(errors.ConnectionFailedError) as failed,
    ):
        qs.get_item("x")
    assert failed.value.code == "connection-failed"
    assert "127.0.0.1:9" in str(failed.value)


def test_a_worker_key_alone_finds_its_tenant_and_the_environment_supplies_url_and_key(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    with QueueClient(api.url, api.keys["worker"]) as worker:
        item = worker.enqueue("q", {"n": 1})
        assert worker.tenant == "acme"
    monkeypatch.setenv("QUEUE_SERVER_URL", api.url)
    monkeypatch.setenv("QUEUE_SERVER_KEY", api.keys["operator"])
    with QueueClient() as operator:
        assert operator.get_item(item.item_id).payload == {"n": 1}
        assert (operator.url, operator.tenant) == (api.url, "acme")


def test_an_admin_key_without_a_tenant_is_told_to_name_one(api: Api, live: LiveServer) -> None:
    admin_key = api.admin.headers["Authorization"].removeprefix("Bearer ")
    with QueueClient(live.url, admin_key) as admin:
        with pytest.raises(errors.NoTenantError) as refused:
            admin.get_tenant()
        assert "tenant=" in str(refused.value)
        assert admin.get_tenant("acme").tenant == "acme"


def test_idempotency_keys_never_repeat_in_a_process_or_in_its_forked_child() -> None:
    import multiprocessing

    from queue_server.client.core import new_idempotency_key

    keys = {new_idempotency_key() for _ in range(10_000)}
    assert len(keys) == 10_000
    assert all(re.fullmatch(r"qs-[0-9a-f]{32}", key) for key in keys)
    context = multiprocessing.get_context("fork")
    with context.Pool(2) as pool:
        children = pool.starmap(_keys_of_a_child, [(1000,), (1000,)])
    assert len(keys | set(children[0]) | set(children[1])) == 12_000


def _keys_of_a_child(n: int) -> list[str]:
    from queue_server.client.core import new_idempotency_key

    return [new_idempotency_key() for _ in range(n)]


@pytest.mark.parametrize("sync", [True, False])
def test_the_sdk_s_requests_are_logged_at_debug_and_the_application_s_at_info(
    api: Api, caplog: pytest.LogCaptureFixture, sync: bool
) -> None:
    # An application that logs at INFO sees its own httpx requests, not each of its
    # workers' leases and completions.
    caplog.set_level(logging.INFO, logger="httpx")
    if sync:
        with QueueClient(api.url, api.keys["worker"], tenant=api.tenant) as qs:
            qs.enqueue("q", {"n": 1})
    else:

        async def enqueue() -> None:
            async with AsyncQueueClient(api.url, api.keys["worker"], tenant=api.tenant) as qs:
                await qs.enqueue("q", {"n": 1})

        asyncio.run(enqueue())
    assert [r for r in caplog.records if r.name == "httpx"] == []
    web.get(f"{api.url}/healthz")
    (own,) = [r for r in caplog.records if r.name == "httpx"]
    assert own.levelno == logging.INFO
    assert "/healthz" in own.getMessage()
    caplog.clear()
    caplog.set_level(logging.DEBUG, logger="httpx")
    with QueueClient(api.url, api.keys["worker"], tenant=api.tenant) as qs:
        qs.enqueue("q", {"n": 2})
    assert any(
        r.levelno == logging.DEBUG and "HTTP Request" in r.getMessage() for r in caplog.records
    )


def test_is_transient_names_the_failures_a_caller_may_retry_with_the_same_key() -> None:
    def problem(status: int, code: str, retry_after: float | None = None) -> errors.ProblemError:
        body = {"title": code, "status": status, "code": code}
        return errors.problem_error(status, body, retry_after=retry_after)

    assert is_transient(problem(503, "service-unavailable"))
    assert is_transient(problem(409, "idempotency-key-in-flight"))  # its first try still runs
    assert is_transient(problem(429, "rate-limited", retry_after=1.0))
    # A 429 that names no time to come back is a refusal, like every other answer.
    assert not is_transient(problem(429, "rate-limited"))
    assert not is_transient(problem(409, "fence-ahead"))
    assert not is_transient(problem(422, "invalid-request"))
    assert not is_transient(ValueError("not a request's failure"))


@pytest.mark.parametrize("sync", [True, False])
def test_a_read_is_not_tried_again_past_its_class_deadline(sync: bool) -> None:
    # Three attempts and a 2 s deadline for reads; a server that asks each time to come back
    # in a second. The second attempt ends at about 1 s: waiting a second more reaches the
    # deadline, so no third attempt is made (its attempts alone would allow one).
    doc = copy.deepcopy(OPERATION_RELIABILITY_V2)
    doc["version"] = "test-short-read-deadline"
    cells = doc["classes"]["read-only-dependency"]
    cells["deadline"] = {"seconds": 2}
    cells["attempt-timeout"] = {"seconds": 0.5, "on-timeout": "fail-attempt"}
    cells["backoff-and-jitter"] = {
        "initial-seconds": 0.1,
        "multiplier": 1,
        "max-seconds": 0.1,
        "jitter": "full",
    }
    policy = load_policy(doc, source="test")
    body = b'{"type": "about:blank", "title": "Too many requests", "status": 429}'
    server = ScriptedServer(lambda _: answer(429, body, headers={"Retry-After": "1"}))
    url = server.url

    def read() -> None:
        if sync:
            with QueueClient(url, "qsk_x", tenant="t", policy=policy) as qs:
                qs.get_item("x")
            return

        async def read_once() -> None:
            async with AsyncQueueClient(url, "qsk_x", tenant="t", policy=policy) as qs:
                await qs.get_item("x")

        asyncio.run(read_once())

    try:
        with pytest.raises(errors.ProblemError) as refused:
            read()
    finally:
        server.stop()
    assert refused.value.status == 429
    assert len(server.seen) == 2
