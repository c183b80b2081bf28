"""Dispatch receipts: one per acquired lease, ordered, bounded and free of raw targets."""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any


class Outcome(StrEnum):
    """How a leased dispatch ended."""

    SUCCEEDED = "succeeded"
    REDIRECT_REFUSED = "redirect_refused"
    HTTP_ERROR = "http_error"
    TIMEOUT = "timeout"
    WALL_DEADLINE = "wall_deadline"
    TRANSPORT_ERROR = "transport_error"
    RESPONSE_BUDGET_EXHAUSTED = "response_budget_exhausted"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class Usage:
    """Monotonic counters of what the run has consumed, with its limits."""

    requests: int
    active_requests: int
    response_bytes: int
    max_requests: int
    max_active_requests: int
    max_response_bytes: int

    def to_dict(self) -> dict[str, int]:
        """JSON-ready form."""
        return {
            "requests": self.requests,
            "active_requests": self.active_requests,
            "response_bytes": self.response_bytes,
            "max_requests": self.max_requests,
            "max_active_requests": self.max_active_requests,
            "max_response_bytes": self.max_response_bytes,
        }


@dataclass(frozen=True, slots=True)
class DispatchReceipt:
    """What one leased dispatch did; holds the host and a URL hash, never the path or query."""

    seq: int
    label: str
    active: bool
    method: str
    scheme: str
    host: str
    port: int
    address: str
    url_sha256: str
    outcome: Outcome
    status: int | None
    error: str | None
    request_bytes: int
    response_bytes: int
    started_at: datetime
    duration_ms: float
    headers_ms: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, suitable for storing with an outbox row."""
        return {
            "seq": self.seq,
            "label": self.label,
            "active": self.active,
            "method": self.method,
            "scheme": self.scheme,
            "host": self.host,
            "port": self.port,
            "address": self.address,
            "url_sha256": self.url_sha256,
            "outcome": self.outcome.value,
            "status": self.status,
            "error": self.error,
            "request_bytes": self.request_bytes,
            "response_bytes": self.response_bytes,
            "started_at": self.started_at.isoformat(),
            "duration_ms": round(self.duration_ms, 3),
            "headers_ms": None if self.headers_ms is None else round(self.headers_ms, 3),
        }


@dataclass(frozen=True, slots=True)
class BrokerSnapshot:
    """The receipts committed so far (ordered by lease), how many were omitted, and usage."""

    receipts: tuple[DispatchReceipt, ...]
    omitted: int
    usage: Usage

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "receipts": [r.to_dict() for r in self.receipts],
            "omitted": self.omitted,
            "usage": self.usage.to_dict(),
        }


@dataclass(slots=True)
class ReceiptLog:
    """A bounded, thread-safe log of receipts kept in lease order; overflow is counted."""

    max_receipts: int
    _receipts: list[DispatchReceipt] = field(default_factory=list)
    _omitted: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def commit(self, receipt: DispatchReceipt) -> bool:
        """Keep the receipt if the bound allows; return whether it was kept."""
        with self._lock:
            if len(self._receipts) >= self.max_receipts:
                # A hard ceiling keeps the audit bounded; the count keeps it honest.
                self._omitted += 1
                return False
            # Concurrent dispatches close out of order; keep the lease order.
            bisect.insort(self._receipts, receipt, key=lambda r: r.seq)
            return True

    def contents(self) -> tuple[tuple[DispatchReceipt, ...], int]:
        """The kept receipts in lease order and the omitted count."""
        with self._lock:
            return tuple(self._receipts), self._omitted
