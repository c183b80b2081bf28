"""A finite permit gate: the (n+1)th concurrent holder is rejected immediately, never queued.

Used as the confirmed-mutation gate of 8 (docs/decisions/operation-class-policy.md, Decision
7) and as the capacity gate of every class whose backpressure is `reject-at-capacity`.
Acquisition never blocks, so the same gate is safe from threads and from asyncio tasks.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from queue_server.policy.loader import default_policy
from queue_server.policy.model import OperationClass, as_operation_class
from queue_server.policy.values import ReliabilityPolicy
from tests.demonstrators.errors import PermitUnavailableError


class PermitGate:
    """At most `capacity` concurrent holders; one more is rejected with `PermitUnavailableError`."""

    def __init__(self, capacity: int, *, name: str = "permits") -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"a permit gate has a finite positive capacity, got {capacity!r}")
        self.capacity = capacity
        self.name = name
        self._lock = threading.Lock()
        self._held = 0

    @classmethod
    def for_class(
        cls, operation_class: OperationClass | str, *, policy: ReliabilityPolicy | None = None
    ) -> PermitGate:
        """A gate sized by the class's `concurrency` cell (8 for confirmed mutations)."""
        oc = as_operation_class(operation_class)
        limit = (policy or default_policy()).for_class(oc).concurrency.limit
        return cls(limit, name=oc.value)

    @property
    def in_use(self) -> int:
        with self._lock:
            return self._held

    def try_acquire(self) -> bool:
        with self._lock:
            if self._held >= self.capacity:
                return False
            self._held += 1
            return True

    def acquire(self) -> None:
        if not self.try_acquire():
            raise PermitUnavailableError(
                f"all {self.capacity} {self.name} permits are held; rejected, not queued"
            )

    def release(self) -> None:
        with self._lock:
            if self._held == 0:
                raise RuntimeError("release without a held permit")
            self._held -= 1

    @contextmanager
    def permit(self) -> Iterator[None]:
        self.acquire()
        try:
            yield
        finally:
            self.release()
