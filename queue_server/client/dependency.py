"""The read-only dependency client: admitted reads through the transport broker.

Policy ADR Decision 7 for `read-only-dependency`: admission (a read never has
effects, so an effecting call is refused), finite capacity (the class's permit
gate rejects beyond its limit instead of queueing), a per-attempt timeout
(`asyncio.timeout`) inside the whole-operation deadline, retries of the named
failure classes with capped exponential backoff and full jitter
(`async_retrying_for`), and the canonical circuit breaker. Every request goes
through a `TransportBroker`, the one owner of outbound HTTP.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

from queue_server.policy import (
    CircuitBreaker,
    OperationClass,
    PermitGate,
    ReliabilityPolicy,
    admit_operation,
    async_retrying_for,
    classify_failure,
)
from queue_server.transport import DispatchRequest, DispatchResult, TransportBroker

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

        reads = ReadOnlyDependencyClient(TransportBroker(allow=["10.0.0.0/8"]))
        result = await reads.get("https://search.internal/v1/q?term=lease")
    """

    def __init__(
        self,
        broker: TransportBroker,
        *,
        policy: ReliabilityPolicy | None = None,
        breaker: CircuitBreaker | None = None,
        gate: PermitGate | None = None,
        sleep: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        self.broker = broker
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

        async def attempt() -> DispatchResult:
            async with asyncio.timeout(admission.attempt_timeout_seconds):
                result = await self.broker.dispatch(request)
            if result.status in _RETRYABLE_STATUS:
                raise DependencyStatusError(result)
            return result

        with self.gate.permit():
            async with asyncio.timeout(admission.deadline_seconds):
                retrying = async_retrying_for(RO, policy=self.policy, sleep=self.sleep)
                async for tried in retrying:
                    with tried:
                        return await self.breaker.call_async(attempt)
        raise AssertionError("tenacity re-raises the last failure")  # pragma: no cover


def _counts_toward_circuit(exc: BaseException) -> bool:
    """Dependency failures open the circuit; a refusal by our own policy does not."""
    return classify_failure(exc) is not None
