"""Wire models of the durable reliability resources: confirmation receipts and verification runs."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel


class ReceiptRecord(BaseModel):
    """A confirmed mutation's receipt as the server keeps it."""

    outcome_ref: str
    idempotency_key: str
    status: Literal["pending", "succeeded", "failed"]
    outcome: Any = None
    created_at: datetime
    settled_at: datetime | None = None
    # An operator's settlement of a receipt left pending past the class deadline.
    settled_by: str | None = None
    settle_reason: str | None = None
    # In the list of pending receipts: past the confirmed-mutation deadline.
    stale: bool | None = None


class Checkpoint(BaseModel):
    run_id: str
    item: str
    result: Any = None
    recorded_at: datetime


class RunEnd(BaseModel):
    at: datetime
    by: str
    reason: str


class VerificationRun(BaseModel):
    run_id: str
    run_key: str
    artifact_version: str
    verifier_version: str
    state: Literal["running", "complete", "failed", "abandoned"]
    items: list[str]
    checkpoints: list[Checkpoint]
    remaining: list[str]
    created_at: datetime
    completed_at: datetime | None = None
    deadline_at: datetime | None = None
    # Who ended a run that did not complete ("server" at its deadline, or an operator), why.
    ended: RunEnd | None = None

    def results(self) -> dict[str, Any]:
        """Each checkpointed item's result."""
        return {c.item: c.result for c in self.checkpoints}
