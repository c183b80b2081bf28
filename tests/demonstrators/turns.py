"""The interactive turn gate: a bounded deadline, a capacity gate, and disconnect authority.

Decisions 6 and 7 of docs/decisions/operation-class-policy.md for `interactive-turn`: a turn
is admitted (its id is the idempotency key and outcome reference of its writes), takes a
permit of the class's capacity gate (rejected at capacity, never queued), passes the
canonical circuit breaker and runs under the class's deadline. Every write of the turn goes
through `Turn.write`: once the caller has disconnected no later write is dispatched, so none
is committed; a write already dispatched is shielded and runs on to its outcome, and is
never reported cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from queue_server.policy import (
    Admission,
    OperationClass,
    ReliabilityPolicy,
    admit_operation,
    default_policy,
)
from tests.demonstrators.breaker import CircuitBreaker
from tests.demonstrators.cancellation import DisconnectAuthority, DisconnectOutcome
from tests.demonstrators.permits import PermitGate

IT = OperationClass.INTERACTIVE_TURN
T = TypeVar("T")


class Turn:
    """One admitted turn: its deadline, its disconnect authority and the writes it dispatched."""

    def __init__(self, admission: Admission, authority: DisconnectAuthority) -> None:
        self.admission = admission
        self.authority = authority
        self.dispatched: list[asyncio.Future[Any]] = []

    @property
    def turn_id(self) -> str | None:
        return self.admission.idempotency_key

    def disconnect(self) -> DisconnectOutcome:
        """The caller left: no later write of this turn is dispatched."""
        return self.authority.disconnect()

    async def write(self, effect: Callable[[], Awaitable[T]]) -> T:
        """Dispatch one write of the turn, or raise `OperationStoppedError` after a disconnect.

        Disconnect and dispatch race under the authority's lock: either the write is
        refused, or it is dispatched and shielded so that neither the deadline nor a
        cancellation of the turn can make its outcome unobservable.
        """
        self.authority.dispatch()

        async def run() -> T:
            return await effect()

        task = asyncio.ensure_future(run())
        self.dispatched.append(task)
        return await asyncio.shield(task)

    async def settled(self) -> None:
        """Wait for every dispatched write to reach its outcome."""
        if self.dispatched:
            await asyncio.wait(self.dispatched)


class TurnGate:
    """Admits interactive turns: capacity gate, circuit breaker and deadline from the policy.

    Example::

        gate = TurnGate()
        async with gate.turn("turn-7f3a") as turn:
            await turn.write(lambda: save_message(...))   # refused once turn.disconnect() ran
    """

    def __init__(
        self,
        *,
        policy: ReliabilityPolicy | None = None,
        gate: PermitGate | None = None,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        self.policy = policy
        self.gate = gate or PermitGate.for_class(IT, policy=policy)
        self.breaker = breaker or CircuitBreaker.for_class(IT, policy=policy)

    @contextlib.asynccontextmanager
    async def turn(
        self, turn_id: str | None, *, deadline: float | None = None, writes: bool = True
    ) -> AsyncIterator[Turn]:
        """Admit a turn, hold a permit for its duration and bound it by the deadline."""
        envelope = (self.policy or default_policy()).for_class(IT).attempt_timeout.seconds
        admission = admit_operation(
            IT,
            idempotency_key=turn_id,
            outcome_ref=turn_id,
            effecting=writes,
            deadline=deadline,
            # A shorter deadline narrows the attempt too: the attempt must fit inside it.
            attempt_timeout=None if deadline is None else min(deadline, envelope),
            policy=self.policy,
        )
        self.gate.acquire()
        try:
            ticket = self.breaker.before_call()
            turn = Turn(admission, DisconnectAuthority(IT, policy=self.policy))
            try:
                async with asyncio.timeout(admission.deadline_seconds):
                    yield turn
            except BaseException as exc:
                if isinstance(exc, Exception) and not isinstance(exc, TimeoutError):
                    self.breaker.record_failure(ticket)
                else:
                    self.breaker.release(ticket)
                raise
            self.breaker.record_success(ticket)
        finally:
            self.gate.release()
