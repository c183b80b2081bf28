"""watchers and the webhook outbox

Revision ID: 0003
Revises: 0001
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0003"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "watchers",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column(
            "watcher_id",
            sa.UUID(as_uuid=False),
            server_default=sa.text("gen_random_uuid()"),
            nullable=False,
        ),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("events", postgresql.ARRAY(sa.Text()), nullable=False),
        sa.Column("queues", postgresql.ARRAY(sa.Text()), nullable=True),
        sa.Column("state", sa.Text(), server_default=sa.text("'active'"), nullable=False),
        sa.Column("secret", sa.Text(), nullable=False),
        sa.Column("previous_secret", sa.Text(), nullable=True),
        sa.Column("previous_secret_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("disabled_reason", sa.Text(), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "state IN ('active', 'paused', 'cancelled', 'disabled')",
            name=op.f("ck_watchers_state_known"),
        ),
        sa.CheckConstraint("cardinality(events) >= 1", name=op.f("ck_watchers_has_events")),
        sa.CheckConstraint(
            "(previous_secret IS NULL) = (previous_secret_expires_at IS NULL)",
            name=op.f("ck_watchers_previous_secret_expires"),
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.tenant_id"],
            name=op.f("fk_watchers_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "watcher_id", name=op.f("pk_watchers")),
    )
    # Every item transition probes this index: a tenant without watchers costs one probe.
    op.create_index(
        "ix_watchers_active",
        "watchers",
        ["tenant_id"],
        unique=False,
        postgresql_where=sa.text("state = 'active'"),
    )
    op.create_table(
        "outbox_deliveries",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column(
            "delivery_id",
            sa.UUID(as_uuid=False),
            server_default=sa.text("gen_random_uuid()"),
            nullable=False,
        ),
        sa.Column("seq", sa.BigInteger(), sa.Identity(always=False), nullable=False),
        sa.Column("watcher_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("delivery_key", sa.Text(), nullable=False),
        sa.Column("event", sa.Text(), nullable=False),
        sa.Column("item_id", sa.UUID(as_uuid=False), nullable=True),
        sa.Column("queue", sa.Text(), nullable=True),
        sa.Column("body", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("state", sa.Text(), server_default=sa.text("'pending'"), nullable=False),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "due_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("claim_token", sa.UUID(as_uuid=False), nullable=True),
        sa.Column("claimed_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_outcome", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column(
            "receipts",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'[]'::jsonb"),
            nullable=False,
        ),
        sa.Column("receipts_omitted", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "state IN ('pending', 'delivered', 'dead', 'cancelled')",
            name=op.f("ck_outbox_deliveries_state_known"),
        ),
        sa.CheckConstraint(
            "attempts >= 0", name=op.f("ck_outbox_deliveries_attempts_not_negative")
        ),
        sa.CheckConstraint(
            "(claim_token IS NULL) = (claimed_until IS NULL)",
            name=op.f("ck_outbox_deliveries_claim_has_expiry"),
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id", "watcher_id"],
            ["watchers.tenant_id", "watchers.watcher_id"],
            name=op.f("fk_outbox_deliveries_tenant_id_watchers"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "delivery_id", name=op.f("pk_outbox_deliveries")),
    )
    op.create_index(
        "uq_outbox_deliveries_delivery_key",
        "outbox_deliveries",
        ["tenant_id", "delivery_key"],
        unique=True,
    )
    # The deliverer's claim scan: only pending rows, in due order.
    op.create_index(
        "ix_outbox_deliveries_due",
        "outbox_deliveries",
        ["due_at", "seq"],
        unique=False,
        postgresql_where=sa.text("state = 'pending'"),
    )
    op.create_index(
        "ix_outbox_deliveries_watcher",
        "outbox_deliveries",
        ["tenant_id", "watcher_id", "seq"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_outbox_deliveries_watcher", table_name="outbox_deliveries")
    op.drop_index(
        "ix_outbox_deliveries_due",
        table_name="outbox_deliveries",
        postgresql_where=sa.text("state = 'pending'"),
    )
    op.drop_index("uq_outbox_deliveries_delivery_key", table_name="outbox_deliveries")
    op.drop_table("outbox_deliveries")
    op.drop_index(
        "ix_watchers_active", table_name="watchers", postgresql_where=sa.text("state = 'active'")
    )
    op.drop_table("watchers")
