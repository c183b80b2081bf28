"""The JSON shape of each resource the API answers with, defined once.

The same class is the route's `response_model` (so the OpenAPI document at
/openapi.json describes exactly it), the SDK's typed result (`queue_server.client`
re-exports these), and the shape `views` renders rows into (tests check that every
answer has exactly these fields). Unknown fields are ignored on reading, so a newer
server does not break an older client; a field an older server did not send has a
default.

Pure data: pydantic and the standard library, nothing of the server.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

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
    updated_at: datetime | None = None
    updated_by: str | None = None
