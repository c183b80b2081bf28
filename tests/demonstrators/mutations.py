"""The confirmed-mutation bridge: the policy's mutation path over the server's durable receipts.

`HttpReceiptStore` is the `ReceiptStore` of `queue_server.policy` backed by the
receipts API, so a claim, a pending receipt and its settlement live in
PostgreSQL and outlive this process. `ConfirmedMutationBridge` runs each
mutation through `ConfirmedMutationPath`: admission (idempotency key and
outcome reference before dispatch), the replay of a settled receipt of the same
identity (answered before any gate: an open circuit or a full gate never refuses
a retained outcome), the permit gate of 8 (a ninth concurrent local mutation is
rejected, not queued), the circuit breaker, the one-shot claim, then dispatch. An attempt timeout returns the `pending` receipt while the
dispatched effect runs on and settles that same receipt; a dispatched effect is
never reported cancelled.
"""

from __future__ import annotations

import asyncio

from queue_server import wire
from queue_server.client import errors
from queue_server.client.client import QueueClient
from queue_server.errors import ReceiptConflictError
from queue_server.policy import ReliabilityPolicy
from tests.demonstrators.breaker import CircuitBreaker
from tests.demonstrators.mutation import (
    ConfirmedMutationPath,
    Effect,
    MutationReport,
    Outcome,
    Receipt,
    ReceiptStatus,
)
from tests.demonstrators.permits import PermitGate


def _receipt(record: wire.Receipt) -> Receipt:
    outcome = record.outcome if isinstance(record.outcome, dict) else None
    if record.outcome is not None and outcome is None:
        outcome = {"value": record.outcome}
    return Receipt(
        idempotency_key=record.idempotency_key,
        outcome_ref=record.outcome_ref,
        status=ReceiptStatus(record.status),
        outcome=outcome,
    )


class HttpReceiptStore:
    """A `ReceiptStore` over the receipts API of one tenant (durable across restarts)."""

    def __init__(self, client: QueueClient, *, tenant: str | None = None) -> None:
        self.client = client
        self.tenant = tenant

    async def claim(self, *, idempotency_key: str, outcome_ref: str) -> tuple[Receipt, bool]:
        """One-shot claim -> pending; the same identity again returns the retained receipt, False."""
        try:
            record, created = await asyncio.to_thread(
                self.client.claim_receipt, idempotency_key, outcome_ref, tenant=self.tenant
            )
        except errors.ConflictError as exc:
            raise ReceiptConflictError(exc.detail) from exc
        return _receipt(record), created

    async def settle(self, outcome_ref: str, status: ReceiptStatus, outcome: Outcome) -> Receipt:
        if status is ReceiptStatus.PENDING:
            raise ValueError("a settlement is succeeded or failed")
        try:
            record = await asyncio.to_thread(
                self.client.settle_receipt,
                outcome_ref,
                "succeeded" if status is ReceiptStatus.SUCCEEDED else "failed",
                outcome,
                tenant=self.tenant,
            )
        except errors.ConflictError as exc:
            raise ReceiptConflictError(exc.detail) from exc
        return _receipt(record)

    async def get(self, outcome_ref: str) -> Receipt | None:
        try:
            record = await asyncio.to_thread(
                self.client.get_receipt, outcome_ref, tenant=self.tenant
            )
        except errors.NotFoundError:
            return None
        return _receipt(record)


class ConfirmedMutationBridge:
    """Confirmed mutations of one tenant: one permit gate of 8 and one circuit, durable receipts.

    Example::

        bridge = ConfirmedMutationBridge(QueueClient(url, key, tenant="acme"))
        report = await bridge.mutate(
            idempotency_key="refund-42", outcome_ref="refund-42", effect=send_refund
        )
        # report.status: succeeded | failed | pending (timed out; settles later) | not-dispatched
    """

    def __init__(
        self,
        client: QueueClient,
        *,
        tenant: str | None = None,
        gate: PermitGate | None = None,
        breaker: CircuitBreaker | None = None,
        policy: ReliabilityPolicy | None = None,
    ) -> None:
        self.store = HttpReceiptStore(client, tenant=tenant)
        self.path = ConfirmedMutationPath(gate=gate, breaker=breaker, policy=policy)

    @property
    def gate(self) -> PermitGate:
        return self.path.gate

    @property
    def breaker(self) -> CircuitBreaker:
        return self.path.breaker

    async def mutate(
        self,
        *,
        idempotency_key: str | None,
        outcome_ref: str | None,
        effect: Effect,
        disconnect: asyncio.Event | None = None,
        attempt_timeout: float | None = None,
    ) -> MutationReport:
        """Admit, replay a settled receipt of this identity, else take a permit, pass the circuit,
        claim and dispatch; never reports `cancelled`."""
        return await self.path(
            self.store,
            idempotency_key=idempotency_key,
            outcome_ref=outcome_ref,
            effect=effect,
            disconnect=disconnect,
            attempt_timeout=attempt_timeout,
        )

    async def receipt(self, outcome_ref: str) -> Receipt | None:
        """The durable receipt of a mutation, by its outcome reference."""
        return await self.store.get(outcome_ref)
