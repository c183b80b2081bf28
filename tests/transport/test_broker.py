"""The broker against real local receivers: outcomes, charging, budgets and receipts."""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

import pytest

from queue_server.transport import (
    Accountant,
    Budget,
    BudgetExhaustedError,
    DispatchRequest,
    DispatchResult,
    Outcome,
    PolicyRefusedError,
    RequestTimeoutError,
    RunFailedError,
    TransportBroker,
    TransportFailureError,
    WallDeadlineExceededError,
)
from tests.helpers.receiver import Receiver, closed_port

T = TypeVar("T")
LOCAL = ["127.0.0.1"]


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Drive one coroutine on a fresh event loop."""
    return asyncio.run(coro)


def broker(**kwargs: Any) -> TransportBroker:
    """A broker allowed to reach the local receivers."""
    kwargs.setdefault("allow", LOCAL)
    kwargs.setdefault("request_timeout", 2.0)
    return TransportBroker(**kwargs)


def get(url: str, **kwargs: Any) -> DispatchRequest:
    """A GET dispatch request."""
    return DispatchRequest("GET", url, **kwargs)


def test_200_succeeds_and_receipt_holds_host_and_hash_but_no_path_or_query(
    receiver: Receiver,
) -> None:
    b = broker()
    url = receiver.url("/ok?token=s3cret-value")
    result = run(b.dispatch(DispatchRequest("POST", url, content=b"{}", label="webhook")))
    assert result.ok
    assert (result.status, result.body) == (200, b"ok")
    r = result.receipt
    assert (r.seq, r.host, r.port, r.address, r.outcome) == (
        1,
        "127.0.0.1",
        receiver.port,
        "127.0.0.1",
        Outcome.SUCCEEDED,
    )
    assert r.url_sha256 == hashlib.sha256(url.encode()).hexdigest()
    assert (r.request_bytes, r.response_bytes, r.label) == (2, 2, "webhook")
    text = json.dumps(b.snapshot().to_dict())
    assert "/ok" not in text
    assert "token" not in text
    assert "s3cret" not in text
    assert receiver.requests[0].body == b"{}"


@pytest.mark.parametrize(
    ("path", "status", "outcome"),
    [
        ("/fail", 500, Outcome.HTTP_ERROR),
        ("/gone", 410, Outcome.HTTP_ERROR),
        ("/redirect", 302, Outcome.REDIRECT_REFUSED),
        ("/status?code=300", 300, Outcome.REDIRECT_REFUSED),  # the first 3xx is not a 2xx
        ("/status?code=400", 400, Outcome.HTTP_ERROR),
    ],
)
def test_non_2xx_is_a_failed_outcome_returned_once_and_not_followed(
    receiver: Receiver, path: str, status: int, outcome: Outcome
) -> None:
    b = broker()
    result = run(b.dispatch(get(receiver.url(path))))
    assert not result.ok
    assert (result.status, result.outcome, result.receipt.outcome) == (status, outcome, outcome)
    # No redirect following and no implicit retry: exactly one connection and one request.
    assert receiver.connections == 1
    assert [s.target for s in receiver.requests] == [path]
    assert b.usage().requests == 1


def test_redirect_location_is_exposed_but_not_followed(receiver: Receiver) -> None:
    result = run(broker().dispatch(get(receiver.url("/redirect"))))
    assert result.header("location") == receiver.url("/ok")
    assert all(s.target != "/ok" for s in receiver.requests)


def test_a_retry_is_a_new_lease_with_its_own_receipt(receiver: Receiver) -> None:
    b = broker()
    for _ in range(2):
        run(b.dispatch(get(receiver.url("/fail"))))
    snap = b.snapshot()
    assert [r.seq for r in snap.receipts] == [1, 2]
    assert snap.usage.requests == 2
    assert receiver.connections == 2


def test_slow_receiver_raises_request_timeout_with_charged_receipt(receiver: Receiver) -> None:
    b = broker()
    with pytest.raises(RequestTimeoutError) as info:
        run(b.dispatch(get(receiver.url("/slow"), timeout=0.2)))
    err = info.value
    assert err.receipt is not None
    assert err.receipt.outcome is Outcome.TIMEOUT
    assert err.receipt.status is None
    assert err.receipts == (err.receipt,)
    assert b.usage().requests == 1


def test_wall_deadline_is_distinct_from_request_timeout_and_then_refuses_before_lease(
    receiver: Receiver,
) -> None:
    b = broker(wall_deadline=0.3, request_timeout=5.0)
    with pytest.raises(WallDeadlineExceededError) as info:
        run(b.dispatch(get(receiver.url("/slow"))))
    assert not isinstance(info.value, RequestTimeoutError)
    assert info.value.receipt is not None
    assert info.value.receipt.outcome is Outcome.WALL_DEADLINE
    with pytest.raises(WallDeadlineExceededError) as later:
        run(b.dispatch(get(receiver.url("/ok"))))
    # Past the deadline: refused before the lease, so no receipt, no charge, no socket.
    assert later.value.receipt is None
    assert len(later.value.receipts) == 1
    assert b.usage().requests == 1
    assert receiver.connections == 1


def test_a_wall_deadline_nearer_than_the_request_timeout_binds_the_dispatch(
    receiver: Receiver,
) -> None:
    """1.5 s of the run left and a request timeout of 2 s: the stalled dispatch ends at the
    wall deadline, as a wall-deadline refusal, not at its own timeout."""
    b = broker(wall_deadline=1.5, request_timeout=2.0)
    with pytest.raises(WallDeadlineExceededError) as info:
        run(b.dispatch(get(receiver.url("/slow"))))
    assert not isinstance(info.value, RequestTimeoutError)


def test_reset_connection_is_a_charged_transport_failure(receiver: Receiver) -> None:
    b = broker()
    with pytest.raises(TransportFailureError) as info:
        run(b.dispatch(get(receiver.url("/reset"))))
    assert info.value.receipt is not None
    assert info.value.receipt.outcome is Outcome.TRANSPORT_ERROR
    assert info.value.receipt.error is not None
    assert receiver.connections == 1
    assert b.usage().requests == 1


def test_refused_socket_dispatch_is_charged_and_leaves_a_receipt() -> None:
    b = broker()
    with pytest.raises(TransportFailureError) as info:
        run(b.dispatch(get(f"http://127.0.0.1:{closed_port()}/ok")))
    assert info.value.receipt is not None
    assert info.value.receipt.outcome is Outcome.TRANSPORT_ERROR
    assert info.value.receipt.error == "ConnectError"
    assert b.usage().requests == 1
    assert len(b.snapshot().receipts) == 1


def test_request_budget_exhaustion_refuses_before_the_socket(receiver: Receiver) -> None:
    b = broker(budget=Budget(max_requests=2))
    run(b.dispatch(get(receiver.url("/ok"))))
    with pytest.raises(TransportFailureError):
        run(b.dispatch(get(f"http://127.0.0.1:{closed_port()}/ok")))
    with pytest.raises(BudgetExhaustedError) as info:
        run(b.dispatch(get(receiver.url("/ok"))))
    err = info.value
    assert err.resource == "requests"
    assert err.receipt is None
    assert [r.outcome for r in err.receipts] == [Outcome.SUCCEEDED, Outcome.TRANSPORT_ERROR]
    assert receiver.connections == 1
    assert b.usage().requests == 2


def test_active_budget_is_separate_and_also_consumes_the_total(receiver: Receiver) -> None:
    b = broker(budget=Budget(max_requests=3, max_active_requests=1))
    run(b.dispatch(get(receiver.url("/ok"), active=True)))
    with pytest.raises(BudgetExhaustedError) as info:
        run(b.dispatch(get(receiver.url("/ok"), active=True)))
    assert info.value.resource == "active_requests"
    run(b.dispatch(get(receiver.url("/ok"))))
    usage = b.usage()
    assert (usage.requests, usage.active_requests) == (2, 1)
    assert receiver.connections == 2
    assert [r.active for r in b.snapshot().receipts] == [True, False]


@pytest.mark.parametrize(
    "request_",
    [
        DispatchRequest("GET", "ftp://127.0.0.1/x"),
        DispatchRequest("GET", "http://user:pw@127.0.0.1/x"),
        DispatchRequest("GET", "http://127.0.0.1/x", headers={"Host": "evil.example"}),
        DispatchRequest("GET", "http://127.0.0.1/x", headers={"Transfer-Encoding": "chunked"}),
        DispatchRequest("GET", "http://127.0.0.1/x", headers={"X-A": "1\r\nX-B: 2"}),
        DispatchRequest("get me", "http://127.0.0.1/x"),
        DispatchRequest("GET", "not a url"),
    ],
)
def test_policy_refusal_before_dispatch_costs_nothing_and_leaves_no_receipt(
    request_: DispatchRequest,
) -> None:
    b = broker()
    with pytest.raises(PolicyRefusedError) as info:
        run(b.dispatch(request_))
    assert info.value.receipt is None
    assert b.usage().requests == 0
    assert b.snapshot().receipts == ()


def test_huge_chunked_body_is_charged_in_full_but_only_a_prefix_is_kept(
    receiver: Receiver,
) -> None:
    b = broker(retain_bytes=100, max_body_bytes=1024 * 1024)
    result = run(b.dispatch(get(receiver.url("/huge?n=300000"))))
    assert result.ok
    assert result.body == b"h" * 100
    assert not result.body_truncated
    assert result.receipt.response_bytes == 300_000
    assert b.usage().response_bytes == 300_000


def test_collection_stops_at_max_body_bytes_after_charging_the_crossing_chunk(
    receiver: Receiver,
) -> None:
    b = broker(max_body_bytes=50_000)
    result = run(b.dispatch(get(receiver.url("/huge?n=2000000"))))
    assert result.body_truncated
    charged = result.receipt.response_bytes
    assert 50_000 <= charged < 2_000_000
    assert b.usage().response_bytes == charged


# A body far over the budget, and one a single byte over it.
@pytest.mark.parametrize("size", [100_000, 10_001])
def test_response_byte_budget_exhaustion_mid_body_keeps_bytes_and_refuses_next(
    receiver: Receiver, size: int
) -> None:
    b = broker(budget=Budget(max_response_bytes=10_000))
    with pytest.raises(BudgetExhaustedError) as info:
        run(b.dispatch(get(receiver.url(f"/huge?n={size}"))))
    err = info.value
    assert err.resource == "response_bytes"
    assert err.receipt is not None
    assert err.receipt.outcome is Outcome.RESPONSE_BUDGET_EXHAUSTED
    assert err.receipt.status == 200
    assert err.receipt.response_bytes > 10_000
    assert b.usage().response_bytes == err.receipt.response_bytes
    with pytest.raises(BudgetExhaustedError) as next_info:
        run(b.dispatch(get(receiver.url("/ok"))))
    assert next_info.value.receipt is None
    assert receiver.connections == 1


def test_a_body_of_exactly_the_byte_budget_is_read_and_the_next_dispatch_refused(
    receiver: Receiver,
) -> None:
    b = broker(budget=Budget(max_response_bytes=10_000))
    result = run(b.dispatch(get(receiver.url("/huge?n=10000"))))
    assert result.ok
    assert (result.receipt.response_bytes, result.body_truncated) == (10_000, False)
    assert b.usage().response_bytes == 10_000
    # Spent to the byte: any response at all would overrun, so the next is refused unsent.
    with pytest.raises(BudgetExhaustedError) as info:
        run(b.dispatch(get(receiver.url("/ok"))))
    assert (info.value.resource, info.value.receipt) == ("response_bytes", None)
    assert receiver.connections == 1


def test_mid_body_timeout_keeps_the_partial_bytes_charged(receiver: Receiver) -> None:
    b = broker()
    with pytest.raises(RequestTimeoutError) as info:
        run(b.dispatch(get(receiver.url("/drip?n=1000"), timeout=0.3)))
    receipt = info.value.receipt
    assert receipt is not None
    assert (receipt.status, receipt.response_bytes, receipt.outcome) == (
        200,
        1000,
        Outcome.TIMEOUT,
    )
    assert receipt.headers_ms is not None
    assert b.usage().response_bytes == 1000


def test_cancelled_dispatch_is_recorded_as_cancellation_with_partial_bytes(
    receiver: Receiver,
) -> None:
    b = broker()

    async def cancel_mid_body() -> None:
        task = asyncio.create_task(b.dispatch(get(receiver.url("/drip?n=500"))))
        while b.usage().response_bytes < 500:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(cancel_mid_body())
    (receipt,) = b.snapshot().receipts
    assert receipt.outcome is Outcome.CANCELLED
    assert receipt.response_bytes == 500
    assert b.usage().requests == 1


def test_receipts_past_the_bound_are_dropped_and_counted(receiver: Receiver) -> None:
    b = broker(max_receipts=2)
    for _ in range(4):
        run(b.dispatch(get(receiver.url("/ok"))))
    snap = b.snapshot()
    assert [r.seq for r in snap.receipts] == [1, 2]
    assert snap.omitted == 2
    assert snap.usage.requests == 4


def test_a_later_failure_carries_the_receipts_committed_before_it(receiver: Receiver) -> None:
    b = broker()
    run(b.dispatch(get(receiver.url("/ok?sig=abc123"))))
    run(b.dispatch(get(receiver.url("/fail?sig=abc123"))))
    with pytest.raises(RequestTimeoutError) as info:
        run(b.dispatch(get(receiver.url("/slow?sig=abc123"), timeout=0.2)))
    text = json.dumps([r.to_dict() for r in info.value.receipts])
    assert "abc123" not in text
    assert "/slow" not in text
    assert [(r.seq, r.outcome) for r in info.value.receipts] == [
        (1, Outcome.SUCCEEDED),
        (2, Outcome.HTTP_ERROR),
        (3, Outcome.TIMEOUT),
    ]
    assert info.value.snapshot is not None
    assert info.value.snapshot.usage.requests == 3


def test_guard_turns_an_unexpected_error_into_a_failure_receipt(receiver: Receiver) -> None:
    b = broker()

    def analyze() -> None:
        with b.guard():
            run(b.dispatch(get(receiver.url("/ok"))))
            raise KeyError("reasoning failed")

    with pytest.raises(RunFailedError) as info:
        analyze()
    assert isinstance(info.value.__cause__, KeyError)
    assert [r.outcome for r in info.value.receipts] == [Outcome.SUCCEEDED]


def test_concurrent_dispatches_never_exceed_the_budget(receiver: Receiver) -> None:
    b = broker(budget=Budget(max_requests=4))

    async def many() -> Sequence[DispatchResult | BaseException]:
        jobs = [b.dispatch(get(receiver.url("/ok"))) for _ in range(10)]
        return await asyncio.gather(*jobs, return_exceptions=True)

    results = run(many())
    assert sum(isinstance(r, DispatchResult) for r in results) == 4
    assert sum(isinstance(r, BudgetExhaustedError) for r in results) == 6
    assert receiver.connections == 4
    assert [r.seq for r in b.snapshot().receipts] == [1, 2, 3, 4]


def test_dispatch_sync_from_many_threads_shares_one_budget(receiver: Receiver) -> None:
    b = broker(budget=Budget(max_requests=3))
    outcomes: list[str] = []

    def worker() -> None:
        try:
            b.dispatch_sync(get(receiver.url("/ok")))
            outcomes.append("sent")
        except BudgetExhaustedError:
            outcomes.append("refused")

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["refused"] * 3 + ["sent"] * 3
    assert receiver.connections == 3


def test_accountant_grants_exactly_the_budget_under_thread_contention() -> None:
    acc = Accountant(Budget(max_requests=500, max_active_requests=100))
    granted: list[int] = []
    lock = threading.Lock()

    def hammer() -> None:
        for i in range(200):
            try:
                seq = acc.acquire(active=i % 2 == 0)
            except BudgetExhaustedError:
                continue
            with lock:
                granted.append(seq)

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(granted) == list(range(1, 501))
    assert acc.usage().active_requests == 100


@pytest.mark.parametrize(
    "limits",
    [
        {"request_timeout": 0},
        {"max_body_bytes": 0},
        {"retain_bytes": -1},
        {"max_receipts": -1},
    ],
)
def test_a_broker_is_refused_limits_that_leave_nothing_to_wait_for_or_read(
    limits: dict[str, Any],
) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        TransportBroker(**limits)


def test_connection_goes_to_the_checked_address_with_the_original_host(
    receiver: Receiver,
) -> None:
    answers = [["127.0.0.1"], ["10.9.9.9"]]
    calls: list[str] = []

    async def rebinding_resolver(host: str, port: int) -> Sequence[str]:
        calls.append(host)
        return answers[len(calls) - 1]

    b = broker(resolver=rebinding_resolver)
    result = run(b.dispatch(get(receiver.url("/ok", host="hooks.example.test"))))
    assert result.ok
    # Resolved once; the later (rebound) answer was never asked for or used.
    assert calls == ["hooks.example.test"]
    assert receiver.requests[0].headers["host"] == f"hooks.example.test:{receiver.port}"
    assert result.receipt.host == "hooks.example.test"
    assert result.receipt.address == "127.0.0.1"


def test_slow_resolution_past_the_wall_deadline_is_refused_before_the_lease() -> None:
    async def stuck(host: str, port: int) -> Sequence[str]:
        await asyncio.sleep(5)
        return ["127.0.0.1"]

    b = broker(resolver=stuck, wall_deadline=0.2)
    with pytest.raises(WallDeadlineExceededError) as info:
        run(b.dispatch(get("http://slow-dns.example.test/ok")))
    assert info.value.receipt is None
    assert b.usage().requests == 0


def test_slow_resolution_past_the_request_timeout_costs_nothing() -> None:
    async def stuck(host: str, port: int) -> Sequence[str]:
        await asyncio.sleep(5)
        return ["127.0.0.1"]

    b = broker(resolver=stuck)
    with pytest.raises(RequestTimeoutError) as info:
        run(b.dispatch(get("http://slow-dns.example.test/ok", timeout=0.2)))
    assert info.value.receipt is None
    assert b.snapshot().receipts == ()
