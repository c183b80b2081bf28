"""Test doubles of the confirmed-mutation path: an in-memory receipt store and the negative control.

The negative control of Decision 8 of docs/decisions/operation-class-policy.md is a
mutation path weakened to cancel after dispatch: the cancellation rule's check must
fail on it, in process (`CancelAfterDispatchMutationPath`) and in the REST-backed
bridge (the weakening `cancel-dispatched-mutation-in-rest-bridge` of
`tests/weakenings.py` swaps it in). It is test code: the installed package has no
path that cancels a dispatched effect.
"""

from __future__ import annotations

import asyncio
import threading

from queue_server.errors import ReceiptConflictError
from tests.demonstrators.mutation import (
    ConfirmedMutationPath,
    MutationReport,
    MutationStatus,
    Outcome,
    Receipt,
    ReceiptStatus,
    ReceiptStore,
)


class InMemoryReceiptStore:
    """A process-local `ReceiptStore` for the unit tests and the cancellation rule's check."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._receipts: dict[str, Receipt] = {}
        self.history: list[Receipt] = []

    async def claim(self, *, idempotency_key: str, outcome_ref: str) -> tuple[Receipt, bool]:
        with self._lock:
            existing = self._receipts.get(outcome_ref)
            if existing is not None:
                if existing.idempotency_key != idempotency_key:
                    raise ReceiptConflictError(
                        f"outcome reference {outcome_ref!r} belongs to another idempotency key"
                    )
                return existing, False
            receipt = Receipt(idempotency_key, outcome_ref, ReceiptStatus.PENDING)
            self._receipts[outcome_ref] = receipt
            self.history.append(receipt)
            return receipt, True

    async def settle(self, outcome_ref: str, status: ReceiptStatus, outcome: Outcome) -> Receipt:
        if status is ReceiptStatus.PENDING:
            raise ValueError("a settlement is succeeded or failed")
        with self._lock:
            current = self._receipts[outcome_ref]
            if current.status is not ReceiptStatus.PENDING:
                if (current.status, current.outcome) == (status, outcome):
                    return current
                raise ReceiptConflictError(f"receipt {outcome_ref!r} is already {current.status}")
            receipt = Receipt(current.idempotency_key, outcome_ref, status, outcome)
            self._receipts[outcome_ref] = receipt
            self.history.append(receipt)
            return receipt

    async def get(self, outcome_ref: str) -> Receipt | None:
        with self._lock:
            return self._receipts.get(outcome_ref)


class CancelAfterDispatchMutationPath(ConfirmedMutationPath):
    """NEGATIVE CONTROL ONLY: a mutation weakened to cancel after dispatch. Never use it to mutate.

    It cancels the dispatched effect on disconnect or caller cancellation and
    reports `cancelled`, so an effect the dependency may already have applied
    becomes unobservable. The cancellation rule's check (`tests/policy_proof/verifier.py`) must fail on it.
    """

    async def _leave_running(
        self,
        store: ReceiptStore,
        receipt: Receipt,
        task: asyncio.Task[Receipt],
        *,
        disconnected: bool,
    ) -> MutationReport:
        if not disconnected:
            return await super()._leave_running(store, receipt, task, disconnected=False)
        settled = await self._abandon(store, receipt, task)
        return MutationReport(MutationStatus.CANCELLED, settled, dispatched=True)

    async def _caller_cancelled(
        self, store: ReceiptStore, receipt: Receipt, task: asyncio.Task[Receipt]
    ) -> None:
        await self._abandon(store, receipt, task)

    async def _abandon(
        self, store: ReceiptStore, receipt: Receipt, task: asyncio.Task[Receipt]
    ) -> Receipt:
        task.cancel()
        await asyncio.wait({task})
        return await store.settle(receipt.outcome_ref, ReceiptStatus.FAILED, {"cancelled": True})
