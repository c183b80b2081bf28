"""The one atomic accounting authority of a broker: request leases and response bytes.

Decisions 1-3 of docs/decisions/transport-accounting.md.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from queue_server.transport.errors import BudgetExhaustedError
from queue_server.transport.receipts import Usage


@dataclass(frozen=True, slots=True)
class Budget:
    """Limits of one run: total requests, active-verification requests, response-body bytes."""

    max_requests: int = 100
    max_active_requests: int = 0
    max_response_bytes: int = 1024 * 1024

    def __post_init__(self) -> None:
        """Refuse negative limits, which would make every check meaningless."""
        if min(self.max_requests, self.max_active_requests, self.max_response_bytes) < 0:
            raise ValueError("budget limits must be >= 0")


class Accountant:
    """Hands out non-refundable leases and charges body bytes under one lock.

    The lock is a threading lock held only for arithmetic, never across an await,
    so one accountant is safe from many threads and many asyncio tasks at once.
    """

    def __init__(self, budget: Budget) -> None:
        """Start a run with nothing consumed."""
        self._budget = budget
        self._lock = threading.Lock()
        self._requests = 0
        self._active = 0
        self._response_bytes = 0

    def acquire(self, *, active: bool) -> int:
        """Take one lease (and one active lease if asked) or refuse; return the lease number."""
        b = self._budget
        with self._lock:
            if self._requests >= b.max_requests:
                raise BudgetExhaustedError("the request budget is exhausted", resource="requests")
            if active and self._active >= b.max_active_requests:
                raise BudgetExhaustedError(
                    "the active-verification budget is exhausted", resource="active_requests"
                )
            if self._response_bytes >= b.max_response_bytes:
                # Any response at all would overrun the byte budget.
                raise BudgetExhaustedError(
                    "the response-byte budget is exhausted", resource="response_bytes"
                )
            # Both counters move together or neither does: leases are never refunded.
            self._requests += 1
            if active:
                self._active += 1
            return self._requests

    def charge(self, nbytes: int) -> bool:
        """Charge delivered body bytes; return False once the byte budget is crossed."""
        with self._lock:
            # The chunk that crosses the threshold is charged in full: it was delivered.
            self._response_bytes += nbytes
            return self._response_bytes <= self._budget.max_response_bytes

    def usage(self) -> Usage:
        """A consistent snapshot of the counters."""
        b = self._budget
        with self._lock:
            return Usage(
                requests=self._requests,
                active_requests=self._active,
                response_bytes=self._response_bytes,
                max_requests=b.max_requests,
                max_active_requests=b.max_active_requests,
                max_response_bytes=b.max_response_bytes,
            )
