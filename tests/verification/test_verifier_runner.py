"""The artifact verifier runner against the real server: resumable, one at a time, transient
retries after the class's backoff, stopped at a checkpoint past its attempt timeout."""

from __future__ import annotations

import errno
import threading
from collections.abc import Iterator

import psycopg
import pytest

from queue_server.client import QueueClient
from queue_server.policy import AdmissionRefused, RefusalReason, load_policy
from tests.demonstrators.errors import PermitUnavailableError
from tests.demonstrators.verifier import VerifierRunner
from tests.helpers.api import Api, policy_document

pytestmark = pytest.mark.live  # the SDK opens its own connections

Db = psycopg.Connection[dict[str, object]]
ITEMS = ["a.txt", "lib/b.so", "c.json", "d.bin"]


@pytest.fixture
def client(api: Api) -> Iterator[QueueClient]:
    with QueueClient(api.url, api.keys["worker"], tenant="acme") as qs:
        yield qs


def _runner(client: QueueClient, verify: object, **kw: object) -> VerifierRunner:
    return VerifierRunner(
        client,
        artifact_version="app-1.0",
        verifier_version="v1",
        items=ITEMS,
        verify=verify,  # type: ignore[arg-type]
        sleep=lambda _: None,
        **kw,  # type: ignore[arg-type]
    )


def test_restarted_verifier_resumes_from_its_checkpoints(client: QueueClient, db: Db) -> None:
    seen: list[str] = []
    first: VerifierRunner

    def stops_after_two(item: str) -> str:
        seen.append(item)
        if len(seen) == 2:
            first.stop.set()  # honoured at the next checkpoint boundary, not mid-item
        return f"ok:{item}"

    first = _runner(client, stops_after_two)
    stopped = first.run()
    assert stopped.state == "stopped-at-checkpoint"
    assert stopped.verified == ("a.txt", "lib/b.so")
    assert stopped.remaining == ("c.json", "d.bin")

    resumed: list[str] = []

    def records(item: str) -> str:
        resumed.append(item)
        return f"ok:{item}"

    second = _runner(client, records)
    report = second.run()
    assert report.state == "complete"
    assert report.run_id == stopped.run_id
    assert report.resumed_from == 2
    assert resumed == ["c.json", "d.bin"]
    assert report.results == {item: f"ok:{item}" for item in ITEMS}
    row = db.execute("SELECT state FROM verification_runs").fetchone()
    assert row == {"state": "complete"}


def test_timeout_is_honoured_only_at_a_checkpoint_boundary(client: QueueClient, db: Db) -> None:
    def slow(item: str) -> str:
        threading.Event().wait(0.3)  # longer than the timeout: the item still finishes
        return "ok"

    report = _runner(client, slow, timeout=0.1).run()
    assert report.state == "stopped-at-checkpoint"
    assert report.verified == ("a.txt",)
    checkpoints = db.execute("SELECT item FROM verification_checkpoints").fetchall()
    assert checkpoints == [{"item": "a.txt"}]


def test_a_runner_without_a_timeout_of_its_own_stops_at_the_class_attempt_timeout(
    client: QueueClient, db: Db
) -> None:
    quick = load_policy(
        policy_document(
            {
                "artifact-verification": {
                    "attempt-timeout": {"seconds": 0.2, "on-timeout": "stop-at-checkpoint"}
                }
            },
            version="test.quick-verification",
        )
    )

    def slow(item: str) -> str:
        threading.Event().wait(0.3)  # longer than the class's attempt timeout
        return "ok"

    report = _runner(client, slow, policy=quick).run()
    assert report.state == "stopped-at-checkpoint"
    assert report.verified == ("a.txt",)
    checkpoints = db.execute("SELECT item FROM verification_checkpoints").fetchall()
    assert checkpoints == [{"item": "a.txt"}]
    # A runner may ask for less than the class's 300 s, never for more.
    with pytest.raises(AdmissionRefused) as refused:
        _runner(client, slow, timeout=301)
    assert refused.value.reason is RefusalReason.ATTEMPT_TIMEOUT_EXCEEDS_POLICY


def test_runner_waits_the_class_backoff_between_transient_retries(client: QueueClient) -> None:
    waits: list[float] = []
    attempts: list[str] = []

    def flaky(item: str) -> str:
        attempts.append(item)
        if item == "a.txt" and len(attempts) < 3:
            raise OSError(errno.EAGAIN, "resource temporarily unavailable")
        return "ok"

    runner = VerifierRunner(
        client,
        artifact_version="app-1.0",
        verifier_version="v1",
        items=ITEMS,
        verify=flaky,
        sleep=waits.append,
    )
    assert runner.run().state == "complete"
    assert attempts[:3] == ["a.txt"] * 3
    # The class's backoff, unjittered: 1 s after the first failure, doubling, capped at 10 s.
    assert waits == [1.0, 2.0]


def test_runner_retries_transient_io_but_not_other_failures(client: QueueClient) -> None:
    attempts: dict[str, int] = {}

    def flaky(item: str) -> str:
        attempts[item] = attempts.get(item, 0) + 1
        if item == "a.txt" and attempts[item] < 3:
            raise OSError(errno.EAGAIN, "resource temporarily unavailable")
        if item == "lib/b.so":
            raise ValueError("corrupt artifact")
        return "ok"

    with pytest.raises(ValueError, match="corrupt"):
        _runner(client, flaky).run()
    assert attempts == {"a.txt": 3, "lib/b.so": 1}
    run = client.start_verification_run("app-1.0", "v1", ITEMS)
    assert [c.item for c in run.checkpoints] == ["a.txt"]
    assert run.state == "running"


def test_a_second_concurrent_runner_in_the_process_is_rejected(client: QueueClient) -> None:
    inside = threading.Event()
    release = threading.Event()

    def held(item: str) -> str:
        inside.set()
        release.wait(5)
        return "ok"

    first = _runner(client, held)
    thread = threading.Thread(target=first.run)
    thread.start()
    try:
        assert inside.wait(5)
        with pytest.raises(PermitUnavailableError):
            # Its items would not wait: a runner let in anyway ends at once, not in 5 s each.
            _runner(client, lambda item: "ok").run()
    finally:
        release.set()
        thread.join(10)
