"""The read-only dependency client through a real broker to a real local HTTP dependency."""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from queue_server.policy import AdmissionRefused, admit_operation, load_policy
from queue_server.policy.v2 import OPERATION_RELIABILITY_V2
from queue_server.transport import Outcome, WallDeadlineExceededError
from tests.demonstrators.breaker import CircuitState
from tests.demonstrators.dependency import ReadOnlyDependencyClient
from tests.demonstrators.errors import CircuitOpenError, PermitUnavailableError
from tests.demonstrators.permits import PermitGate


class Dependency(ThreadingHTTPServer):
    """/ok 200; /flaky 503 for the first `fail_first` requests; /down 503; /slow stalls 1 s
    the first time; /stall stalls 1.5 s every time; /pause stalls 0.3 s."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.hits: dict[str, int] = {}
        self.fail_first = 2
        self.lock = threading.Lock()

    def handle_error(self, request: object, client_address: object) -> None:
        """A reader that timed out closed the socket: expected here."""

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{path}"


class _Handler(BaseHTTPRequestHandler):
    server: Dependency

    def do_GET(self) -> None:
        with self.server.lock:
            n = self.server.hits[self.path] = self.server.hits.get(self.path, 0) + 1
        if self.path == "/slow" and n == 1:
            time.sleep(1.0)
        if self.path == "/stall":
            time.sleep(1.5)
        if self.path == "/pause":
            time.sleep(0.3)
        status = 200
        if self.path == "/down" or (self.path == "/flaky" and n <= self.server.fail_first):
            status = 503
        body = b'{"ok": true}'
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture
def dependency() -> Iterator[Dependency]:
    server = Dependency()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


async def _no_sleep(_: float) -> None:
    return


def _client(**kw: object) -> ReadOnlyDependencyClient:
    return ReadOnlyDependencyClient(allow=["127.0.0.1"], sleep=_no_sleep, **kw)  # type: ignore[arg-type]


def _outcomes(reads: ReadOnlyDependencyClient) -> list[Outcome]:
    assert reads.last_run is not None
    return [r.outcome for r in reads.last_run.snapshot().receipts]


def test_read_only_dependency_client_retries_unavailable_then_succeeds(
    dependency: Dependency,
) -> None:
    result = asyncio.run(_client().get(dependency.url("/flaky")))
    assert result.status == 200
    assert dependency.hits["/flaky"] == 3


def test_read_only_dependency_client_stops_after_three_attempts(dependency: Dependency) -> None:
    reads = _client()
    with pytest.raises(Exception, match="503"):
        asyncio.run(reads.get(dependency.url("/down")))
    assert dependency.hits["/down"] == 3


def test_read_only_dependency_client_times_out_an_attempt_and_retries(
    dependency: Dependency,
) -> None:
    # The attempt timeout comes from the loaded policy: here a tighter document's 0.2 s.
    doc = copy.deepcopy(OPERATION_RELIABILITY_V2)
    doc["version"] = "fast-reads.v1"
    doc["classes"]["read-only-dependency"]["attempt-timeout"]["seconds"] = 0.2
    started = time.monotonic()
    reads = _client(policy=load_policy(doc))
    result = asyncio.run(reads.get(dependency.url("/slow")))
    assert result.status == 200
    assert dependency.hits["/slow"] == 2
    assert time.monotonic() - started < 1.0
    # The request timeout is its own typed outcome, and it is retried.
    assert _outcomes(reads) == [Outcome.TIMEOUT, Outcome.SUCCEEDED]


def test_read_only_dependency_client_waits_at_most_the_class_backoff_between_attempts(
    dependency: Dependency,
) -> None:
    waits: list[float] = []

    async def record(seconds: float) -> None:
        waits.append(seconds)

    for _ in range(5):
        reads = ReadOnlyDependencyClient(allow=["127.0.0.1"], sleep=record)
        with pytest.raises(Exception, match="503"):
            asyncio.run(reads.get(dependency.url("/down")))
    # Full jitter under the class's exponential (0.1 s doubling, capped at 1 s): a random
    # wait of at most 0.1 s after the first attempt and at most 0.2 s after the second.
    assert len(waits) == 10
    bounds = [0.1, 0.2] * 5
    assert all(0 <= wait <= bound for wait, bound in zip(waits, bounds, strict=True)), waits


def test_read_only_dependency_client_wall_deadline_is_its_own_outcome_never_retried(
    dependency: Dependency,
) -> None:
    reads = _client()
    started = time.monotonic()
    with pytest.raises(WallDeadlineExceededError) as info:
        asyncio.run(reads.get(dependency.url("/stall"), attempt_timeout=0.3, deadline=0.5))
    # The first attempt hit its own timeout (retryable); the second ran into the read's
    # deadline, the broker run's wall deadline: a different outcome, and the end.
    assert _outcomes(reads) == [Outcome.TIMEOUT, Outcome.WALL_DEADLINE]
    assert [r.outcome for r in info.value.receipts] == [Outcome.TIMEOUT, Outcome.WALL_DEADLINE]
    assert dependency.hits["/stall"] == 2
    assert time.monotonic() - started < 1.0


def test_read_only_dependency_client_cancelled_by_its_caller_leaves_a_cancelled_receipt(
    dependency: Dependency,
) -> None:
    reads = _client()

    async def scenario() -> None:
        read = asyncio.create_task(reads.get(dependency.url("/pause")))
        while "/pause" not in dependency.hits:
            await asyncio.sleep(0.01)
        read.cancel()
        with pytest.raises(asyncio.CancelledError):
            await read
        # Past the moment the dependency answers: the read was discarded, not run on.
        await asyncio.sleep(0.7)

    asyncio.run(scenario())
    assert _outcomes(reads) == [Outcome.CANCELLED]
    assert dependency.hits["/pause"] == 1


def test_read_only_dependency_client_every_run_carries_the_class_deadline(
    dependency: Dependency,
) -> None:
    reads = _client()
    asyncio.run(reads.get(dependency.url("/ok")))
    assert reads.last_run is not None
    left = reads.last_run.remaining()
    # The class deadline (10 s) is the run's wall deadline, not an unbounded run.
    assert left is not None
    assert 9.0 < left <= 10.0


def test_read_only_dependency_client_circuit_opens_after_repeated_failures(
    dependency: Dependency,
) -> None:
    reads = _client()

    async def scenario() -> None:
        with pytest.raises(Exception, match="503"):
            await reads.get(dependency.url("/down"))
        # Failures four and five open the circuit; the sixth attempt is never sent.
        with pytest.raises(CircuitOpenError):
            await reads.get(dependency.url("/down"))
        assert dependency.hits["/down"] == 5
        assert reads.breaker.state is CircuitState.OPEN
        with pytest.raises(CircuitOpenError):
            await reads.get(dependency.url("/ok"))

    asyncio.run(scenario())
    assert "/ok" not in dependency.hits


def test_read_only_dependency_client_capacity_gate_rejects_beyond_its_limit(
    dependency: Dependency,
) -> None:
    gate = PermitGate(1, name="read-only-dependency")
    reads = _client(gate=gate)

    async def scenario() -> None:
        first = asyncio.create_task(reads.get(dependency.url("/slow")))
        while gate.in_use == 0:
            await asyncio.sleep(0.01)
        with pytest.raises(PermitUnavailableError):
            await reads.get(dependency.url("/ok"))
        await first

    asyncio.run(scenario())
    assert PermitGate.for_class("read-only-dependency").capacity == 16


def test_read_only_dependency_client_refuses_an_effecting_call_and_a_long_deadline() -> None:
    with pytest.raises(AdmissionRefused):
        admit_operation("read-only-dependency", effecting=True)
    with pytest.raises(AdmissionRefused):
        asyncio.run(_client().get("http://127.0.0.1:9/", deadline=60))
