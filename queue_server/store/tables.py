"""The schema as SQLAlchemy Core tables: Alembic's target metadata, one catalogue of every
table (longer than 800 lines for that). Tenant first in every key."""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    DateTime,
    Enum,
    Float,
    ForeignKeyConstraint,
    Identity,
    Index,
    Integer,
    Interval,
    MetaData,
    SmallInteger,
    Table,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, OID, UUID
from sqlalchemy.dialects.postgresql import base as postgresql_base
from sqlalchemy.types import UserDefinedType

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

# `waiting` (0031): behind an item of its ordering key that is not finished.
item_state = Enum(
    "waiting",
    "ready",
    "leased",
    "completed",
    "quarantined",
    "cancelled",
    name="item_state",
    metadata=metadata,
)


class Xid8(UserDefinedType[int]):
    """PostgreSQL's 64-bit transaction id (`pg_current_xact_id()`)."""

    cache_ok = True

    def get_col_spec(self, **kw: object) -> str:
        return "xid8"


# So that the schema read back from the database (Alembic's comparison) knows the type.
postgresql_base.ischema_names["xid8"] = Xid8


def _ts(name: str, **kw: object) -> Column[object]:
    return Column(name, DateTime(timezone=True), **kw)  # type: ignore[arg-type]


tenants = Table(
    "tenants",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("backlog_cap", Integer, nullable=False),
    Column("default_max_acquisitions", Integer, nullable=False),
    Column("default_lease_ttl", Interval, nullable=False),
    _ts("created_at", nullable=False, server_default=func.now()),
    _ts("updated_at", nullable=False, server_default=func.now()),
    # Completed and cancelled items older than this (since they finished) are deleted
    # with their ledgers by the retention sweeper.
    Column("retention", Interval, nullable=False, server_default=text("'7 days'")),
    CheckConstraint("backlog_cap >= 1", name="backlog_cap_positive"),
    CheckConstraint("retention >= interval '1 second'", name="retention_positive"),
    CheckConstraint(
        "default_max_acquisitions BETWEEN 1 AND 100", name="default_max_acquisitions_range"
    ),
)

api_keys = Table(
    "api_keys",
    metadata,
    Column("key_id", Text, primary_key=True),
    Column("tenant_id", Text, nullable=True),
    Column("role", Text, nullable=False),
    # sha256 of the secret; the secret itself is shown once and never stored.
    Column("secret_hash", Text, nullable=False),
    _ts("created_at", nullable=False, server_default=func.now()),
    _ts("revoked_at", nullable=True),
    # Shown beside its id where the ledger names the key that acted (0027).
    Column("name", Text, nullable=True),
    ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"], ondelete="CASCADE"),
    CheckConstraint("role IN ('worker', 'operator', 'admin')", name="role_known"),
    CheckConstraint(
        "name IS NULL OR (char_length(name) BETWEEN 1 AND 64 AND name !~ '[[:cntrl:]]')",
        name="name_printable",
    ),
    CheckConstraint("(role = 'admin') = (tenant_id IS NULL)", name="admin_has_no_tenant"),
)

# A stored trace context is W3C Trace Context version 00 (the API drops any other).
TRACEPARENT_W3C = "traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'"
TRACESTATE_BOUNDED = "length(tracestate) <= 512"

work_items = Table(
    "work_items",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("item_id", UUID(as_uuid=False), primary_key=True, server_default=func.gen_random_uuid()),
    Column("queue", Text, nullable=False),
    Column("payload", JSONB, nullable=False),
    Column("priority", Integer, nullable=False, server_default=text("0")),
    Column("state", item_state, nullable=False, server_default=text("'ready'")),
    _ts("available_at", nullable=False, server_default=func.now()),
    Column("fence", BigInteger, nullable=False, server_default=text("0")),
    Column("acquisition_count", Integer, nullable=False, server_default=text("0")),
    Column("max_acquisitions", Integer, nullable=False),
    Column("lease_holder", Text, nullable=True),
    _ts("lease_expires_at", nullable=True),
    # The end of the latest lease's life: its acquisition plus the durable-leased-work
    # deadline (or the queue's shorter one). A heartbeat never extends past it.
    _ts("lease_deadline_at", nullable=True),
    Column("result", JSONB, nullable=True),
    Column("last_failure", JSONB, nullable=True),
    # Number of ledger events written for this item: the next event's seq.
    Column("event_seq", Integer, nullable=False, server_default=text("0")),
    _ts("created_at", nullable=False, server_default=func.now()),
    _ts("updated_at", nullable=False, server_default=func.now()),
    # When the item was last acquired: the age of a lease (kept after it ends).
    _ts("leased_at", nullable=True),
    # The API key that acquired the latest lease: only it acts as the holder (0015; NULL for
    # a lease taken before).
    Column("lease_key_id", Text, nullable=True),
    # The enqueue's W3C trace context (0016): each lease hands it to its worker.
    Column("traceparent", Text, nullable=True),
    Column("tracestate", Text, nullable=True),
    # The transaction that put the row where it is in the acquire's order: made it ready or
    # leased, or moved it (0021: the column's default, and a trigger on update). An acquire
    # resumes the ready and leased indexes from a cursor, and finds a row committed behind it
    # by this id (queue_server/store/cursors.py).
    Column("placed_xid", Xid8(), nullable=True, server_default=text("pg_current_xact_id()")),
    # The tenant's admission shard the item was admitted under (0028): its release gives
    # the room back to that shard.
    Column("admission_shard", SmallInteger, nullable=False, server_default=text("0")),
    # The producer's unique key (0030): while an item of the queue with it is ready or
    # leased, an enqueue with the same key makes nothing and is answered with that item.
    Column("unique_key", Text, nullable=True),
    # The producer's ordering key (0031): the key's items are handed out one at a time, in
    # their order in the key's line (ordering_seq); those behind the active one wait.
    Column("ordering_key", Text, nullable=True),
    Column("ordering_seq", BigInteger, nullable=True),
    # The producer's partition key (0032): a queue's rate limit may hold per key.
    Column("partition_key", Text, nullable=True),
    # Another item depends on it (0035): its finishing transition releases its dependents.
    Column("has_dependents", Boolean, nullable=False, server_default=text("false")),
    # With dependencies (0035): what a dependency's failure for good does to this item.
    Column("on_dependency_failure", Text, nullable=True),
    # With dependencies (0038): how many it waited for when enqueued (or retried); the
    # count after each change since is the newest of its `dependency_tallies`.
    Column("dependencies_pending", Integer, nullable=True),
    ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"], ondelete="CASCADE"),
    CheckConstraint("fence >= 0", name="fence_not_negative"),
    CheckConstraint(
        "unique_key IS NULL OR unique_key ~ '^[!-~]{1,255}$'", name="unique_key_printable"
    ),
    CheckConstraint(
        "ordering_key IS NULL OR ordering_key ~ '^[!-~]{1,255}$'", name="ordering_key_printable"
    ),
    CheckConstraint("(ordering_key IS NULL) = (ordering_seq IS NULL)", name="ordering_placed"),
    CheckConstraint(
        "partition_key IS NULL OR partition_key ~ '^[!-~]{1,255}$'",
        name="partition_key_printable",
    ),
    CheckConstraint(
        "on_dependency_failure IS NULL OR on_dependency_failure IN ('cancel', 'run', 'wait')",
        name="on_dependency_failure_known",
    ),
    CheckConstraint("dependencies_pending >= 0", name="dependencies_pending_not_negative"),
    CheckConstraint(TRACEPARENT_W3C, name="traceparent_w3c"),
    CheckConstraint(TRACESTATE_BOUNDED, name="tracestate_bounded"),
    CheckConstraint(
        "acquisition_count >= 0 AND acquisition_count <= max_acquisitions",
        name="acquisitions_within_budget",
    ),
    CheckConstraint("max_acquisitions BETWEEN 1 AND 100", name="max_acquisitions_range"),
    CheckConstraint(
        "(state = 'leased') = (lease_holder IS NOT NULL) "
        "AND (state = 'leased') = (lease_expires_at IS NOT NULL)",
        name="lease_iff_leased",
    ),
    CheckConstraint("state <> 'completed' OR fence > 0", name="completed_was_leased"),
    CheckConstraint(
        "lease_expires_at IS NULL OR lease_expires_at <= lease_deadline_at",
        name="lease_within_deadline",
    ),
    # Acquire reads this index in acquire order; finished rows are not in it,
    # so its cost does not grow with completed history.
    Index(
        "ix_work_items_ready",
        "tenant_id",
        "queue",
        text("priority DESC"),
        "available_at",
        "item_id",
        postgresql_where=text("state = 'ready'"),
    ),
    # A fair queue's acquire reads each partition key's ready rows from its own place (0040);
    # only a statement that names the key may read it (its predicate: see the migration).
    Index(
        "ix_work_items_ready_keyed",
        "tenant_id",
        "queue",
        text("coalesce(partition_key, '')"),
        text("priority DESC"),
        "available_at",
        "item_id",
        postgresql_where=text("state = 'ready' AND coalesce(partition_key, '') IS NOT NULL"),
        postgresql_include=["partition_key"],
    ),
    # Rows made ready, or leased, since a cursor's snapshot: ids at or past its xmin.
    Index(
        "ix_work_items_ready_placed",
        "placed_xid",
        postgresql_where=text("state = 'ready' AND placed_xid IS NOT NULL"),
    ),
    Index(
        "ix_work_items_leased_placed",
        "placed_xid",
        postgresql_where=text("state = 'leased' AND placed_xid IS NOT NULL"),
    ),
    # Expired-lease takeover and the concurrency count read this one.
    Index(
        "ix_work_items_leased",
        "tenant_id",
        "queue",
        "lease_expires_at",
        postgresql_where=text("state = 'leased'"),
    ),
    Index(
        "ix_work_items_quarantined",
        "tenant_id",
        "queue",
        postgresql_where=text("state = 'quarantined'"),
    ),
    # The item list's pages, per state and queue in creation order (keyset pagination),
    # and the retention sweeper's finished items. Leased rows stay out: every acquire
    # and heartbeat would add an entry, and the leased list sorts the few there are.
    Index(
        "ix_work_items_list",
        "tenant_id",
        "state",
        "queue",
        "created_at",
        "item_id",
        postgresql_where=text("state <> 'leased' AND fence >= 0"),
    ),
    # The same pages sorted by priority or by attempts, then creation (0019).
    Index(
        "ix_work_items_list_priority",
        "tenant_id",
        "state",
        "queue",
        "priority",
        "created_at",
        "item_id",
        postgresql_where=text("state <> 'leased' AND fence >= 0"),
    ),
    Index(
        "ix_work_items_list_attempts",
        "tenant_id",
        "state",
        "queue",
        "acquisition_count",
        "created_at",
        "item_id",
        postgresql_where=text("state <> 'leased' AND fence >= 0"),
    ),
    Index(
        "ix_work_items_unique",
        "tenant_id",
        "queue",
        "unique_key",
        unique=True,
        # Every item not finished (0031: waiting, ready or leased).
        postgresql_where=text(
            "unique_key IS NOT NULL AND state NOT IN"
            " ('completed'::item_state, 'quarantined'::item_state, 'cancelled'::item_state)"
        ),
    ),
    # The items with a unique key by when they were made (0033): unique for a period.
    Index(
        "ix_work_items_unique_made",
        "tenant_id",
        "queue",
        "unique_key",
        "created_at",
        postgresql_where=text("unique_key IS NOT NULL"),
    ),
    # A key's line (0031): its newest item, and the next after a finished one.
    Index(
        "ix_work_items_ordering",
        "tenant_id",
        "queue",
        "ordering_key",
        "ordering_seq",
        postgresql_where=text("ordering_key IS NOT NULL"),
    ),
)

item_events = Table(
    "item_events",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("item_id", UUID(as_uuid=False), primary_key=True),
    Column("seq", Integer, primary_key=True),
    _ts("at", nullable=False, server_default=func.now()),
    Column("kind", Text, nullable=False),
    Column("fence", BigInteger, nullable=False),
    Column("actor", Text, nullable=False),
    Column("data", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    # A backlogged watcher's backfill reads the ledger from an instant on (0014).
    Index("ix_item_events_at", "at", postgresql_using="brin"),
)

idempotency_receipts = Table(
    "idempotency_receipts",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("idempotency_key", Text, primary_key=True),
    Column("fingerprint", Text, nullable=False),
    Column("response_status", Integer, nullable=False),
    # The exact bytes of the original answer, so a replay is identical.
    Column("response_body", Text, nullable=False),
    _ts("created_at", nullable=False, server_default=func.now()),
    _ts("expires_at", nullable=False),
    Index("ix_idempotency_receipts_expires_at", "expires_at"),
)

dead_letters = Table(
    "dead_letters",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column(
        "dead_letter_id",
        UUID(as_uuid=False),
        primary_key=True,
        server_default=func.gen_random_uuid(),
    ),
    Column("kind", Text, nullable=False),
    Column("item_id", UUID(as_uuid=False), nullable=True),
    Column("delivery_id", UUID(as_uuid=False), nullable=True),
    Column("queue", Text, nullable=True),
    Column("reason", Text, nullable=False),
    Column("last_failure", JSONB, nullable=True),
    _ts("created_at", nullable=False, server_default=func.now()),
    _ts("closed_at", nullable=True),
    Column("resolution", Text, nullable=True),
    CheckConstraint("kind IN ('item', 'delivery')", name="kind_known"),
    CheckConstraint("(closed_at IS NULL) = (resolution IS NULL)", name="closed_has_resolution"),
    Index(
        "ix_dead_letters_open",
        "tenant_id",
        "created_at",
        "dead_letter_id",
        postgresql_where=text("closed_at IS NULL"),
    ),
    Index(
        "uq_dead_letters_open_item",
        "tenant_id",
        "item_id",
        unique=True,
        postgresql_where=text("closed_at IS NULL AND kind = 'item'"),
    ),
)

spend_approvals = Table(
    "spend_approvals",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column(
        "approval_id", UUID(as_uuid=False), primary_key=True, server_default=func.gen_random_uuid()
    ),
    Column("queue", Text, nullable=False),
    Column("approved_by", Text, nullable=False),
    Column("max_concurrency", Integer, nullable=False),
    _ts("expires_at", nullable=False),
    Column("reason", Text, nullable=False),
    _ts("created_at", nullable=False, server_default=func.now()),
    # The approving key (0013); NULL on approvals recorded before, whose approved_by is a name.
    Column("approved_by_key_id", Text, nullable=True),
    Column("approved_by_role", Text, nullable=True),
    # A revoked approval raises nothing (0013).
    _ts("revoked_at", nullable=True),
    Column("revoked_by", Text, nullable=True),
    # When the sweeper wrote its `approval-expired` queue event (0029); set at once on one
    # revoked (a revocation is the operator's own act) or expired before 0029.
    _ts("expiry_ledgered_at", nullable=True),
    ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"], ondelete="CASCADE"),
    CheckConstraint("max_concurrency >= 2", name="max_concurrency_above_one"),
    CheckConstraint(
        "(revoked_at IS NULL) = (revoked_by IS NULL)", name="spend_approvals_revoked_has_actor"
    ),
    Index("ix_spend_approvals_queue", "tenant_id", "queue", "expires_at"),
    Index(
        "ix_spend_approvals_unledgered",
        "expires_at",
        postgresql_where=text("expiry_ledgered_at IS NULL"),
    ),
)

# -- confirmed-mutation receipts and artifact verification runs (0002) --------------

# One-shot receipts of confirmed mutations (docs/decisions/operation-class-policy.md,
# Decisions 5-7): claimed `pending` before dispatch, settled once. They outlive the process
# that claimed them.
confirmation_receipts = Table(
    "confirmation_receipts",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("outcome_ref", Text, primary_key=True),
    Column("idempotency_key", Text, nullable=False),
    # Chosen by the claimant: a retry of the same claim (its answer lost) is granted again,
    # while the same identity claimed by anyone else gets the retained receipt.
    Column("claim_token", Text, nullable=True),
    Column("status", Text, nullable=False, server_default=text("'pending'")),
    Column("outcome", JSONB, nullable=True),
    _ts("created_at", nullable=False, server_default=func.now()),
    _ts("settled_at", nullable=True),
    # Set when an operator settled a receipt left pending past the class deadline.
    Column("settled_by", Text, nullable=True),
    Column("settle_reason", Text, nullable=True),
    ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"], ondelete="CASCADE"),
    CheckConstraint("status IN ('pending', 'succeeded', 'failed')", name="status_known"),
    CheckConstraint(
        "(settled_by IS NULL) = (settle_reason IS NULL)"
        " AND (settled_by IS NULL OR status <> 'pending')",
        name="operator_settlement_recorded",
    ),
    # Operators list the stale pending receipts of a tenant, oldest first.
    Index(
        "ix_confirmation_receipts_pending",
        "tenant_id",
        "created_at",
        postgresql_where=text("status = 'pending'"),
    ),
    CheckConstraint(
        "(status = 'pending') = (settled_at IS NULL) AND (status = 'pending') = (outcome IS NULL)",
        name="settled_iff_outcome",
    ),
    # A key claims one outcome reference: the identity is the pair, in both directions.
    Index(
        "uq_confirmation_receipts_tenant_id_idempotency_key",
        "tenant_id",
        "idempotency_key",
        unique=True,
    ),
)

# A run is keyed by (artifact version, verifier version): the same pair is the same run
# while it runs or once complete; a failed or abandoned run leaves its key free again.
verification_runs = Table(
    "verification_runs",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("run_id", UUID(as_uuid=False), primary_key=True),
    Column("artifact_version", Text, nullable=False),
    Column("verifier_version", Text, nullable=False),
    # The declared items, a JSON array of strings: the run-complete marker needs each checkpointed.
    Column("items", JSONB, nullable=False),
    Column("state", Text, nullable=False, server_default=text("'running'")),
    _ts("created_at", nullable=False, server_default=func.now()),
    _ts("completed_at", nullable=True),
    # Start plus the policy's artifact-verification deadline: a run still running then fails.
    _ts("deadline_at", nullable=False),
    # Who ended a run that did not complete (the server at its deadline, or an operator), and why.
    _ts("ended_at", nullable=True),
    Column("ended_by", Text, nullable=True),
    Column("end_reason", Text, nullable=True),
    ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"], ondelete="CASCADE"),
    CheckConstraint("state IN ('running', 'complete', 'failed', 'abandoned')", name="state_known"),
    CheckConstraint("(state = 'complete') = (completed_at IS NOT NULL)", name="complete_has_time"),
    CheckConstraint(
        "(state IN ('failed', 'abandoned')) = (ended_at IS NOT NULL)"
        " AND (ended_at IS NULL) = (ended_by IS NULL)"
        " AND (ended_at IS NULL) = (end_reason IS NULL)",
        name="ended_has_record",
    ),
    CheckConstraint(
        "jsonb_typeof(items) = 'array' AND jsonb_array_length(items) >= 1", name="declares_items"
    ),
    Index(
        "uq_verification_runs_run_key",
        "tenant_id",
        "artifact_version",
        "verifier_version",
        unique=True,
        postgresql_where=text("state IN ('running', 'complete')"),
    ),
    # At most one running run per tenant: verification concurrency is one.
    Index(
        "uq_verification_runs_running",
        "tenant_id",
        unique=True,
        postgresql_where=text("state = 'running'"),
    ),
)

verification_checkpoints = Table(
    "verification_checkpoints",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("run_id", UUID(as_uuid=False), primary_key=True),
    Column("item", Text, primary_key=True),
    Column("result", JSONB, nullable=False),
    _ts("recorded_at", nullable=False, server_default=func.now()),
    ForeignKeyConstraint(
        ["tenant_id", "run_id"],
        ["verification_runs.tenant_id", "verification_runs.run_id"],
        ondelete="CASCADE",
    ),
)

# -- watchers and the webhook outbox (0003) ------------------------------------------

# A tenant's webhook subscription. The secret is a signing key the server must use,
# so it is stored (never logged); after a rotation the previous one also signs until
# `previous_secret_expires_at`.
watchers = Table(
    "watchers",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column(
        "watcher_id", UUID(as_uuid=False), primary_key=True, server_default=func.gen_random_uuid()
    ),
    Column("url", Text, nullable=False),
    Column("events", ARRAY(Text), nullable=False),
    # NULL: every queue.
    Column("queues", ARRAY(Text), nullable=True),
    Column("state", Text, nullable=False, server_default=text("'active'")),
    Column("secret", Text, nullable=False),
    Column("previous_secret", Text, nullable=True),
    _ts("previous_secret_expires_at", nullable=True),
    # Why the server disabled it (a receiver answering 410 Gone).
    Column("disabled_reason", Text, nullable=True),
    _ts("created_at", nullable=False, server_default=func.now()),
    _ts("updated_at", nullable=False, server_default=func.now()),
    # Since when it is paused (0006): resuming moves its deliveries' deadlines on by the pause.
    _ts("paused_at", nullable=True),
    # Past its outbox cap (0014): since when, and the earliest ledger instant whose events
    # it has no rows for; the deliverer's backfill writes them and clears both.
    _ts("backlogged_at", nullable=True),
    _ts("backlog_from", nullable=True),
    ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"], ondelete="CASCADE"),
    CheckConstraint("state IN ('active', 'paused', 'cancelled', 'disabled')", name="state_known"),
    CheckConstraint("(state = 'paused') = (paused_at IS NOT NULL)", name="paused_since"),
    CheckConstraint("(backlogged_at IS NULL) = (backlog_from IS NULL)", name="backlog_from_known"),
    CheckConstraint("cardinality(events) >= 1", name="has_events"),
    CheckConstraint(
        "(previous_secret IS NULL) = (previous_secret_expires_at IS NULL)",
        name="previous_secret_expires",
    ),
    # Every item transition joins this index: a tenant without watchers costs one probe.
    Index("ix_watchers_active", "tenant_id", postgresql_where=text("state = 'active'")),
)

# One row per (transition, matching watcher), written by the transition's own statement.
# `delivery_key` is the `webhook-id` of every attempt, replays included.
outbox_deliveries = Table(
    "outbox_deliveries",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column(
        "delivery_id", UUID(as_uuid=False), primary_key=True, server_default=func.gen_random_uuid()
    ),
    # Creation order: rows of one watcher are sent in this order.
    Column("seq", BigInteger, Identity(always=False), nullable=False),
    Column("watcher_id", UUID(as_uuid=False), nullable=False),
    Column("delivery_key", Text, nullable=False),
    Column("event", Text, nullable=False),
    Column("item_id", UUID(as_uuid=False), nullable=True),
    Column("queue", Text, nullable=True),
    Column("body", JSONB, nullable=False),
    Column("state", Text, nullable=False, server_default=text("'pending'")),
    Column("attempts", Integer, nullable=False, server_default=text("0")),
    # The persisted schedule: when the next attempt is due (NULL once none is left).
    _ts("next_attempt_at", nullable=True),
    # When a deliverer may claim the row: the schedule, or a lost claim's expiry.
    _ts("due_at", nullable=False, server_default=func.now()),
    Column("claim_token", UUID(as_uuid=False), nullable=True),
    _ts("claimed_until", nullable=True),
    _ts("last_attempt_at", nullable=True),
    Column("last_outcome", JSONB, nullable=True),
    # Dispatch receipts of every attempt, oldest first, bounded; overflow is counted.
    Column("receipts", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    Column("receipts_omitted", Integer, nullable=False, server_default=text("0")),
    _ts("created_at", nullable=False, server_default=func.now()),
    _ts("updated_at", nullable=False, server_default=func.now()),
    _ts("delivered_at", nullable=True),
    # The delivery's deadline counts from here (0006): its event, moved on by the time its
    # watcher spent paused, restarted by a replay.
    _ts("deadline_from", nullable=False, server_default=func.statement_timestamp()),
    # Written from the ledger by a backfill after its watcher was backlogged (0014).
    Column("backfilled", Boolean, nullable=False, server_default=text("false")),
    ForeignKeyConstraint(
        ["tenant_id", "watcher_id"],
        ["watchers.tenant_id", "watchers.watcher_id"],
        ondelete="CASCADE",
    ),
    CheckConstraint("state IN ('pending', 'delivered', 'dead', 'cancelled')", name="state_known"),
    CheckConstraint("attempts >= 0", name="attempts_not_negative"),
    CheckConstraint("(claim_token IS NULL) = (claimed_until IS NULL)", name="claim_has_expiry"),
    Index("uq_outbox_deliveries_delivery_key", "tenant_id", "delivery_key", unique=True),
    # The deliverer's claim scan: only pending rows, in due order.
    Index(
        "ix_outbox_deliveries_due",
        "due_at",
        "seq",
        postgresql_where=text("state = 'pending'"),
    ),
    Index("ix_outbox_deliveries_watcher", "tenant_id", "watcher_id", "seq"),
    # The outbox cap's count of a watcher's pending rows (0014).
    Index(
        "ix_outbox_deliveries_watcher_pending",
        "tenant_id",
        "watcher_id",
        postgresql_where=text("state = 'pending'"),
    ),
    # The deliverer's deadline sweep: pending rows by the instant their deadline counts from.
    Index(
        "ix_outbox_deliveries_deadline",
        "deadline_from",
        postgresql_where=text("state = 'pending'"),
    ),
    # The deliveries in flight (claimed, not yet recorded), counted by every claim (0007).
    Index(
        "ix_outbox_deliveries_in_flight",
        "claimed_until",
        postgresql_where=text("state = 'pending' AND claim_token IS NOT NULL"),
    ),
)

# -- schedules (0005) -----------------------------------------------------------------

# A tenant's periodic enqueue. `next_tick_at` is the cursor: every tick before it is
# settled (enqueued, or dropped by the catch-up rule); `due_at` is when a scheduler
# loop should look at it next (the cursor, or a later retry after a refusal at the cap).
schedules = Table(
    "schedules",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("name", Text, primary_key=True),
    # The schedule's identity in its items' ids: a schedule deleted and created again
    # under the same name is another schedule.
    Column("schedule_id", UUID(as_uuid=False), nullable=False),
    Column("queue", Text, nullable=False),
    Column("payload", JSONB, nullable=False),
    Column("priority", Integer, nullable=False, server_default=text("0")),
    Column("max_acquisitions", Integer, nullable=True),
    Column("cron", Text, nullable=True),
    Column("every_seconds", Integer, nullable=True),
    Column("timezone", Text, nullable=False, server_default=text("'UTC'")),
    Column("catch_up", Text, nullable=False),
    Column("catch_up_limit", Integer, nullable=False),
    Column("paused", Boolean, nullable=False, server_default=text("false")),
    _ts("next_tick_at", nullable=False),
    _ts("due_at", nullable=False),
    Column("fires", BigInteger, nullable=False, server_default=text("0")),
    Column("refusals", BigInteger, nullable=False, server_default=text("0")),
    Column("skipped", BigInteger, nullable=False, server_default=text("0")),
    _ts("created_at", nullable=False, server_default=func.now()),
    _ts("updated_at", nullable=False, server_default=func.now()),
    # The trace context of the request that created or last changed the schedule (0016):
    # each fire's item carries it.
    Column("traceparent", Text, nullable=True),
    Column("tracestate", Text, nullable=True),
    ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"], ondelete="CASCADE"),
    CheckConstraint("(cron IS NULL) <> (every_seconds IS NULL)", name="cron_or_every"),
    CheckConstraint(TRACEPARENT_W3C, name="traceparent_w3c"),
    CheckConstraint(TRACESTATE_BOUNDED, name="tracestate_bounded"),
    CheckConstraint("every_seconds >= 1", name="every_positive"),
    CheckConstraint("catch_up IN ('skip', 'latest', 'all-bounded')", name="catch_up_known"),
    CheckConstraint("catch_up_limit BETWEEN 1 AND 1000", name="catch_up_limit_range"),
    CheckConstraint("max_acquisitions BETWEEN 1 AND 100", name="max_acquisitions_range"),
    Index("uq_schedules_schedule_id", "tenant_id", "schedule_id", unique=True),
    # The scheduler loops' scan: schedules that run, in due order.
    Index("ix_schedules_due", "due_at", postgresql_where=text("NOT paused")),
)

# What became of each tick a loop acted on (and of each manual trigger): enqueued with
# its item, refused at the backlog cap (retried per the catch-up rule), or dropped after
# a refusal. The newest rows of each schedule are kept (`store.schedules.KEEP_FIRES`).
schedule_fires = Table(
    "schedule_fires",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("schedule_id", UUID(as_uuid=False), primary_key=True),
    _ts("tick_at", primary_key=True),
    Column("kind", Text, primary_key=True),
    Column("outcome", Text, nullable=False),
    Column("item_id", UUID(as_uuid=False), nullable=True),
    Column("attempts", Integer, nullable=False, server_default=text("1")),
    # When the outcome was decided (the database clock).
    _ts("at", nullable=False),
    Column("detail", JSONB, nullable=True),
    ForeignKeyConstraint(
        ["tenant_id", "schedule_id"],
        ["schedules.tenant_id", "schedules.schedule_id"],
        ondelete="CASCADE",
    ),
    CheckConstraint("kind IN ('tick', 'trigger')", name="kind_known"),
    CheckConstraint("outcome IN ('enqueued', 'refused', 'dropped')", name="outcome_known"),
    CheckConstraint("(outcome = 'enqueued') = (item_id IS NOT NULL)", name="item_iff_enqueued"),
)


# -- queues: pause, counters of finished work, and their samples (0008) ----------------

# A queue's own settings; a row exists once an operator paused (or resumed) the queue.
queues = Table(
    "queues",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("queue", Text, primary_key=True),
    _ts("paused_at", nullable=True),
    Column("paused_by", Text, nullable=True),
    Column("pause_reason", Text, nullable=True),
    # Number of queue ledger events written: the next event's seq.
    Column("event_seq", Integer, nullable=False, server_default=text("0")),
    _ts("updated_at", nullable=False, server_default=func.now()),
    # Its own settings (0013), each at most the loaded policy's; NULL: inherited.
    Column("lease_ttl", Interval, nullable=True),
    Column("deadline", Interval, nullable=True),
    Column("max_acquisitions", Integer, nullable=True),
    Column("retry_base", Float, nullable=True),
    Column("retry_cap", Float, nullable=True),
    Column("retry_jitter", Boolean, nullable=True),
    _ts("settings_updated_at", nullable=True),
    Column("settings_updated_by", Text, nullable=True),
    # The operator's concurrency (0029), at most the approved limit; NULL: the approved limit.
    Column("concurrency", Integer, nullable=True),
    # Whether a dead letter lets the next item of its ordering key go (`release`) or holds
    # the key until it is replayed or discarded (`hold`): 0031.
    Column("ordering_dead_letters", Text, nullable=False, server_default=text("'release'::text")),
    # At most rate_limit leases in any rate_interval, over the queue or per partition key
    # (0032); NULL: no rate limit.
    Column("rate_limit", Integer, nullable=True),
    Column("rate_interval", Interval, nullable=True),
    Column("rate_partitioned", Boolean, nullable=False, server_default=text("false")),
    # How the acquire orders a priority's due items (0040): by when each became due
    # (`arrival`), or round-robin between their partition keys (`partition_key`).
    Column("fairness", Text, nullable=False, server_default=text("'arrival'::text")),
    ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"], ondelete="CASCADE"),
    CheckConstraint("(paused_at IS NULL) = (paused_by IS NULL)", name="paused_has_actor"),
    CheckConstraint(
        "ordering_dead_letters IN ('release', 'hold')", name="ordering_dead_letters_known"
    ),
    CheckConstraint(
        "(rate_limit IS NULL) = (rate_interval IS NULL)"
        " AND (rate_limit IS NULL OR rate_limit >= 1)"
        " AND (rate_interval IS NULL OR rate_interval > interval '0')",
        name="rate_limit_given_whole",
    ),
    CheckConstraint("concurrency IS NULL OR concurrency >= 1", name="concurrency_positive"),
    CheckConstraint("fairness IN ('arrival', 'partition_key')", name="fairness_known"),
    CheckConstraint(
        "(lease_ttl IS NULL OR lease_ttl > interval '0')"
        " AND (deadline IS NULL OR deadline > interval '0')"
        " AND (max_acquisitions IS NULL OR max_acquisitions >= 1)"
        " AND (retry_base IS NULL OR retry_base >= 0)"
        " AND (retry_cap IS NULL OR retry_cap >= 0)",
        name="queue_settings_positive",
    ),
)

# The queue's ledger: who paused or resumed it, when and why.
queue_events = Table(
    "queue_events",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("queue", Text, primary_key=True),
    Column("seq", Integer, primary_key=True),
    _ts("at", nullable=False),
    Column("kind", Text, nullable=False),
    Column("actor", Text, nullable=False),
    Column("data", JSONB, nullable=False, server_default=text("'{}'::jsonb")),
    ForeignKeyConstraint(
        ["tenant_id", "queue"], ["queues.tenant_id", "queues.queue"], ondelete="CASCADE"
    ),
)


def _count(name: str) -> Column[int]:
    return Column(name, BigInteger, nullable=False, server_default=text("0"))


# What each counter counts, per (tenant, queue): items that entered the backlog (enqueued,
# replayed, retried) and that left it (completed, quarantined, cancelled from it); those
# completed, failed (triage, either decision), quarantined (by triage or past their budget)
# and cancelled; finished items deleted (by the retention sweeper or an operator); and the
# completions whose lease start is known with the sum of their acquire-to-complete times in
# milliseconds (0018). Backlog = admitted - released; completed now = completed -
# purged_completed, cancelled now = cancelled - purged_cancelled.
COUNTS = (
    "admitted",
    "released",
    "completed",
    "failed",
    "quarantined",
    "cancelled",
    "purged_completed",
    "purged_cancelled",
    "timed_completions",
    "completion_ms",
)

# Append-only (0023): each transition's statement inserts one row per (tenant, queue) it
# touched and nothing updates one, so no row grows a version chain that a held snapshot
# keeps from being pruned. `xid` is the writing transaction's id: the fold
# (store/counters.py) sums the deltas of every ended transaction into a base and deletes
# them; readers add the deltas at or above the base's as_of_xid (the view `counter_totals`).
counter_deltas = Table(
    "counter_deltas",
    metadata,
    Column("tenant_id", Text, nullable=False),
    Column("queue", Text, nullable=False),
    Column("xid", Xid8(), nullable=False, server_default=text("pg_current_xact_id()")),
    # The admission shard the admitted and released counts are of (0028).
    Column("shard", SmallInteger, nullable=False, server_default=text("0")),
    *(_count(name) for name in COUNTS),
    # No foreign key to the tenant (a completion does not lock its row for the check):
    # deleting a tenant deletes its deltas, and the fold drops any of a tenant gone.
    # A tenant's deltas since the last fold: its figures, its backlog (the admission).
    Index("ix_counter_deltas_tenant_id_xid", "tenant_id", "xid"),
    # Everyone's since the last fold: a scrape, the sampler, the fold itself.
    Index("ix_counter_deltas_xid", "xid"),
)

# The leases of rate-limited queues (0032), appended by each acquire that made some: the
# room left is the limit less the rows of the last interval, a range of the window index.
# No key and no foreign key (an acquire locks nothing for its row); the sweeper deletes
# rows older than the longest interval.
rate_grants = Table(
    "rate_grants",
    metadata,
    Column("tenant_id", Text, nullable=False),
    Column("queue", Text, nullable=False),
    Column("partition_key", Text, nullable=False),  # '' for the whole queue
    _ts("granted_at", nullable=False),
    Column("n", Integer, nullable=False),
    Index("ix_rate_grants_window", "tenant_id", "queue", "partition_key", "granted_at"),
    Index("ix_rate_grants_granted_at", "granted_at"),
)

# Who waits for whom (0035): item `item_id` is waiting until `depends_on` completes. Written
# once at enqueue, never updated; a finishing dependency finds its dependents by its id.
item_dependencies = Table(
    "item_dependencies",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("item_id", UUID(as_uuid=False), primary_key=True),
    Column("depends_on", UUID(as_uuid=False), primary_key=True),
    ForeignKeyConstraint(
        ["tenant_id", "item_id"],
        ["work_items.tenant_id", "work_items.item_id"],
        name="fk_item_dependencies_item",
        ondelete="CASCADE",
    ),
    ForeignKeyConstraint(
        ["tenant_id", "depends_on"],
        ["work_items.tenant_id", "work_items.item_id"],
        name="fk_item_dependencies_depends_on",
        ondelete="CASCADE",
    ),
    Index("ix_item_dependencies_depends_on", "tenant_id", "depends_on"),
)

# A waiting item's count of the dependencies it still waits for (0038), after each change:
# appended by the trigger on its dependencies (the newest row is the count; none, the one
# made at enqueue, `work_items.dependencies_pending`), never updated; a retry of the item
# deletes its rows and counts again. `seq` is from one sequence, rising across retries.
dependency_tallies = Table(
    "dependency_tallies",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("item_id", UUID(as_uuid=False), primary_key=True),
    Column("seq", BigInteger, primary_key=True),
    Column("pending", Integer, nullable=False),
    Column("dependency", UUID(as_uuid=False), nullable=False),
    ForeignKeyConstraint(
        ["tenant_id", "item_id"],
        ["work_items.tenant_id", "work_items.item_id"],
        name="fk_dependency_tallies_item",
        ondelete="CASCADE",
    ),
    CheckConstraint("pending > 0", name="pending_positive"),
)

# The totals as of a fold: every delta of a transaction with an id below `as_of_xid` is
# summed here. A fold inserts a whole new set and deletes the one before; never updated.
counter_bases = Table(
    "counter_bases",
    metadata,
    Column("as_of_xid", Xid8(), primary_key=True),
    Column("tenant_id", Text, primary_key=True),
    Column("queue", Text, primary_key=True),
    *(_count(name) for name in COUNTS),
    _ts("folded_at", nullable=False, server_default=func.now()),
    Column("shard", SmallInteger, primary_key=True, server_default=text("0")),
    ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"], ondelete="CASCADE"),
)

# The backlog cap in shards (0028): shard s of a tenant with cap C holds ceil((C - s) / W)
# of it, W = least(32, C). An admission locks the shards it is charged to (FOR NO KEY
# UPDATE, SKIP LOCKED: queue_server.admission_shards) until its transaction ends; a row is
# a lock and nothing else, never updated. Made for every tenant by a trigger on `tenants`.
admission_shards = Table(
    "admission_shards",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("shard", SmallInteger, primary_key=True),
    ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"], ondelete="CASCADE"),
)

# The counters' totals as the sweeper sampled them (a row when they changed), so that
# completions and failures over the last minute and hour are two index probes per queue.
queue_samples = Table(
    "queue_samples",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("queue", Text, primary_key=True),
    _ts("sampled_at", primary_key=True),
    Column("completed", BigInteger, nullable=False),
    Column("failed", BigInteger, nullable=False),
    # The counters' latency totals, the ready items and the oldest due one's
    # `available_at` at the sample (0018): the console's depth, age and latency charts.
    Column("timed_completions", BigInteger, nullable=False, server_default=text("0")),
    Column("completion_ms", BigInteger, nullable=False, server_default=text("0")),
    Column("ready", BigInteger, nullable=False, server_default=text("0")),
    _ts("oldest_ready_at", nullable=True),
    ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"], ondelete="CASCADE"),
    Index("ix_queue_samples_sampled_at", "sampled_at"),
)

# The day's charts: each queue's last sample of each 15-minute bucket (copied by the
# sweeper while the samples are still kept), for 25 hours (0018).
queue_day_samples = Table(
    "queue_day_samples",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("queue", Text, primary_key=True),
    _ts("sampled_at", primary_key=True),
    Column("completed", BigInteger, nullable=False),
    Column("failed", BigInteger, nullable=False),
    Column("timed_completions", BigInteger, nullable=False),
    Column("completion_ms", BigInteger, nullable=False),
    Column("ready", BigInteger, nullable=False),
    _ts("oldest_ready_at", nullable=True),
    ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"], ondelete="CASCADE"),
    Index("ix_queue_day_samples_sampled_at", "sampled_at"),
)


# -- every reliability policy the server has run under (0013) ----------------------------

# Every policy version the server has started under, with its digest: the first and last
# start under it and how many starts. A changed document is a version of its own.
policy_versions = Table(
    "policy_versions",
    metadata,
    Column("version", Text, primary_key=True),
    Column("sha256", Text, primary_key=True),
    Column("source", Text, nullable=False),
    Column("document", JSONB, nullable=False),
    _ts("first_loaded_at", nullable=False, server_default=func.now()),
    _ts("last_loaded_at", nullable=False, server_default=func.now()),
    Column("loads", BigInteger, nullable=False, server_default=text("1")),
    # Published by an admin (0024): who, why and when; activated: the last activated is what
    # a server without --policy runs under.
    Column("published_by", Text),
    Column("reason", Text),
    _ts("published_at"),
    _ts("activated_at"),
    CheckConstraint("sha256 ~ '^[0-9a-f]{64}$'", name="sha256"),
    CheckConstraint(
        "(published_at IS NULL) = (published_by IS NULL AND reason IS NULL)",
        name="published_with_reason",
    ),
    # Content-addressed (0024): a version names one document.
    UniqueConstraint("version"),
)


# -- console sessions (0015) ----------------------------------------------------------------

# A signed-in console: the cookie carries a random id, its sha256 is kept here (never the
# key). Sign-out or expiry ends it for every API process at once.
console_sessions = Table(
    "console_sessions",
    metadata,
    Column("session_hash", Text, primary_key=True),
    Column("key_id", Text, nullable=False, index=True),
    _ts("created_at", nullable=False, server_default=func.now()),
    _ts("expires_at", nullable=False),
    _ts("ended_at", nullable=True),
    ForeignKeyConstraint(["key_id"], ["api_keys.key_id"], ondelete="CASCADE"),
    CheckConstraint("expires_at > created_at", name="expire_later"),
)


# -- enqueue inside an application's transaction (0017) --------------------------------------

# Which tenants a database role may enqueue for through queue_server.enqueue (the role is
# also a member of queue_server_enqueuer). By oid: a renamed role keeps its grants, a
# dropped one matches nothing; the name is kept for the listing.
enqueue_grants = Table(
    "enqueue_grants",
    metadata,
    Column("tenant_id", Text, primary_key=True),
    Column("role_oid", OID, primary_key=True),
    Column("role_name", Text, nullable=False),
    _ts("granted_at", nullable=False, server_default=func.now()),
    ForeignKeyConstraint(["tenant_id"], ["tenants.tenant_id"], ondelete="CASCADE"),
)

# One row: the loaded policy's ceilings that queue_server.enqueue applies (the server
# writes its own at each start) and how long its idempotency receipts are kept.
enqueue_envelope = Table(
    "enqueue_envelope",
    metadata,
    Column("singleton", Boolean, primary_key=True, server_default=text("true")),
    Column("policy_version", Text, nullable=False),
    Column("attempt_cap", Integer, nullable=False),
    Column("backlog_cap", BigInteger, nullable=False),
    Column("receipt_retention", Interval, nullable=False),
    _ts("updated_at", nullable=False, server_default=func.now()),
    CheckConstraint("singleton", name="one_row"),
)


# -- notifications that name no tenant (0022) ------------------------------------------------

# One row: the installation's secret, read by the tables' owner only. The ready channel's
# payload is a hash of it with the tenant and queue (queue_server.ready_tag), so that a role
# listening on the channel learns nothing of any tenant's queues.
installation_secret = Table(
    "installation_secret",
    metadata,
    Column("singleton", Boolean, primary_key=True, server_default=text("true")),
    Column(
        "secret",
        Text,
        nullable=False,
        server_default=text("gen_random_uuid()::text || gen_random_uuid()::text"),
    ),
    CheckConstraint("singleton", name="one_row"),
)
