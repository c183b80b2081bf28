"""The JSON shape of each resource the API answers with, defined once.

The same class is the route's `response_model` (so the OpenAPI document at
/openapi.json describes exactly it), the SDK's typed result (`queue_server.client`
re-exports these), and the shape `views` renders rows into (tests check that every
answer has exactly these fields). Unknown fields are ignored on reading, so a newer
server does not break an older client; a field an older server did not send has a
default.

Pure data: pydantic and the standard library, nothing of the server. It ships with the SDK's
distribution (client/), and the server imports it from there.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class Model(BaseModel):
    # A model's validator is built on its first use, not at import: a CLI command uses two or
    # three of the SDK's models, and building all of them cost a fifth of every command's start.
    model_config = ConfigDict(extra="ignore", frozen=True, defer_build=True)


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
    """A key as created: its secret is shown this once."""

    key_id: str
    tenant: str
    role: str
    name: str | None = None
    secret: str


class ApiKeyInfo(Model):
    """A key as listed: never its secret."""

    key_id: str
    tenant: str
    role: str
    name: str | None = None
    created_at: datetime
    revoked_at: datetime | None = None


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
    lease_deadline_at: datetime | None = Field(
        default=None, description="While leased: the lease's deadline; no heartbeat passes it."
    )
    result: Any = None
    last_failure: Any = None
    created_at: datetime
    updated_at: datetime
    unique_key: str | None = Field(
        default=None,
        description="Its producer's unique key: none other of the queue with it"
        " is made while this one is ready or leased.",
    )
    ordering_key: str | None = Field(
        default=None,
        description="Its producer's ordering key: the queue's items with it are handed out"
        " one at a time, in enqueue order; `state` is `waiting` while one before it is not"
        " finished.",
    )
    partition_key: str | None = Field(
        default=None,
        description="Its producer's partition key: a rate limit per partition key counts"
        " its leases against it.",
    )


class LedgerEvent(Model):
    seq: int
    at: datetime
    kind: str
    fence: int
    actor: str
    # The name of the key that acted (`actor` is `key:<id>`), if it was given one.
    actor_name: str | None = None
    data: Any = None


class LeaseTrace(Model):
    traceparent: str
    tracestate: str | None = None
    age: float = 0.0


class Lease(Model):
    item_id: str
    fence: int
    acquisition_count: int
    lease_expires_at: datetime
    lease_deadline_at: datetime | None = Field(
        default=None,
        description="The lease lives at most until then (the policy's deadline from its"
        " acquisition); a heartbeat never extends it further.",
    )
    payload: Any = None
    priority: int
    queue: str
    trace: LeaseTrace | None = Field(
        default=None,
        description="The W3C trace context the item was enqueued with (its `traceparent`"
        " and `tracestate` headers), and `age`: seconds from the enqueue to this"
        " acquisition. Null when the enqueue sent none.",
    )


class Heartbeat(Model):
    item_id: str
    fence: int
    lease_expires_at: datetime
    lease_deadline_at: datetime | None = None


class PolicyVersion(Model):
    """A policy version the server has started under."""

    version: str
    sha256: str
    source: str
    first_loaded_at: datetime
    last_loaded_at: datetime
    loads: int
    current: bool
    published_by: str | None = Field(
        default=None,
        description="The admin key that published it (`key:<id>`); null if only loaded.",
    )
    reason: str | None = Field(default=None, description="Why it was published.")
    published_at: datetime | None = None
    activated_at: datetime | None = Field(
        default=None, description="When it was last activated: the last one runs."
    )


class PolicyHistory(Model):
    versions: list[PolicyVersion]


class SpendApproval(Model):
    approval_id: str
    tenant: str
    queue: str
    approved_by: str = Field(description="The approving key's id (older rows: the name given).")
    approved_by_key: str | None = Field(
        default=None, description="The approving key's id; null for approvals before keys."
    )
    approved_by_role: str | None = Field(
        default=None, description="The approving key's role: operator or admin."
    )
    max_concurrency: int
    expires_at: datetime
    reason: str
    created_at: datetime
    live: bool = Field(
        default=True, description="Raises the queue's limit now: neither expired nor revoked."
    )
    revoked_at: datetime | None = None
    revoked_by: str | None = Field(default=None, description="The revoking key's id.")


class SpendApprovals(Model):
    approvals: list[SpendApproval]


class Concurrency(Model):
    tenant: str
    queue: str
    limit: int = Field(
        description="Leases at once now: the queue's concurrency, at most the approved limit."
    )
    active_leases: int
    approval: dict[str, Any] | None = Field(
        default=None, description="The live spend approval behind the approved limit."
    )
    approved_limit: int | None = Field(
        default=None,
        description="The live approval's max_concurrency (at most the policy's max-approved),"
        " else the policy's base concurrency (1).",
    )
    concurrency: int | None = Field(
        default=None, description="The queue's own concurrency; null: the approved limit."
    )
    expires_at: datetime | None = Field(
        default=None, description="When the approval behind the limit expires."
    )
    expiring: bool = Field(
        default=False,
        description="The approval expires within the server's warning window"
        " (QUEUE_SERVER_APPROVAL_WARNING_SECONDS, a day by default).",
    )
    warning: str | None = Field(default=None, description="What happens when it expires.")


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


class Setting(Model):
    """One effective setting and where it comes from: queue, tenant, policy or default."""

    value: Any
    source: str


class RetrySettings(Model):
    base: Setting
    factor: Setting
    cap: Setting
    jitter: Setting


class QueueSettings(Model):
    """A queue's effective lease TTL, deadline, acquisition budget and retry backoff."""

    tenant: str
    queue: str
    lease_ttl: Setting
    deadline: Setting
    max_acquisitions: Setting
    retry: RetrySettings
    rate_limit: Setting | None = Field(
        default=None,
        description="`{limit, per, partitioned}`: at most `limit` leases in any `per` seconds,"
        " over the queue or per partition key; null: none.",
    )
    ordering_dead_letters: Setting | None = Field(
        default=None,
        description="`release`: an item of an ordering key that goes to dead letters lets the"
        " next of its key go; `hold`: the key waits until it is replayed or discarded.",
    )
    fairness: Setting | None = Field(
        default=None,
        description="`arrival`: a priority's due items are handed out the one due longest"
        " first; `partition_key`: round-robin between their partition keys.",
    )
    updated_at: datetime | None = None
    updated_by: str | None = None


# -- the durable reliability resources: confirmation receipts and verification runs


class Receipt(Model):
    """A confirmed mutation's receipt as the server keeps it."""

    outcome_ref: str
    idempotency_key: str
    status: Literal["pending", "succeeded", "failed"]
    outcome: Any = None
    created_at: datetime
    settled_at: datetime | None = None
    settled_by: str | None = Field(
        default=None, description="The operator who settled it, when its claimant did not"
    )
    settle_reason: str | None = None


class StaleReceipt(Receipt):
    """A pending receipt as listed."""

    stale: bool = Field(description="Pending past the confirmed-mutation deadline")


class ReceiptPage(Model):
    receipts: list[StaleReceipt]
    stale_after: float = Field(description="The confirmed-mutation deadline, seconds")
    next_cursor: str | None = None


RunState = Literal["running", "complete", "failed", "abandoned"]


class Checkpoint(Model):
    run_id: str
    item: str
    result: Any = None
    recorded_at: datetime


class RunEnded(Model):
    at: datetime
    by: str = Field(description="`server` (its deadline) or the operator who abandoned it")
    reason: str = Field(description="`deadline-exceeded`, or the operator's reason")


class VerificationRun(Model):
    run_id: str
    run_key: str
    artifact_version: str
    verifier_version: str
    state: RunState
    items: list[str]
    checkpoints: list[Checkpoint]
    remaining: list[str]
    created_at: datetime
    completed_at: datetime | None = None
    deadline_at: datetime = Field(description="A run still running then ends `failed`")
    ended: RunEnded | None = Field(
        default=None, description="Who ended a run that did not complete, and why"
    )

    def results(self) -> dict[str, Any]:
        """Each checkpointed item's result."""
        return {c.item: c.result for c in self.checkpoints}


class VerificationRunSummary(Model):
    """A run as listed: how many items, not which."""

    run_id: str
    run_key: str
    artifact_version: str
    verifier_version: str
    state: RunState
    items: int = Field(description="How many items the run declared")
    checkpoints: int = Field(description="How many of them are checkpointed")
    created_at: datetime
    completed_at: datetime | None = None
    deadline_at: datetime
    ended: RunEnded | None = None


class VerificationRunPage(Model):
    runs: list[VerificationRunSummary]
    next_cursor: str | None = None
