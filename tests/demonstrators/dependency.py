"""The read-only dependency client: admitted reads through the transport broker.

Decision 7 of docs/decisions/operation-class-policy.md for `read-only-dependency`: admission
(a read never has effects, so an effecting call is refused), finite capacity (the class's
permit gate rejects beyond its limit instead of queueing), retries of the named failure
classes with capped exponential backoff and full jitter (`async_retrying_for`), and the
canonical circuit breaker.

Each read is one `TransportBroker` run, the one owner of outbound HTTP: the
class's attempt timeout is its request timeout (expiry: `RequestTimeoutError`,
receipt `timeout`, retryable) and the class's deadline its wall deadline (expiry:
`WallDeadlineExceededError`, receipt `wall_deadline`, never retried); a read the
caller cancels leaves a `cancelled` receipt. The run goes through the broker's
guard, so an unexpected error after it started is a `RunFailedError` carrying the
receipts. `last_run` is the broker of the latest read, for its receipts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from queue_server.policy import (
    OperationClass,
    ReliabilityPolicy,
    admit_operation,
    async_retrying_for,
    classify_failure,
)
from queue_server.transport import Budget, DispatchRequest, DispatchResult, TransportBroker
from queue_server.transport.ssrf import AllowSpec, Resolver
from tests.demonstrators.breaker import CircuitBreaker
from tests.demonstrators.errors import CircuitOpenError
from tests.demonstrators.permits import PermitGate

RO = OperationClass.READ_ONLY_DEPENDENCY
_RETRYABLE_STATUS = frozenset({429, 502, 503, 504})


class DependencyStatusError(Exception):
    """The dependency answered with a status worth retrying (429, 502, 503, 504)."""

    def __init__(self, result: DispatchResult) -> None:
        self.result = result
        # `classify_failure` reads `status` to name the failure class.
        self.status = result.status
        super().__init__(f"dependency answered {result.status}")


class ReadOnlyDependencyClient:
    """Reads from a dependency under the `read-only-dependency` cells of the policy.

    Example::

        reads = ReadOnlyDependencyClient(allow=["10.0.0.0/8"])
        result = await reads.get("https://search.internal/v1/q?term=lease")
    """

    def __init__(
        self,
        *,
        allow: AllowSpec = None,
        resolver: Resolver | None = None,
        budget: Budget | None = None,
        policy: ReliabilityPolicy | None = None,
        breaker: CircuitBreaker | None = None,
        gate: PermitGate | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        self.allow = allow
        self.resolver = resolver
        # Per read: at most the class's attempts; a response body of up to 1 MiB each.
        self.budget = budget
        self.last_run: TransportBroker | None = None
        self.policy = policy
        self.breaker = breaker or CircuitBreaker.for_class(
            RO, policy=policy, is_failure=_counts_toward_circuit
        )
        self.gate = gate or PermitGate.for_class(RO, policy=policy)
        self.sleep = sleep

    async def get(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        attempt_timeout: float | None = None,
        deadline: float | None = None,
        label: str = "read-only-dependency",
    ) -> DispatchResult:
        """One admitted read: at most the class's attempts, each bounded, all within the deadline."""
        admission = admit_operation(
            RO,
            effecting=False,
            attempt_timeout=attempt_timeout,
            deadline=deadline,
            policy=self.policy,
        )
        request = DispatchRequest(
            "GET",
            url,
            headers=dict(headers or {}),
            label=label,
            timeout=admission.attempt_timeout_seconds,
        )
        retrying = async_retrying_for(RO, policy=self.policy, sleep=self.sleep)
        attempts = admission.max_attempts
        broker = TransportBroker(
            budget=self.budget or Budget(max_requests=attempts),
            allow=self.allow,
            request_timeout=admission.attempt_timeout_seconds,
            wall_deadline=admission.deadline_seconds,
            resolver=self.resolver,
        )
        self.last_run = broker

        async def attempt() -> DispatchResult:
            result = await broker.dispatch(request)
            if result.status in _RETRYABLE_STATUS:
                raise DependencyStatusError(result)
            return result

        with self.gate.permit(), broker.guard(DependencyStatusError, CircuitOpenError):
            async for tried in retrying:
                with tried:
                    return await self.breaker.call_async(attempt)
        raise AssertionError("tenacity re-raises the last failure")  # pragma: no cover


def _counts_toward_circuit(exc: BaseException) -> bool:
    """Dependency failures open the circuit; a refusal by our own policy does not."""
    return classify_failure(exc) is not None
