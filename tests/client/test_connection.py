"""The lean path of the SDK's transport (a worker's hot calls: acquire, the batched complete
and heartbeat, an item's outcome): keep-alive connections that are never reused once the
server closed or will close them, answers however they are framed, error answers and
timeouts as httpx's path raises them, and httpx for whatever the lean path does not do.

Against a scripted server on a loopback socket (tests/helpers/rawhttp.py), which can do
what uvicorn does only at its own moments; the worker tests run the same path against the
real API."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from queue_server.client import AsyncQueueClient, QueueClient, errors
from queue_server.client.connection import AsyncLeanPool, LeanPool
from queue_server.client.core import entry_answers
from queue_server.client.worker import Flag
from queue_server.policy import load_policy
from tests.helpers import web
from tests.helpers.api import policy_document
from tests.helpers.rawhttp import Reply, ScriptedServer, Seen, answer, chunked

ITEM_ID = "0b7c7f8e-7a5a-4a41-8f7e-1d2f1f7b2a11"
LEASE: dict[str, Any] = {
    "item_id": ITEM_ID,
    "fence": 3,
    "acquisition_count": 1,
    "lease_expires_at": "2026-12-03T11:50:00.123456Z",
    "lease_deadline_at": None,
    "payload": {"to": "a@example.com", "text": "é"},
    "priority": 0,
    "queue": "q",
    "trace": None,
}
LEASES = json.dumps({"leases": [LEASE]}).encode()


def leases(_: Seen) -> Reply:
    return answer(200, LEASES)


@pytest.fixture
def scripted() -> Iterator[list[ScriptedServer]]:
    made: list[ScriptedServer] = []
    yield made
    for server in made:
        server.stop()


def serve(made: list[ScriptedServer], script: Any) -> ScriptedServer:
    server = ScriptedServer(script)
    made.append(server)
    return server


def client(server: ScriptedServer, **options: Any) -> QueueClient:
    return QueueClient(server.url, "qsk_test", tenant="t", **options)


def acquire(qs: QueueClient) -> list[Any]:
    return qs.acquire("q", worker="w", max_items=1)


def acquire_async(url: str, calls: int, **options: Any) -> list[Any]:
    async def run() -> list[Any]:
        async with AsyncQueueClient(url, "qsk_test", tenant="t", **options) as qs:
            return [await qs.acquire("q", worker="w", max_items=1) for _ in range(calls)]

    return asyncio.run(run())


def test_hot_calls_share_one_kept_alive_connection(scripted: list[ScriptedServer]) -> None:
    def script(seen: Seen) -> Reply:
        if seen.target.endswith("/completions"):
            entry = {"item_id": LEASE["item_id"], "status": 200, "item": None}
            return answer(200, json.dumps({"results": [entry]}).encode())
        return leases(seen)

    server = serve(scripted, script)
    with client(server) as qs:
        got = [acquire(qs) for _ in range(3)]
        answers = qs._run(qs._core._settle_many([(ITEM_ID, 3, {"ok": True}, "key-1")], worker="w"))
    assert [lease.payload for (lease,) in got] == [LEASE["payload"]] * 3
    assert [a.ok for a in answers] == [True]
    assert server.connections == 1
    first, *_, last = server.seen
    assert (first.method, first.target) == ("POST", "/v1/tenants/t/queues/q/leases")
    assert first.headers["authorization"] == "Bearer qsk_test"
    assert first.headers["content-type"] == "application/json"
    assert first.headers["user-agent"].startswith("queue-server-client/")
    assert "idempotency-key" not in first.headers
    assert json.loads(first.body) == {"worker": "w", "max_items": 1, "wait": 0}
    assert last.headers["idempotency-key"].startswith("qs-batch-")
    assert json.loads(last.body)["completions"] == [
        {"item_id": LEASE["item_id"], "fence": 3, "result": {"ok": True}}
    ]


def test_a_connection_the_server_closed_while_idle_is_not_reused(
    scripted: list[ScriptedServer],
) -> None:
    # uvicorn closes a keep-alive connection idle for 5 s without saying so beforehand.
    server = serve(scripted, lambda seen: Reply(answer(200, LEASES).data, close=True))
    with client(server) as qs:
        acquire(qs)
        assert server.closed.wait(5)
        time.sleep(0.05)  # the FIN reaches the client's socket
        assert acquire(qs)[0].fence == 3
    assert server.connections == 2


def test_an_answer_saying_connection_close_is_not_reused(scripted: list[ScriptedServer]) -> None:
    # The server keeps the socket open after it: only the header says not to reuse it.
    server = serve(scripted, lambda seen: answer(200, LEASES, headers={"Connection": "close"}))
    with client(server) as qs:
        acquire(qs)
        acquire(qs)
    assert server.connections == 2


def test_a_chunked_answer_split_across_reads_is_read_whole(
    scripted: list[ScriptedServer],
) -> None:
    server = serve(scripted, lambda seen: chunked(200, LEASES))
    with client(server) as qs:
        first, second = acquire(qs), acquire(qs)
    assert first == second
    assert first[0].payload == LEASE["payload"]
    assert server.connections == 1  # nothing of the first answer was left unread


def test_error_answers_raise_their_problems(scripted: list[ScriptedServer]) -> None:
    def script(seen: Seen) -> Reply:
        if seen.target.endswith("/complete"):
            problem = {"code": "stale-fence", "title": "Stale fence", "status": 409}
            return answer(409, json.dumps(problem).encode())
        problem = {"code": "service-unavailable", "title": "Down", "status": 503}
        return answer(503, json.dumps(problem).encode(), headers={"Retry-After": "2"})

    server = serve(scripted, script)
    with client(server) as qs:
        with pytest.raises(errors.StaleFenceError):
            qs.complete(ITEM_ID, worker="w", fence=3, idempotency_key="k")
        with pytest.raises(errors.ProblemError) as down:
            acquire(qs)
    assert (down.value.status, down.value.retry_after) == (503, 2.0)
    assert server.connections == 1  # an error answer leaves the connection usable


def test_an_answer_that_never_comes_times_out_as_unreachable(
    scripted: list[ScriptedServer],
) -> None:
    server = serve(scripted, lambda seen: None)
    started = time.monotonic()
    with client(server, timeout=0.3) as qs, pytest.raises(errors.ConnectionFailedError):
        acquire(qs)
    assert time.monotonic() - started < 3


def test_a_client_timeout_lowers_a_class_attempt_timeout_and_never_raises_it(
    scripted: list[ScriptedServer],
) -> None:
    server = serve(scripted, lambda seen: None)
    quick_reads = policy_document(
        {
            "read-only-dependency": {
                "attempt-timeout": {"seconds": 0.2, "on-timeout": "fail-attempt"}
            }
        },
        version="test.quick-reads",
    )
    started = time.monotonic()
    options = {"timeout": 5, "attempts": 1, "policy": load_policy(quick_reads)}
    with client(server, **options) as qs, pytest.raises(errors.ConnectionFailedError):
        qs.get_item(ITEM_ID)  # a read: its class's 0.2 s, not the client's 5 s
    assert time.monotonic() - started < 3


def test_a_server_that_is_not_there_is_unreachable() -> None:
    with (
        QueueClient("http://127.0.0.1:9", "k", tenant="t") as qs,
        pytest.raises(errors.ConnectionFailedError),
    ):
        acquire(qs)


def test_a_base_url_with_a_path_keeps_it(scripted: list[ScriptedServer]) -> None:
    server = serve(scripted, leases)
    with QueueClient(server.url + "/queue-api/", "k", tenant="t") as qs:
        acquire(qs)
    assert server.seen[0].target == "/queue-api/v1/tenants/t/queues/q/leases"


def test_a_path_that_needs_escaping_goes_through_httpx(scripted: list[ScriptedServer]) -> None:
    server = serve(scripted, leases)
    with client(server) as qs:
        qs.acquire("a queue", worker="w")
    assert server.seen[0].target == "/v1/tenants/t/queues/a%20queue/leases"


@pytest.mark.parametrize(
    ("url", "env"),
    [
        ("http://127.0.0.1:8080", {"HTTPS_PROXY": "http://proxy:3128"}),
        ("http://127.0.0.1:8080", {"all_proxy": "socks5://proxy:1080"}),
        ("http://user:secret@127.0.0.1:8080", {}),
        ("http://127.0.0.1:8080?x=1", {}),
    ],
)
def test_what_the_lean_path_does_not_do_stays_on_httpx(
    monkeypatch: pytest.MonkeyPatch, url: str, env: dict[str, str]
) -> None:
    for name in ("http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    assert LeanPool.open("http://127.0.0.1:8080", {}) is not None
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert LeanPool.open(url, {}) is None
    assert AsyncLeanPool.open(url, {}) is None


def test_a_callers_own_http_client_carries_every_call(scripted: list[ScriptedServer]) -> None:
    server = serve(scripted, leases)
    http = web.client(base_url=server.url, headers={"X-Mine": "1"})
    with QueueClient(server.url, "k", tenant="t", http=http) as qs:
        acquire(qs)
    http.close()
    assert server.seen[0].headers["x-mine"] == "1"


# -- asyncio ------------------------------------------------------------------------


def test_async_hot_calls_share_one_kept_alive_connection(scripted: list[ScriptedServer]) -> None:
    server = serve(scripted, leases)
    got = acquire_async(server.url, 3)
    assert [lease.fence for (lease,) in got] == [3, 3, 3]
    assert server.connections == 1


def test_async_connection_the_server_closed_while_idle_is_not_reused(
    scripted: list[ScriptedServer],
) -> None:
    server = serve(scripted, lambda seen: Reply(answer(200, LEASES).data, close=True))

    async def run() -> None:
        async with AsyncQueueClient(server.url, "k", tenant="t") as qs:
            await qs.acquire("q", worker="w")
            assert await asyncio.to_thread(server.closed.wait, 5)
            await asyncio.sleep(0.05)  # the FIN reaches the client's transport
            assert (await qs.acquire("q", worker="w"))[0].fence == 3

    asyncio.run(run())
    assert server.connections == 2


def test_async_chunked_answer_and_connection_close_are_honoured(
    scripted: list[ScriptedServer],
) -> None:
    closing = serve(scripted, lambda seen: answer(200, LEASES, headers={"Connection": "close"}))
    acquire_async(closing.url, 2)
    assert closing.connections == 2
    split = serve(scripted, lambda seen: chunked(200, LEASES))
    assert acquire_async(split.url, 2)[1][0].payload == LEASE["payload"]
    assert split.connections == 1


def test_async_answer_that_never_comes_times_out_as_unreachable(
    scripted: list[ScriptedServer],
) -> None:
    server = serve(scripted, lambda seen: None)
    started = time.monotonic()
    with pytest.raises(errors.ConnectionFailedError):
        acquire_async(server.url, 1, timeout=0.3)
    assert time.monotonic() - started < 3


# -- what the worker reads of a batch, and its jobs' flags ------------------------------


def test_batch_answers_are_read_as_status_and_problem_and_a_malformed_one_is_refused() -> None:
    problem = {"code": "stale-fence", "title": "Stale fence", "status": 409}
    body = {
        "results": [
            {"item_id": "a", "status": 200, "item": {"anything": ["the worker never reads"]}},
            {"item_id": "b", "status": 409, "problem": problem},
        ]
    }
    ok, refused = entry_answers(json.dumps(body).encode())
    assert (ok.ok, refused.ok) == (True, False)
    assert isinstance(refused.error(), errors.StaleFenceError)
    bad: dict[str, Any]
    for bad in (
        {"results": [{"item_id": "a", "status": "200"}]},
        {"results": [{"item_id": 1, "status": 200}]},
        {"results": [{"item_id": "a", "status": 409, "problem": "no"}]},
        {"entries": []},
    ):
        with pytest.raises(ValueError, match="batch"):
            entry_answers(json.dumps(bad).encode())


def test_a_job_flag_is_an_event_that_makes_its_condition_only_for_a_waiter() -> None:
    flag = Flag()
    flag.set()
    assert flag.is_set()
    assert flag.wait(0)
    assert flag._waitable is None
    flag.clear()
    assert not flag.wait(0.01)
    assert flag._waitable is not None
    woken = Flag()
    waiting = asyncio.run(_wait_in_thread_then_set(woken))
    assert waiting is True


async def _wait_in_thread_then_set(flag: Flag) -> bool:
    waiter = asyncio.create_task(asyncio.to_thread(flag.wait, 5))
    await asyncio.sleep(0.05)
    flag.set()
    return await waiter


def test_an_admitted_shape_is_remembered_but_a_refusal_is_raised_every_time() -> None:
    from queue_server.client.core import ClientCore
    from queue_server.policy import AdmissionRefused

    core = ClientCore(
        "http://127.0.0.1:9", "k", tenant="t", timeout=None, attempts=None, max_wait=None,
        policy=None,
    )  # fmt: skip
    core._admit(ITEM_ID, 1, "key-1")
    core._admit("another", 1, "key-2")  # the same shape: not asked again
    assert len(core._admitted) == 1
    for item_id, fence, key in (
        (ITEM_ID, 0, "key-1"),
        (ITEM_ID, True, "key-1"),  # a bool is no fence, though True == 1
        (ITEM_ID, 1, " "),
        (" ", 1, "key-1"),
    ):
        for _ in range(2):
            with pytest.raises(AdmissionRefused):
                core._admit(item_id, fence, key)


def test_a_forked_child_opens_its_own_connection(scripted: list[ScriptedServer]) -> None:
    import os

    server = serve(scripted, leases)
    with client(server) as qs:
        acquire(qs)
        pid = os.fork()
        if pid == 0:  # the child: one call on a connection of its own, then out
            code = 0
            try:
                acquire(qs)
            except BaseException:
                code = 1
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        acquire(qs)  # the parent's kept connection is still its own
    assert os.waitstatus_to_exitcode(status) == 0
    assert server.connections == 2
    assert [s.connection for s in server.seen] == [0, 1, 0]


OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"


# How an answer can be framed: (the server's bytes, the body read, the connection kept).
FRAMINGS = [
    # No length and no body: at once, and the connection kept (not read to its close).
    pytest.param(Reply(b"HTTP/1.1 204 No Content\r\n\r\n"), b"", True, id="204"),
    pytest.param(Reply(b"HTTP/1.1 304 Not Modified\r\nETag: x\r\n\r\n"), b"", True, id="304"),
    # HTTP/1.0 closes after each answer unless it says keep-alive.
    pytest.param(
        Reply(b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}"), b"{}", False, id="http-1.0"
    ),
    pytest.param(
        Reply(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n{}"),
        b"{}",
        True,
        id="http-1.0-keep-alive",
    ),
    # A chunk extension and a trailer are read past, to the answer's end.
    pytest.param(
        Reply(OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n2;name=x\r\n{}\r\n0\r\nX-T: y\r\n\r\n"),
        b"{}",
        True,
        id="chunk-extension-trailer",
    ),
    # No length: the body runs to the close.
    pytest.param(Reply(OK_HEAD + b"\r\n{}", close=True), b"{}", False, id="eof"),
    # An interim answer first: the answer is the one after it.
    pytest.param(
        Reply(b"HTTP/1.1 100 Continue\r\n\r\n" + OK_HEAD + b"Content-Length: 2\r\n\r\n{}"),
        b"{}",
        True,
        id="interim",
    ),
]
# Bytes after the answer that no request asked for: the blocking pool trusts the connection
# no more (the asyncio one leaves them to its next read, which refuses them).
EXTRA = pytest.param(
    Reply(OK_HEAD + b"Content-Length: 2\r\n\r\n{}HTTP/1.1 200 OK\r\n"), b"{}", False, id="extra"
)


def fetch(server: ScriptedServer, method: str, times: int, *, asyncio_pool: bool) -> list[bytes]:
    """`times` requests through one lean pool (the blocking or the asyncio one); the bodies."""
    if asyncio_pool:

        async def run() -> list[bytes]:
            pool = AsyncLeanPool.open(server.url, {"User-Agent": "test"})
            assert pool is not None
            try:
                answers = [await pool.request(method, "/v1/x", None, None, 5) for _ in range(times)]
            finally:
                pool.close()
            return [a.content for a in answers if a is not None]

        return asyncio.run(run())
    pool = LeanPool.open(server.url, {"User-Agent": "test"})
    assert pool is not None
    try:
        answers = [pool.request(method, "/v1/x", None, None, 5) for _ in range(times)]
    finally:
        pool.close()
    return [a.content for a in answers if a is not None]


@pytest.mark.parametrize(
    ("reply", "body", "reused", "asyncio_pool"),
    [
        *[pytest.param(*p.values, False, id=f"blocking-{p.id}") for p in [*FRAMINGS, EXTRA]],
        *[pytest.param(*p.values, True, id=f"asyncio-{p.id}") for p in FRAMINGS],
    ],
)
def test_answers_framed_every_way_http_allows_are_read_whole_and_kept_only_when_safe(
    scripted: list[ScriptedServer], reply: Reply, body: bytes, reused: bool, asyncio_pool: bool
) -> None:
    server = serve(scripted, lambda seen: reply)
    assert fetch(server, "GET", 2, asyncio_pool=asyncio_pool) == [body, body]
    assert server.connections == (1 if reused else 2)


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b"HTTP/2 200 OK\r\nContent-Length: 2\r\n\r\n{}", "not an HTTP/1.1 answer"),
        (b"ICY 200 OK\r\n\r\n", "not an HTTP/1.1 answer"),
        # A head past 64 KiB whose end has not come: not waited for.
        (OK_HEAD + b"X-Big: " + b"a" * 100_000, "head is too large"),
    ],
    ids=["http-2", "not-http", "head-too-large"],
)
@pytest.mark.parametrize("asyncio_pool", [False, True], ids=["blocking", "asyncio"])
def test_an_answer_that_is_not_http_1_is_refused_not_read_on(
    scripted: list[ScriptedServer], data: bytes, said: str, asyncio_pool: bool
) -> None:
    server = serve(scripted, lambda seen: Reply(data))
    with pytest.raises(httpx.RemoteProtocolError, match=said):
        fetch(server, "GET", 1, asyncio_pool=asyncio_pool)


@pytest.mark.parametrize("asyncio_pool", [False, True], ids=["blocking", "asyncio"])
def test_the_answer_to_a_head_request_has_no_body_whatever_its_length_says(
    scripted: list[ScriptedServer], asyncio_pool: bool
) -> None:
    server = serve(scripted, lambda seen: Reply(OK_HEAD + b"Content-Length: 120\r\n\r\n"))
    assert fetch(server, "HEAD", 2, asyncio_pool=asyncio_pool) == [b"", b""]
    assert server.connections == 1


def test_a_post_without_a_body_says_its_length_is_zero(scripted: list[ScriptedServer]) -> None:
    # Without it, some proxies answer 411 Length Required.
    server = serve(scripted, lambda seen: answer(200, b"{}"))
    pool = LeanPool.open(server.url, {"User-Agent": "test"})
    assert pool is not None
    try:
        pool.request("POST", "/v1/x", None, None, 5)
        pool.request("GET", "/v1/x", None, None, 5)
    finally:
        pool.close()
    posted, got = server.seen
    assert posted.headers["content-length"] == "0"
    assert "content-length" not in got.headers
