"""The confirmed-mutation path: admit -> replay -> permit -> circuit -> claim -> dispatch -> settle.

Decisions 6 and 7 of docs/decisions/operation-class-policy.md: an effecting call
is admitted only with an idempotency key and outcome reference; a same-identity
replay of a settled mutation is answered from its receipt before the permits and
the circuit are consulted (the retained outcome is not a dispatch, so neither an
open circuit nor a full gate refuses it); the one-shot
receipt claim is its exclusive grant; the permit gate rejects the ninth
concurrent local mutation; the circuit isolates repeated adapter failure. Once
dispatched, the effect runs in its own task: an attempt timeout or a disconnect
returns the `pending` receipt while the effect runs on and settles that same
receipt. A dispatched effect is never reported cancelled. The receipts live
behind the server's receipts API (`tests.demonstrators.mutations`); the
negative control that breaks the rule on purpose is test code
(`tests/policy_proof/mutation.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from queue_server.policy.admission import admit_operation
from queue_server.policy.model import OperationClass
from queue_server.policy.values import ReliabilityPolicy
from tests.demonstrators.breaker import CallTicket, CircuitBreaker
from tests.demonstrators.permits import PermitGate

Outcome = dict[str, Any]
Effect = Callable[[], Awaitable[Outcome]]


class ReceiptStatus(StrEnum):
    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(frozen=True)
class Receipt:
    """The durable record of one confirmed mutation, found by its outcome reference."""

    idempotency_key: str
    outcome_ref: str
    status: ReceiptStatus
    outcome: Outcome | None = None


class ReceiptStore(Protocol):
    """Where receipts live: in PostgreSQL behind the server's receipts API (in memory in tests)."""

    async def claim(self, *, idempotency_key: str, outcome_ref: str) -> tuple[Receipt, bool]:
        """One-shot claim -> pending; the same identity again returns the existing receipt, False."""
        ...

    async def settle(self, outcome_ref: str, status: ReceiptStatus, outcome: Outcome) -> Receipt:
        """Settle a pending receipt once; the same settlement again is a no-op."""
        ...

    async def get(self, outcome_ref: str) -> Receipt | None: ...


class MutationStatus(StrEnum):
    """What the path reports to its caller. No path of this package reports `cancelled`: it is
    what a path that breaks the cancellation rule would say, so that the rule's check can
    catch it."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PENDING = "pending"
    NOT_DISPATCHED = "not-dispatched"
    CANCELLED = "cancelled"


@dataclass
class MutationReport:
    status: MutationStatus
    receipt: Receipt | None
    dispatched: bool
    replayed: bool = False
    # Completes with the settled receipt when the effect finishes after the report was returned.
    settlement: asyncio.Task[Receipt] | None = field(default=None, repr=False)


# Effects that outlive their caller are kept referenced until they settle.
_RUNNING: set[asyncio.Task[Receipt]] = set()

_STATUS_OF = {
    ReceiptStatus.PENDING: MutationStatus.PENDING,
    ReceiptStatus.SUCCEEDED: MutationStatus.SUCCEEDED,
    ReceiptStatus.FAILED: MutationStatus.FAILED,
}


class ConfirmedMutationPath:
    """Runs confirmed mutations under one permit gate and one circuit breaker."""

    def __init__(
        self,
        *,
        gate: PermitGate | None = None,
        breaker: CircuitBreaker | None = None,
        policy: ReliabilityPolicy | None = None,
    ) -> None:
        cls = OperationClass.CONFIRMED_MUTATION
        self.policy = policy
        self.gate = gate or PermitGate.for_class(cls, policy=policy)
        self.breaker = breaker or CircuitBreaker.for_class(cls, policy=policy)

    async def __call__(
        self,
        store: ReceiptStore,
        *,
        idempotency_key: str | None,
        outcome_ref: str | None,
        effect: Effect,
        disconnect: asyncio.Event | None = None,
        attempt_timeout: float | None = None,
    ) -> MutationReport:
        admission = admit_operation(
            OperationClass.CONFIRMED_MUTATION,
            idempotency_key=idempotency_key,
            outcome_ref=outcome_ref,
            attempt_timeout=attempt_timeout,
            policy=self.policy,
        )
        key, ref = admission.idempotency_key or "", admission.outcome_ref or ""
        if disconnect is not None and disconnect.is_set():
            return MutationReport(MutationStatus.NOT_DISPATCHED, None, dispatched=False)
        retained = await self._retained(store, key, ref)
        if retained is not None:
            return retained
        self.gate.acquire()
        try:
            ticket = self.breaker.before_call()
        except BaseException:
            self.gate.release()
            raise
        handed_off = False
        try:
            receipt, created = await store.claim(idempotency_key=key, outcome_ref=ref)
            if not created:
                return MutationReport(
                    _STATUS_OF[receipt.status], receipt, dispatched=False, replayed=True
                )
            if disconnect is not None and disconnect.is_set():
                settled = await store.settle(
                    ref, ReceiptStatus.FAILED, {"error": "not-dispatched", "dispatched": False}
                )
                return MutationReport(MutationStatus.NOT_DISPATCHED, settled, dispatched=False)
            task = asyncio.create_task(self._run_effect(store, ref, effect, ticket))
            handed_off = True
        finally:
            if not handed_off:
                self.breaker.release(ticket)
                self.gate.release()
        _RUNNING.add(task)
        task.add_done_callback(_RUNNING.discard)
        return await self._await_outcome(
            store, receipt, task, disconnect, admission.attempt_timeout_seconds
        )

    async def _retained(self, store: ReceiptStore, key: str, ref: str) -> MutationReport | None:
        """A settled receipt of this same identity answers at once; anything else (none yet, a
        pending one, another key's reference) goes on through the gates and the claim."""
        receipt = await store.get(ref)
        if (
            receipt is None
            or receipt.idempotency_key != key
            or receipt.status is ReceiptStatus.PENDING
        ):
            return None
        return MutationReport(_STATUS_OF[receipt.status], receipt, dispatched=False, replayed=True)

    async def _run_effect(
        self, store: ReceiptStore, ref: str, effect: Effect, ticket: CallTicket
    ) -> Receipt:
        try:
            try:
                outcome = await effect()
            except asyncio.CancelledError:
                self.breaker.release(ticket)
                raise
            except Exception as exc:
                self.breaker.record_failure(ticket)
                detail = {"error": type(exc).__name__, "detail": str(exc)}
                return await store.settle(ref, ReceiptStatus.FAILED, detail)
            self.breaker.record_success(ticket)
            return await store.settle(ref, ReceiptStatus.SUCCEEDED, outcome)
        finally:
            self.gate.release()

    async def _await_outcome(
        self,
        store: ReceiptStore,
        receipt: Receipt,
        task: asyncio.Task[Receipt],
        disconnect: asyncio.Event | None,
        timeout: float,
    ) -> MutationReport:
        waiters: set[asyncio.Future[Any]] = {task}
        gone = asyncio.ensure_future(disconnect.wait()) if disconnect is not None else None
        if gone is not None:
            waiters.add(gone)
        try:
            # asyncio.wait never cancels what it waits for: if our caller is cancelled,
            # the dispatched effect keeps running and settles its receipt.
            await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            await self._caller_cancelled(store, receipt, task)
            raise
        finally:
            if gone is not None:
                gone.cancel()
        if task.done() and not task.cancelled():
            settled = task.result()
            return MutationReport(_STATUS_OF[settled.status], settled, dispatched=True)
        return await self._leave_running(
            store, receipt, task, disconnected=gone is not None and gone.done()
        )

    async def _leave_running(
        self,
        store: ReceiptStore,
        receipt: Receipt,
        task: asyncio.Task[Receipt],
        *,
        disconnected: bool,
    ) -> MutationReport:
        """Timeout or disconnect after dispatch: report the pending receipt; the effect runs on."""
        return MutationReport(MutationStatus.PENDING, receipt, dispatched=True, settlement=task)

    async def _caller_cancelled(
        self, store: ReceiptStore, receipt: Receipt, task: asyncio.Task[Receipt]
    ) -> None:
        """The caller's task was cancelled after dispatch: the effect is left to settle its receipt."""
