"""What the API answers, as typed values. Each resource's shape is defined once, in
`queue_server.wire`, for the server's answers, the OpenAPI document and these results;
what only the SDK needs (what it sends, its batch entries, pages) is here. Unknown
fields are ignored, so a newer server does not break an older client."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from queue_server.client.errors import ProblemError, problem_error
from queue_server.wire import (
    ApiKey,
    ApiKeyInfo,
    Concurrency,
    DeadLetter,
    Heartbeat,
    Item,
    Lease,
    LeaseTrace,
    LedgerEvent,
    Model,
    PolicyHistory,
    PolicyVersion,
    QueueSettings,
    Setting,
    SpendApproval,
    SpendApprovals,
    Tenant,
    WhoAmI,
)

__all__ = [
    "AdminKey",
    "ApiKey",
    "ApiKeyInfo",
    "BatchEntry",
    "BulkReplay",
    "CancelledItems",
    "Completion",
    "Concurrency",
    "DeadLetter",
    "DeadLetterDetail",
    "DeadLetterPage",
    "DeletedItems",
    "DependencyPage",
    "FanIn",
    "Heartbeat",
    "Item",
    "ItemPage",
    "Lease",
    "LeaseStatus",
    "LeaseTrace",
    "LedgerEvent",
    "Mismatch",
    "Model",
    "NewItem",
    "PolicyHistory",
    "PolicyVersion",
    "QueueSettings",
    "QueueStatus",
    "RetriedItems",
    "Setting",
    "SpendApproval",
    "SpendApprovals",
    "Status",
    "Tenant",
    "Verification",
    "WhoAmI",
    "Window",
    "Workflow",
    "WorkflowNode",
]


class AdminKey(Model):
    key_id: str
    role: str
    secret: str


class NewItem(Model):
    """One item to enqueue."""

    payload: Any = None
    priority: int = 0
    delay: float = 0
    max_acquisitions: int | None = None
    # While an item of the queue with this key is ready or leased, none is made: the
    # enqueue is answered with that item.
    unique_key: str | None = None
    # The queue's items with this key are handed out one at a time, in enqueue order.
    ordering_key: str | None = None
    # What a queue's rate limit per partition key counts this item's leases against.
    partition_key: str | None = None
    # With unique_key: nor while an item with it was made within this many seconds.
    unique_for: float | None = None
    # A name for it within one batch, which a later item's depends_on may use.
    ref: str | None = None
    # Items of the tenant this one waits for (ids, or refs of earlier items of the batch):
    # `waiting` until every one has completed.
    depends_on: list[str] | None = None
    # When a dependency goes to dead letters or is cancelled: "cancel" this item (the
    # default), "run" it anyway, or "wait" for the dependency's replay.
    on_dependency_failure: Literal["cancel", "run", "wait"] | None = None


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


class FanIn(Model):
    """A batch enqueued with its callback: the items, and the item that waits for them."""

    items: list[Item]
    callback: Item


class WorkflowNode(Model):
    """One item of a workflow's graph, with its dependencies among the graph's items."""

    item_id: str
    queue: str
    state: str
    depends_on: list[str]


class Workflow(Model):
    """The graph an item is part of: its ancestors, its descendants and itself (at most
    200; `complete` false when there are more)."""

    item_id: str
    nodes: list[WorkflowNode]
    complete: bool


class DependencyPage(Model):
    """A page of the items an item depends on, as they are now."""

    items: list[Item]
    next_cursor: str | None = None
    # How many items it depends on, and how many a waiting one still waits for.
    total: int = 0
    waiting_for: int = 0


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


class RetriedItems(Model):
    retried: int
    item_ids: list[str]
    over_cap: int = 0
    backlog_cap: int | None = None
    next_cursor: str | None = None


class DeletedItems(Model):
    deleted: int
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
    leases: list[LeaseStatus] = Field(default_factory=list)


class Mismatch(Model):
    tenant: str
    item_id: str
    problems: list[str]


class Verification(Model):
    checked: int
    mismatches: list[Mismatch]
    next_cursor: str | None = None
