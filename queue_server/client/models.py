"""What the API answers (queue_server/api/schemas.py, served at /openapi.json), as typed
values. Unknown fields are ignored, so a newer server does not break an older client."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from queue_server.client.errors import ProblemError, problem_error


class Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class WhoAmI(Model):
    key_id: str
    tenant: str | None
    role: str


class Tenant(Model):
    tenant: str
    backlog_cap: int
    default_max_acquisitions: int
    default_lease_ttl: float
    retention: float | None = None
    backlog: int | None = None
    ready: int | None = None
    leased: int | None = None
    completed: int | None = None
    quarantined: int | None = None
    cancelled: int | None = None
    created_at: datetime
    updated_at: datetime


class ApiKey(Model):
    key_id: str
    tenant: str
    role: str
    secret: str


class ApiKeyInfo(Model):
    """A key as listed: never its secret."""

    key_id: str
    tenant: str
    role: str
    created_at: datetime
    revoked_at: datetime | None = None


class AdminKey(Model):
    key_id: str
    role: str
    secret: str


class Item(Model):
    item_id: str
    tenant: str
    queue: str
    state: str
    payload: Any = None
    priority: int
    available_at: datetime
    fence: int
    acquisition_count: int
    max_acquisitions: int
    lease_holder: str | None = None
    lease_expires_at: datetime | None = None
    result: Any = None
    last_failure: Any = None
    created_at: datetime
    updated_at: datetime


class NewItem(Model):
    """One item to enqueue."""

    payload: Any = None
    priority: int = 0
    delay: float = 0
    max_acquisitions: int | None = None


class LedgerEvent(Model):
    seq: int
    at: datetime
    kind: str
    fence: int
    actor: str
    data: Any = None


class Lease(Model):
    item_id: str
    fence: int
    acquisition_count: int
    lease_expires_at: datetime
    # The lease lives at most until then (the policy's deadline from its acquisition).
    lease_deadline_at: datetime | None = None
    payload: Any = None
    priority: int
    queue: str


class Completion(Model):
    """One entry of a batch of completions: the item, its fence, the result, its own key."""

    item_id: str
    fence: int
    result: Any = None
    idempotency_key: str = Field(default_factory=lambda: f"qs-{uuid.uuid4().hex}")


class BatchEntry(Model):
    """One entry's answer in a batch: its status, and the item or the problem."""

    item_id: str
    status: int
    item: Item | None = None
    lease_expires_at: datetime | None = None
    problem: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def error(self) -> ProblemError:
        """The typed exception a single request would have raised for this entry."""
        return problem_error(self.status, self.problem or {})


class Heartbeat(Model):
    item_id: str
    fence: int
    lease_expires_at: datetime


class SpendApproval(Model):
    approval_id: str
    tenant: str
    queue: str
    approved_by: str
    max_concurrency: int
    expires_at: datetime
    reason: str
    created_at: datetime


class Concurrency(Model):
    tenant: str
    queue: str
    limit: int
    active_leases: int
    approval: dict[str, Any] | None = None


class DeadLetter(Model):
    dead_letter_id: str
    kind: str
    item_id: str | None = None
    delivery_id: str | None = None
    queue: str | None = None
    reason: str
    last_failure: Any = None
    created_at: datetime
    closed_at: datetime | None = None
    resolution: str | None = None


class DeadLetterPage(Model):
    dead_letters: list[DeadLetter]
    next_cursor: str | None = None


class DeadLetterDetail(Model):
    dead_letter: DeadLetter
    item: Item | None = None
    events: list[LedgerEvent] = Field(default_factory=list)


class BulkReplay(Model):
    queue: str
    replayed: int
    skipped: int
    remaining: int
    #: Left open: the backlog cap had no room for them.
    over_cap: int = 0
    backlog_cap: int | None = None
    item_ids: list[str] = Field(default_factory=list)
    skipped_dead_letter_ids: list[str] = Field(default_factory=list)
    over_cap_dead_letter_ids: list[str] = Field(default_factory=list)


class Window(Model):
    last_minute: int = 0
    last_hour: int = 0
    total: int = 0


class QueueStatus(Model):
    queue: str
    ready: int
    due: int
    leased: int
    quarantined: int
    completed: int = 0
    cancelled: int = 0
    oldest_ready_age: float | None = None
    concurrency_limit: int
    active_leases: int
    # Items by state, every state (zero as zero).
    states: dict[str, int] = Field(default_factory=dict)
    paused: bool = False
    paused_at: datetime | None = None
    paused_by: str | None = None
    pause_reason: str | None = None
    oldest_lease_age: float | None = None
    open_dead_letters: int = 0
    completions: Window = Field(default_factory=Window)
    failures: Window = Field(default_factory=Window)
    quarantines: int = 0


class ItemPage(Model):
    items: list[Item]
    next_cursor: str | None = None


class CancelledItems(Model):
    cancelled: int
    item_ids: list[str]
    next_cursor: str | None = None


class LeaseStatus(Model):
    queue: str
    item_id: str
    worker: str
    fence: int
    acquired_at: datetime | None = None
    lease_expires_at: datetime


class Status(Model):
    tenant: str
    backlog: int
    backlog_cap: int
    open_dead_letters: int
    queues: list[QueueStatus]
    leases: list[LeaseStatus] = []


class Mismatch(Model):
    tenant: str
    item_id: str
    problems: list[str]


class Verification(Model):
    checked: int
    mismatches: list[Mismatch]
    next_cursor: str | None = None
