"""The wire format, a catalogue read by name (hence over 800 lines): the pydantic model of
every request and response body (the OpenAPI document at /openapi.json)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal, Self
from uuid import UUID

import orjson
from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from queue_server import wire
from queue_server.models import NAME_PATTERN, check_utc_offset
from queue_server.services import queue_settings

MAX_JSON_DEPTH = 64
MAX_FENCE = 2**63 - 1


def _check_text(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode (no lone surrogates)") from None
    return value


def check_json(value: Any) -> Any:
    """Payloads and results: bounded depth, storable strings, finite numbers.

    orjson, in C, settles most values at once: it refuses a lone surrogate and an
    integer outside 64 bits; what it writes shows whether a NUL, a NaN (written as
    `null`) or a deep nesting (at most one level per bracket) could be in it. Only
    then, or when it refused, does the walk below look (and name what is wrong).
    """
    try:
        written = orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):
        return _walk(value)
    brackets = written.count(b"[") + written.count(b"{")
    if brackets >= MAX_JSON_DEPTH or b"\\u0000" in written or b"null" in written:
        return _walk(value)
    return value


def _walk(value: Any) -> Any:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ValueError(f"is nested deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(node, str):
            _check_text(node)
        elif isinstance(node, float) and not math.isfinite(node):
            raise ValueError("must not contain NaN or infinite numbers")
        elif isinstance(node, int) and not -(2**63) <= node < 2**64:
            raise ValueError("integers must fit in 64 bits")
        elif isinstance(node, dict):
            for key, child in node.items():
                _check_text(key)
                stack.append((child, depth + 1))
        elif isinstance(node, list):
            stack.extend((child, depth + 1) for child in node)
    return value


Text = Annotated[str, Field(max_length=4096), AfterValidator(_check_text)]
# A failure's traceback, kept in the item and its ledger: at most 16 KiB of UTF-8.
TRACEBACK_MAX_BYTES = 16 * 1024


def _check_traceback(value: str) -> str:
    if len(value.encode("utf-8", errors="surrogatepass")) > TRACEBACK_MAX_BYTES:
        raise ValueError(f"must be at most {TRACEBACK_MAX_BYTES} bytes of UTF-8")
    return _check_text(value)


Traceback = Annotated[str, Field(max_length=TRACEBACK_MAX_BYTES), AfterValidator(_check_traceback)]
Name = Annotated[str, Field(pattern=NAME_PATTERN)]
Json = Annotated[Any, AfterValidator(check_json)]
# Every instant a request gives, in a query or a body: with its zone, and an offset the
# database can read (a wider one, still ISO 8601, would be a 500 where it reaches SQL).
Instant = Annotated[AwareDatetime, AfterValidator(check_utc_offset)]
Fence = Annotated[int, Field(ge=0, le=MAX_FENCE, strict=True)]
LeaseTtl = Annotated[float, Field(ge=1, le=3600, strict=True)]


class Problem(BaseModel):
    type: str
    title: str
    status: int
    detail: str
    code: str
    instance: str | None = None


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


def example(*examples: dict[str, Any]) -> ConfigDict:
    """A request body's config: unknown fields refused, and examples for the OpenAPI document
    (Swagger UI's "Try it out" starts from the first)."""
    return ConfigDict(extra="forbid", json_schema_extra={"examples": list(examples)})


class TenantIn(Body):
    model_config = example(
        {
            "backlog_cap": 10000,
            "default_max_acquisitions": 5,
            "default_lease_ttl": 30,
            "retention": 604800,
        }
    )

    backlog_cap: int = Field(ge=1, le=1_000_000_000, strict=True)
    # Unset: the policy's attempt cap and attempt timeout; above them: 422.
    default_max_acquisitions: int | None = Field(default=None, ge=1, le=100, strict=True)
    default_lease_ttl: LeaseTtl | None = None
    retention: float = Field(
        default=7 * 24 * 3600.0,
        ge=1,
        le=10 * 365 * 24 * 3600,
        strict=True,
        description="Seconds completed and cancelled items are kept after they finished"
        " (default 7 days); then they are deleted with their ledgers.",
    )


TenantOut = wire.Tenant


class TenantPage(BaseModel):
    tenants: list[TenantOut]
    next_cursor: str | None


KeyInfoOut = wire.ApiKeyInfo


class KeysOut(BaseModel):
    keys: list[KeyInfoOut]


class KeyIn(Body):
    model_config = example({"role": "worker", "name": "billing-worker"})

    role: Literal["worker", "operator"]
    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="Shown beside the key's id wherever a ledger names the key that acted.",
    )


KeyOut = wire.ApiKey


class ItemIn(Body):
    model_config = example(
        {"payload": {"to": "ada@example.com", "template": "welcome"}, "priority": 0, "delay": 0}
    )

    payload: Json = None
    priority: int = Field(default=0, ge=-1_000_000, le=1_000_000, strict=True)
    delay: float = Field(default=0, ge=0, le=365 * 24 * 3600, strict=True)
    max_acquisitions: int | None = Field(default=None, ge=1, le=100, strict=True)
    unique_key: str | None = Field(
        default=None,
        pattern=r"^[!-~]{1,255}$",
        description="While an item of the queue with this key is ready or leased, none is"
        " made: the answer is that item (200 for a single enqueue).",
    )
    unique_for: float | None = Field(
        default=None,
        gt=0,
        le=366 * 24 * 3600,
        strict=True,
        description="With `unique_key`: none is made either while an item of the queue with"
        " the key was made within this many seconds, in any state (a report a day).",
    )
    partition_key: str | None = Field(
        default=None,
        pattern=r"^[!-~]{1,255}$",
        description="The partition (a customer, a tenant of yours) a queue's rate limit per"
        " partition key counts this item's leases against.",
    )
    ordering_key: str | None = Field(
        default=None,
        pattern=r"^[!-~]{1,255}$",
        description="Items of the queue with this key are handed out one at a time, in"
        " enqueue order: this one is `waiting` until the one before it completes, is"
        " cancelled or goes to dead letters (the queue's `ordering_dead_letters`).",
    )
    ref: str | None = Field(
        default=None,
        pattern=r"^[!-~]{1,64}$",
        description="A name for this item within the request: a later item of the same"
        " batch names it in its `depends_on` (a graph enqueued at once).",
    )
    depends_on: list[Annotated[str, Field(pattern=r"^[!-~]{1,64}$")]] | None = Field(
        default=None,
        min_length=1,
        max_length=100,
        description="Items this one waits for: ids of items of the tenant (any queue), or the"
        " `ref` of an earlier item of the same batch. It is `waiting` until every one has"
        " completed, then ready in the same transaction as the last.",
    )
    on_dependency_failure: Literal["cancel", "run", "wait"] | None = Field(
        default=None,
        description="With `depends_on`, when a dependency goes to dead letters or is"
        " cancelled: `cancel` this item (the default; its own dependents follow), `run` it"
        " anyway, or `wait` until the dependency is replayed and completes.",
    )


# The most items one callback waits for: its batch's and those it names (`depends_on`).
FAN_IN_MAX = 10_000


class CallbackIn(Body):
    """The item a batch's fan-in runs: it depends on every item of the batch and runs once
    each is finished, completed or not (`on_dependency_failure` `run`)."""

    queue: Name | None = Field(default=None, description="Its queue (default: the batch's).")
    payload: Json = None
    priority: int = Field(default=0, ge=-1_000_000, le=1_000_000, strict=True)
    max_acquisitions: int | None = Field(default=None, ge=1, le=100, strict=True)
    depends_on: list[UUID] | None = Field(
        default=None,
        min_length=1,
        max_length=FAN_IN_MAX,
        description="Items of the tenant enqueued before, which it waits for too: a fan-in"
        f" over more items than one batch holds (at most {FAN_IN_MAX:,} with the batch's).",
    )


class BatchIn(Body):
    model_config = example({"items": [{"payload": {"n": 1}}, {"payload": {"n": 2}, "priority": 5}]})

    items: list[ItemIn] = Field(min_length=1, max_length=500)
    callback: CallbackIn | None = Field(
        default=None,
        description="An item to run once every item of the batch is finished (a fan-in):"
        " `waiting` until then; its worker reads the batch's results and failures with"
        " GET .../items/{item_id}/dependencies.",
    )

    @model_validator(mode="after")
    def _fan_in_bounded(self) -> Self:
        named = len(self.callback.depends_on or ()) if self.callback is not None else 0
        if len(self.items) + named > FAN_IN_MAX:
            raise ValueError(
                f"callback: a fan-in waits for at most {FAN_IN_MAX:,} items; this one would"
                f" wait for {len(self.items) + named:,} ({len(self.items)} in the batch and"
                f" {named} named in callback.depends_on)."
            )
        return self

    def canonical(self) -> dict[str, Any]:
        """`model_dump(mode="json")`, without pydantic's per-field serializer: the request's
        fingerprint (tests/api/test_batch_enqueue.py holds the two equal)."""
        return {
            "items": [
                {
                    "payload": item.payload,
                    "priority": item.priority,
                    "delay": float(item.delay),
                    "max_acquisitions": item.max_acquisitions,
                    "unique_key": item.unique_key,
                    "ordering_key": item.ordering_key,
                    "partition_key": item.partition_key,
                    "unique_for": item.unique_for,
                    "ref": item.ref,
                    "depends_on": item.depends_on,
                    "on_dependency_failure": item.on_dependency_failure,
                }
                for item in self.items
            ],
            "callback": None if self.callback is None else self.callback.model_dump(mode="json"),
        }


ItemOut = wire.Item


class BatchOut(BaseModel):
    items: list[ItemOut]
    callback: ItemOut | None = Field(
        default=None, description="The batch's callback item, when the request had one."
    )


class WorkflowNode(BaseModel):
    item_id: str
    queue: str
    state: str
    depends_on: list[str] = Field(description="Its dependencies among the graph's items.")


class WorkflowOut(BaseModel):
    item_id: str
    nodes: list[WorkflowNode] = Field(
        description="Every item it waits for, directly or not, every item waiting for it,"
        " and itself (at most 200), in id order."
    )
    complete: bool = Field(description="False when the graph has more items than are shown.")


class DependenciesOut(BaseModel):
    items: list[ItemOut] = Field(description="The items depended on, as they are now.")
    next_cursor: str | None
    total: int = Field(description="How many items it depends on in all.")
    waiting_for: int = Field(
        description="While it is `waiting`, how many of them it still waits for (neither"
        " completed nor, under `on_dependency_failure` `run`, failed for good); else 0."
    )


EventOut = wire.LedgerEvent


class LedgerOut(BaseModel):
    item_id: str
    events: list[EventOut]


class AcquireIn(Body):
    model_config = example({"worker": "worker-1", "lease_ttl": 30, "max_items": 10, "wait": 20})

    worker: Name
    lease_ttl: LeaseTtl | None = None
    max_items: int = Field(default=1, ge=1, le=100, strict=True)
    wait: float = Field(default=0, ge=0, le=30, strict=True)


LeaseOut = wire.Lease


class LeasesOut(BaseModel):
    leases: list[LeaseOut]


class HeartbeatIn(Body):
    model_config = example({"worker": "worker-1", "fence": 3, "lease_ttl": 30})

    worker: Name
    fence: Fence
    lease_ttl: LeaseTtl | None = None


HeartbeatOut = wire.Heartbeat


class HeartbeatEntryIn(Body):
    item_id: Annotated[str, Field(max_length=64)]
    fence: Fence


class HeartbeatsIn(Body):
    model_config = example(
        {
            "worker": "worker-1",
            "lease_ttl": 30,
            "leases": [
                {"item_id": "0190f3c2-5b1e-7a44-9c1d-2f6e8a1b3c4d", "fence": 3},
                {"item_id": "0190f3c2-6d2a-7b10-8e4f-1a2b3c4d5e6f", "fence": 1},
            ],
        }
    )

    worker: Name
    lease_ttl: LeaseTtl | None = None
    leases: list[HeartbeatEntryIn] = Field(min_length=1, max_length=500)


class HeartbeatResult(BaseModel):
    item_id: str
    status: int
    fence: int | None = None
    lease_expires_at: datetime | None = None
    lease_deadline_at: datetime | None = None
    problem: Problem | None = None


class HeartbeatsOut(BaseModel):
    extended: int
    results: list[HeartbeatResult]


class CompleteIn(Body):
    model_config = example({"worker": "worker-1", "fence": 3, "result": {"sent": True}})

    worker: Name
    fence: Fence
    result: Json = None


class CompletionIn(Body):
    item_id: Annotated[str, Field(max_length=64)]
    fence: Fence
    result: Json = None


class CompletionsIn(Body):
    model_config = example(
        {
            "worker": "worker-1",
            "completions": [
                {
                    "item_id": "0190f3c2-5b1e-7a44-9c1d-2f6e8a1b3c4d",
                    "fence": 3,
                    "result": {"sent": True},
                }
            ],
        }
    )

    worker: Name
    completions: list[CompletionIn] = Field(min_length=1, max_length=500)


class CompletionResult(BaseModel):
    item_id: str
    status: int
    item: ItemOut | None = None
    problem: Problem | None = None


class CompletionsOut(BaseModel):
    completed: int
    results: list[CompletionResult]


# At most the policy's durable-leased-work backoff cap (checked against the loaded policy).
Delay = Annotated[
    float,
    Field(
        ge=0,
        le=24 * 3600,
        strict=True,
        description="Seconds before the item is due again (at most the policy's backoff cap).",
    ),
]


# Or "backoff": the server computes the delay from the queue's retry settings and the item's
# acquisition count (capped exponential: min(cap, base * 2^(acquisitions - 1)), base 1 s,
# cap the policy's backoff cap; a uniform draw of it with full jitter) and ledgers it.
Backoff = Literal["backoff"]


def delay_seconds(delay: float | str) -> float | None:
    """A request's delay for the services: seconds, or None for "backoff"."""
    return None if delay == "backoff" else float(delay)


class Failure(Body):
    class_: Text = Field(alias="class")
    message: Text = ""
    transient: bool = False
    # What the worker saw: a handler's traceback, a command's last stderr.
    traceback: Traceback | None = None

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class RequeueIn(Body):
    model_config = example(
        {"worker": "worker-1", "fence": 3, "reason": "shutting down"},
        {
            "worker": "worker-1",
            "fence": 3,
            "reason": "the mail provider is slow",
            "delay": "backoff",
        },
    )

    worker: Name
    fence: Fence
    reason: Text = ""
    delay: Delay | Backoff = 0.0
    failure: Failure | None = Field(
        default=None,
        description="What made the worker give the item back, as triage reports it (its"
        " `traceback` at most 16 KiB): kept as the item's `last_failure` and in the ledger.",
    )


class TriageIn(Body):
    model_config = example(
        {
            "worker": "worker-1",
            "fence": 3,
            "failure": {"class": "SMTPTimeout", "message": "no answer in 10 s", "transient": True},
            "decision": "requeue",
        }
    )

    worker: Name
    fence: Fence
    failure: Failure
    decision: Literal["requeue", "quarantine"]
    delay: Delay | Backoff = 0.0


# An approval lasts at most a year: the example expires a week after the process started.
_APPROVAL_EXAMPLE_EXPIRY = (datetime.now(UTC) + timedelta(days=7)).replace(microsecond=0)


class SpendApprovalIn(Body):
    model_config = example(
        {
            "max_concurrency": 8,
            "expires_at": _APPROVAL_EXAMPLE_EXPIRY.isoformat().replace("+00:00", "Z"),
            "reason": "campaign week",
        }
    )

    # The approver is the calling key; a name given here other than its id is refused.
    approved_by: Annotated[Text, Field(min_length=1, max_length=200)] | None = Field(
        default=None,
        description="Deprecated: the approval records the calling key; if given, it must be"
        " that key's id.",
    )
    max_concurrency: int = Field(
        ge=2,
        le=100_000,
        strict=True,
        description="At most the policy's durable-leased-work/concurrency max-approved.",
    )
    expires_at: Instant = Field(description="In the future, at most 365 days ahead.")
    reason: Annotated[Text, Field(min_length=1)]


SpendApprovalOut = wire.SpendApproval
SpendApprovalsOut = wire.SpendApprovals


ConcurrencyOut = wire.Concurrency


# -- items and queues (operators) ----------------------------------------------------

# The orders of GET /items: a key, ascending, or descending with a leading "-".
ItemSort = Literal["created", "-created", "priority", "-priority", "attempts", "-attempts"]
ItemStateName = Literal["waiting", "ready", "leased", "completed", "quarantined", "cancelled"]


class ItemPage(BaseModel):
    items: list[ItemOut]
    next_cursor: str | None


class CancelIn(Body):
    model_config = example({"reason": "the customer withdrew the order"})

    reason: Text = ""
    descendants: bool = Field(
        default=False,
        description="Cancel every item that depends on it too, directly or not, whatever"
        " their `on_dependency_failure` (a workflow stopped as a whole); what is finished"
        " stays as it is.",
    )


class ItemFilterIn(Body):
    """The filter of GET /items, as a body: every field optional."""

    queue: Name | None = None
    state: Literal["waiting", "ready", "leased", "quarantined"] | None = None
    created_after: Instant | None = None
    created_before: Instant | None = None
    payload: Json = Field(
        default=None, description="A JSON document the payload must contain (jsonb `@>`)."
    )


class CancelManyIn(Body):
    model_config = example(
        {
            "filter": {"queue": "emails", "state": "ready", "payload": {"campaign": 7}},
            "reason": "campaign 7 withdrawn",
            "limit": 100,
        }
    )

    filter: ItemFilterIn = Field(default_factory=ItemFilterIn)
    reason: Text = ""
    limit: int = Field(default=100, ge=1, le=1000, strict=True)
    cursor: Annotated[str | None, Field(max_length=512)] = Field(
        default=None, description="`next_cursor` of the previous call: resume after it."
    )


# The most items a bulk retry or delete may name (a page's own bound).
MAX_SELECTED_ITEMS = 1000


class _BulkFilterIn(Body):
    queue: Name | None = None
    created_after: Instant | None = None
    created_before: Instant | None = None
    payload: Json = Field(
        default=None, description="A JSON document the payload must contain (jsonb `@>`)."
    )
    item_ids: list[UUID] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_SELECTED_ITEMS,
        description="Only these items (a selection, at most 1,000): each still has to match"
        " the rest of the filter; the others are left as they are.",
    )


class RetryFilterIn(_BulkFilterIn):
    """Which items a bulk retry covers: one state, and the rest of GET /items's filter."""

    state: Literal["quarantined", "cancelled"]


class DeleteFilterIn(_BulkFilterIn):
    """Which items a bulk delete covers: one finished state, and the rest of the filter."""

    state: Literal["completed", "cancelled"]


class _BulkPageIn(Body):
    limit: int = Field(default=100, ge=1, le=1000, strict=True)
    cursor: Annotated[str | None, Field(max_length=512)] = Field(
        default=None, description="`next_cursor` of the previous call: resume after it."
    )


class RetryManyIn(_BulkPageIn):
    model_config = example({"filter": {"queue": "emails", "state": "quarantined"}, "limit": 100})

    filter: RetryFilterIn


class DeleteManyIn(_BulkPageIn):
    model_config = example({"filter": {"queue": "emails", "state": "completed"}, "limit": 100})

    filter: DeleteFilterIn


class RetryManyOut(BaseModel):
    retried: int
    item_ids: list[str]
    over_cap: int
    backlog_cap: int
    next_cursor: str | None


class DeleteManyOut(BaseModel):
    deleted: int
    item_ids: list[str]
    next_cursor: str | None


class CancelManyOut(BaseModel):
    cancelled: int
    item_ids: list[str]
    next_cursor: str | None


class RetryIn(Body):
    base: float | None = Field(default=None, ge=0, le=24 * 3600, strict=True)
    cap: float | None = Field(default=None, ge=0, le=24 * 3600, strict=True)
    jitter: bool | None = None


class RateLimitIn(Body):
    """At most `limit` leases in any `per` seconds: over the whole queue, or per partition
    key (`partitioned`: an item's `partition_key`; items without one share the key "")."""

    limit: int = Field(ge=1, le=1_000_000, strict=True)
    per: float = Field(gt=0, le=24 * 3600, strict=True)
    partitioned: bool = False


class QueueSettingsIn(Body):
    """The queue's own settings; a field left out (or null) inherits the tenant's default,
    else the policy's. Each is at most the loaded policy's envelope."""

    model_config = example(
        {
            "lease_ttl": 20,
            "deadline": 600,
            "max_acquisitions": 3,
            "retry": {"base": 2, "cap": 120, "jitter": True},
        }
    )

    lease_ttl: LeaseTtl | None = None
    deadline: float | None = Field(default=None, gt=0, le=7 * 86400, strict=True)
    max_acquisitions: int | None = Field(default=None, ge=1, le=100, strict=True)
    retry: RetryIn | None = None
    rate_limit: RateLimitIn | None = Field(
        default=None,
        description="At most `limit` leases in any `per` seconds, across every worker and API"
        " process; null: no rate limit.",
    )
    ordering_dead_letters: Literal["release", "hold"] | None = Field(
        default=None,
        description="When an item with an ordering key goes to dead letters: `release` (the"
        " default) hands out the next item of its key; `hold` keeps the key's next items"
        " waiting until the dead letter is replayed or discarded.",
    )
    fairness: Literal["arrival", "partition_key"] | None = Field(
        default=None,
        description="How the acquire hands out a priority's due items: `arrival` (the"
        " default), the one due longest first; `partition_key`, round-robin between their"
        " partition keys (items without one are one more key), so that a key that floods the"
        " queue does not hold back another key's items.",
    )

    def given(self) -> queue_settings.QueueSettingsIn:
        """The settings as the queue settings service takes them."""
        retry = self.retry or RetryIn()
        return queue_settings.QueueSettingsIn(
            lease_ttl=self.lease_ttl,
            deadline=self.deadline,
            max_acquisitions=self.max_acquisitions,
            retry=queue_settings.RetrySettings(base=retry.base, cap=retry.cap, jitter=retry.jitter),
            ordering_dead_letters=self.ordering_dead_letters,
            fairness=self.fairness,
            rate_limit=(
                None
                if self.rate_limit is None
                else queue_settings.RateLimit(
                    self.rate_limit.limit, self.rate_limit.per, self.rate_limit.partitioned
                )
            ),
        )


QueueSettingsOut = wire.QueueSettings


class ConcurrencyIn(Body):
    """The queue's own concurrency: at most the approved limit (a live spend approval's,
    else the policy's one); null follows the approved limit."""

    model_config = example({"concurrency": 4, "reason": "the mail provider throttles us"})

    concurrency: int | None = Field(
        ge=1,
        le=100_000,
        strict=True,
        description="Leases at once, at most the approved limit; null: the approved limit.",
    )
    reason: Text = ""


class PauseIn(Body):
    model_config = example({"reason": "the mail provider is down"})

    reason: Text = ""


class Window(BaseModel):
    last_minute: int
    last_hour: int
    total: int


class QueueStates(BaseModel):
    ready: int
    leased: int
    completed: int
    quarantined: int
    cancelled: int


class QueueOut(BaseModel):
    queue: str
    paused: bool
    paused_at: datetime | None
    paused_by: str | None
    pause_reason: str | None
    states: QueueStates
    ready: int
    due: int
    leased: int
    quarantined: int
    completed: int
    cancelled: int
    oldest_ready_age: float | None = Field(description="Seconds the oldest due item has waited")
    active_leases: int
    oldest_lease_age: float | None = Field(
        description="Seconds since the oldest active lease began"
    )
    concurrency_limit: int
    open_dead_letters: int
    completions: Window
    failures: Window
    quarantines: int


class QueueEventOut(BaseModel):
    seq: int
    at: datetime
    kind: str
    actor: str
    actor_name: str | None = None
    data: Any


class QueueDetailOut(QueueOut):
    events: list[QueueEventOut]


class LeaseStatusOut(BaseModel):
    queue: str
    item_id: str
    worker: str
    fence: int
    acquired_at: datetime | None
    lease_expires_at: datetime


class StatusOut(BaseModel):
    tenant: str
    backlog: int
    backlog_cap: int
    open_dead_letters: int
    queues: list[QueueOut]
    leases: list[LeaseStatusOut]
