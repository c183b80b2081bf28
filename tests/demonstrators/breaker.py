"""The one shared circuit breaker: closed -> open -> half-open -> closed.

Decision 4 of docs/decisions/operation-class-policy.md: interactive turns, dependency reads
and confirmed mutations go through it.

Thread- and asyncio-safe: state changes happen under a `threading.Lock` that is
never held across an await, so the same breaker can guard sync and async calls.
Each admitted call gets a ticket; a result reported for a ticket from an older
generation (admitted before the circuit last changed state) is ignored.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import ParamSpec, TypeVar

from queue_server.policy.errors import PolicyError
from queue_server.policy.loader import default_policy
from queue_server.policy.model import (
    CircuitBreakerPolicy,
    Dimension,
    OperationClass,
    as_operation_class,
    cell_name,
)
from queue_server.policy.values import ReliabilityPolicy
from tests.demonstrators.errors import CircuitOpenError

P = ParamSpec("P")
T = TypeVar("T")


class CircuitState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half-open"


@dataclass(frozen=True)
class CallTicket:
    """Proof that a call was admitted, in which generation, and whether it is a half-open trial."""

    generation: int
    trial: bool


def _counts_every_exception(exc: BaseException) -> bool:
    return isinstance(exc, Exception)


class CircuitBreaker:
    """Opens after `failure_threshold` consecutive failures; after `reset_timeout` admits trials."""

    def __init__(
        self,
        *,
        failure_threshold: int,
        reset_timeout: float,
        half_open_max_calls: int = 1,
        clock: Callable[[], float] = time.monotonic,
        is_failure: Callable[[BaseException], bool] = _counts_every_exception,
        name: str = "circuit",
    ) -> None:
        if failure_threshold < 1 or half_open_max_calls < 1 or not reset_timeout > 0:
            raise ValueError("threshold, trial count and reset timeout must be positive")
        self.name = name
        self.failure_threshold = failure_threshold
        self.reset_timeout = reset_timeout
        self.half_open_max_calls = half_open_max_calls
        self._clock = clock
        self._is_failure = is_failure
        self._lock = threading.Lock()
        self._state = CircuitState.CLOSED
        self._generation = 0
        self._failures = 0
        self._opened_at = 0.0
        self._trials = 0

    @classmethod
    def for_class(
        cls,
        operation_class: OperationClass | str,
        *,
        policy: ReliabilityPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
        is_failure: Callable[[BaseException], bool] = _counts_every_exception,
    ) -> CircuitBreaker:
        """A breaker configured from the class's `circuit-breaking` cell."""
        oc = as_operation_class(operation_class)
        cell = (policy or default_policy()).for_class(oc).circuit_breaking
        if not isinstance(cell, CircuitBreakerPolicy):
            raise PolicyError.single(
                cell_name(oc, Dimension.CIRCUIT_BREAKING),
                "this class does not use the canonical circuit breaker",
            )
        return cls(
            failure_threshold=cell.failure_threshold,
            reset_timeout=cell.reset_timeout_seconds,
            half_open_max_calls=cell.half_open_max_calls,
            clock=clock,
            is_failure=is_failure,
            name=oc.value,
        )

    def _move(self, state: CircuitState) -> None:
        self._state = state
        self._generation += 1
        self._failures = 0
        self._trials = 0
        if state is CircuitState.OPEN:
            self._opened_at = self._clock()

    def _refresh(self) -> None:
        if (
            self._state is CircuitState.OPEN
            and self._clock() - self._opened_at >= self.reset_timeout
        ):
            self._move(CircuitState.HALF_OPEN)

    @property
    def state(self) -> CircuitState:
        with self._lock:
            self._refresh()
            return self._state

    def before_call(self) -> CallTicket:
        """Admit a call or raise `CircuitOpenError`; half-open admits a bounded number of trials."""
        with self._lock:
            self._refresh()
            if self._state is CircuitState.OPEN:
                raise CircuitOpenError(f"the {self.name} circuit is open")
            if self._state is CircuitState.HALF_OPEN:
                if self._trials >= self.half_open_max_calls:
                    raise CircuitOpenError(f"the {self.name} circuit is half-open; trial in flight")
                self._trials += 1
                return CallTicket(self._generation, trial=True)
            return CallTicket(self._generation, trial=False)

    def record_success(self, ticket: CallTicket) -> None:
        with self._lock:
            if ticket.generation != self._generation:
                return
            if ticket.trial:
                self._move(CircuitState.CLOSED)
            else:
                self._failures = 0

    def record_failure(self, ticket: CallTicket) -> None:
        with self._lock:
            if ticket.generation != self._generation:
                return
            if ticket.trial:
                self._move(CircuitState.OPEN)
                return
            self._failures += 1
            if self._failures >= self.failure_threshold:
                self._move(CircuitState.OPEN)

    def release(self, ticket: CallTicket) -> None:
        """Give back a trial slot for a call that ended without a verdict (e.g. it was cancelled)."""
        with self._lock:
            if ticket.trial and ticket.generation == self._generation and self._trials > 0:
                self._trials -= 1

    def _settle(self, ticket: CallTicket, exc: BaseException) -> None:
        if self._is_failure(exc):
            self.record_failure(ticket)
        elif isinstance(exc, Exception):
            self.record_success(ticket)
        else:
            self.release(ticket)

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        ticket = self.before_call()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            self._settle(ticket, exc)
            raise
        self.record_success(ticket)
        return result

    async def call_async(
        self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        ticket = self.before_call()
        try:
            result = await fn(*args, **kwargs)
        except BaseException as exc:
            self._settle(ticket, exc)
            raise
        self.record_success(ticket)
        return result
