"""Typed transport failures; each carries the receipts committed before it was raised."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from queue_server.transport.receipts import BrokerSnapshot, DispatchReceipt


class TransportError(Exception):
    """The transport broker could not complete the dispatch."""

    def __init__(
        self,
        detail: str | None = None,
        *,
        receipt: DispatchReceipt | None = None,
        snapshot: BrokerSnapshot | None = None,
    ) -> None:
        self.detail = detail or inspect.getdoc(self) or ""
        # The receipt of the dispatch that failed; None when it was refused before a lease.
        self.receipt = receipt
        # Every receipt committed by the broker so far, so a later failure cannot erase them.
        self.snapshot = snapshot
        super().__init__(self.detail)

    @property
    def receipts(self) -> tuple[DispatchReceipt, ...]:
        """The ordered receipts the broker had committed when this error was raised."""
        return self.snapshot.receipts if self.snapshot is not None else ()


class PolicyRefusedError(TransportError):
    """The target or request was refused by policy before dispatch; nothing was charged."""


class BudgetExhaustedError(TransportError):
    """A transport budget of this run is exhausted."""

    def __init__(
        self,
        detail: str | None = None,
        *,
        resource: str,
        receipt: DispatchReceipt | None = None,
        snapshot: BrokerSnapshot | None = None,
    ) -> None:
        # Which budget ran out: "requests", "active_requests" or "response_bytes".
        self.resource = resource
        super().__init__(detail, receipt=receipt, snapshot=snapshot)


class RequestTimeoutError(TransportError):
    """The request did not complete within its own timeout."""

    # What the policy's failure classification reads (queue_server.policy.retry).
    transport_failure: ClassVar[str] = "timeout"


class WallDeadlineExceededError(TransportError):
    """The run's outer wall deadline passed before the dispatch completed."""


class TransportFailureError(TransportError):
    """The dispatch failed on the wire (refused, reset, protocol error)."""

    transport_failure: ClassVar[str] = "transport"


class RunFailedError(TransportError):
    """The run failed after transport work started; the committed receipts are attached."""
