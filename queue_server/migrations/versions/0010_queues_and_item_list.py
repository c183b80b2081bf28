"""queues: pause and its ledger, counters of finished work and their samples; the item list index

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _ts(name: str, **kw: object) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), **kw)  # type: ignore[arg-type]


def _counter(name: str) -> sa.Column[object]:
    return sa.Column(name, sa.BigInteger(), server_default=sa.text("0"), nullable=False)


def upgrade() -> None:
    op.add_column("work_items", _ts("leased_at", nullable=True))
    op.create_table(
        "queues",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        _ts("paused_at", nullable=True),
        sa.Column("paused_by", sa.Text(), nullable=True),
        sa.Column("pause_reason", sa.Text(), nullable=True),
        sa.Column("event_seq", sa.Integer(), server_default=sa.text("0"), nullable=False),
        _ts("updated_at", server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(
            "(paused_at IS NULL) = (paused_by IS NULL)", name=op.f("ck_queues_paused_has_actor")
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.tenant_id"],
            name=op.f("fk_queues_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "queue", name=op.f("pk_queues")),
    )
    op.create_table(
        "queue_events",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        _ts("at", nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column(
            "data",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id", "queue"],
            ["queues.tenant_id", "queues.queue"],
            name=op.f("fk_queue_events_tenant_id_queues"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "queue", "seq", name=op.f("pk_queue_events")),
    )
    op.create_table(
        "queue_counters",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("shard", sa.Integer(), nullable=False),
        _counter("completed"),
        _counter("failed"),
        _counter("quarantined"),
        _counter("cancelled"),
        _counter("purged_completed"),
        _counter("purged_cancelled"),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.tenant_id"],
            name=op.f("fk_queue_counters_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "queue", "shard", name=op.f("pk_queue_counters")),
    )
    op.create_table(
        "queue_samples",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        _ts("sampled_at", nullable=False),
        sa.Column("completed", sa.BigInteger(), nullable=False),
        sa.Column("failed", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.tenant_id"],
            name=op.f("fk_queue_samples_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "queue", "sampled_at", name=op.f("pk_queue_samples")),
    )
    op.create_index(
        op.f("ix_queue_samples_sampled_at"), "queue_samples", ["sampled_at"], unique=False
    )
    # The counters start from the history there is: finished items by queue, and the
    # failures and quarantines their ledgers recorded. One pass, at upgrade only.
    op.execute(
        """
INSERT INTO queue_counters (tenant_id, queue, shard, completed, failed, quarantined, cancelled)
SELECT w.tenant_id, w.queue, 0,
       count(*) FILTER (WHERE w.state = 'completed'),
       coalesce(sum(e.failed), 0), coalesce(sum(e.quarantined), 0),
       count(*) FILTER (WHERE w.state = 'cancelled')
FROM work_items w
LEFT JOIN LATERAL (
    SELECT count(*) FILTER (WHERE kind = 'triaged') AS failed,
           count(*) FILTER (WHERE kind = 'quarantined'
                            OR (kind = 'triaged' AND data->>'decision' = 'quarantine'))
               AS quarantined
    FROM item_events ev WHERE ev.tenant_id = w.tenant_id AND ev.item_id = w.item_id
) e ON true
GROUP BY w.tenant_id, w.queue
"""
    )
    # So that this history does not count as the last hour's work.
    op.execute(
        "INSERT INTO queue_samples (tenant_id, queue, sampled_at, completed, failed)"
        " SELECT tenant_id, queue, now(), completed, failed FROM queue_counters"
    )
    # Built without blocking writes to work_items (outside the migration's transaction).
    with op.get_context().autocommit_block():
        op.create_index(
            op.f("ix_work_items_list"),
            "work_items",
            ["tenant_id", "state", "queue", "created_at", "item_id"],
            unique=False,
            postgresql_where=sa.text("state <> 'leased'"),
            postgresql_concurrently=True,
            if_not_exists=True,
        )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        op.drop_index(
            op.f("ix_work_items_list"),
            table_name="work_items",
            postgresql_concurrently=True,
            if_exists=True,
        )
    op.drop_index(op.f("ix_queue_samples_sampled_at"), table_name="queue_samples")
    op.drop_table("queue_samples")
    op.drop_table("queue_counters")
    op.drop_table("queue_events")
    op.drop_table("queues")
    op.drop_column("work_items", "leased_at")
