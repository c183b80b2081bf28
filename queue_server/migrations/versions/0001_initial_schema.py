"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "dead_letters",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column(
            "dead_letter_id",
            sa.UUID(as_uuid=False),
            server_default=sa.text("gen_random_uuid()"),
            nullable=False,
        ),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("item_id", sa.UUID(as_uuid=False), nullable=True),
        sa.Column("delivery_id", sa.UUID(as_uuid=False), nullable=True),
        sa.Column("queue", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("last_failure", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("resolution", sa.Text(), nullable=True),
        sa.CheckConstraint("kind IN ('item', 'delivery')", name=op.f("ck_dead_letters_kind_known")),
        sa.CheckConstraint(
            "(closed_at IS NULL) = (resolution IS NULL)",
            name=op.f("ck_dead_letters_closed_has_resolution"),
        ),
        sa.PrimaryKeyConstraint("tenant_id", "dead_letter_id", name=op.f("pk_dead_letters")),
    )
    op.create_index(
        "ix_dead_letters_open",
        "dead_letters",
        ["tenant_id", "created_at", "dead_letter_id"],
        unique=False,
        postgresql_where=sa.text("closed_at IS NULL"),
    )
    op.create_index(
        "uq_dead_letters_open_item",
        "dead_letters",
        ["tenant_id", "item_id"],
        unique=True,
        postgresql_where=sa.text("closed_at IS NULL AND kind = 'item'"),
    )
    op.create_table(
        "idempotency_receipts",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("idempotency_key", sa.Text(), nullable=False),
        sa.Column("fingerprint", sa.Text(), nullable=False),
        sa.Column("response_status", sa.Integer(), nullable=False),
        sa.Column("response_body", sa.Text(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint(
            "tenant_id", "idempotency_key", name=op.f("pk_idempotency_receipts")
        ),
    )
    op.create_index(
        "ix_idempotency_receipts_expires_at", "idempotency_receipts", ["expires_at"], unique=False
    )
    op.create_table(
        "item_events",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("item_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column(
            "at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
        ),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("fence", sa.BigInteger(), nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column(
            "data",
            postgresql.JSONB(astext_type=sa.Text()),
            server_default=sa.text("'{}'::jsonb"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("tenant_id", "item_id", "seq", name=op.f("pk_item_events")),
    )
    op.create_table(
        "tenants",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("backlog_cap", sa.Integer(), nullable=False),
        sa.Column("default_max_acquisitions", sa.Integer(), nullable=False),
        sa.Column("default_lease_ttl", sa.Interval(), nullable=False),
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
        sa.CheckConstraint("backlog_cap >= 1", name=op.f("ck_tenants_backlog_cap_positive")),
        sa.CheckConstraint(
            "default_max_acquisitions BETWEEN 1 AND 100",
            name=op.f("ck_tenants_default_max_acquisitions_range"),
        ),
        sa.PrimaryKeyConstraint("tenant_id", name=op.f("pk_tenants")),
    )
    op.create_table(
        "api_keys",
        sa.Column("key_id", sa.Text(), nullable=False),
        sa.Column("tenant_id", sa.Text(), nullable=True),
        sa.Column("role", sa.Text(), nullable=False),
        sa.Column("secret_hash", sa.Text(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "(role = 'admin') = (tenant_id IS NULL)", name=op.f("ck_api_keys_admin_has_no_tenant")
        ),
        sa.CheckConstraint(
            "role IN ('worker', 'operator', 'admin')", name=op.f("ck_api_keys_role_known")
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.tenant_id"],
            name=op.f("fk_api_keys_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("key_id", name=op.f("pk_api_keys")),
    )
    op.create_table(
        "spend_approvals",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column(
            "approval_id",
            sa.UUID(as_uuid=False),
            server_default=sa.text("gen_random_uuid()"),
            nullable=False,
        ),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("approved_by", sa.Text(), nullable=False),
        sa.Column("max_concurrency", sa.Integer(), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column(
            "created_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "max_concurrency >= 2", name=op.f("ck_spend_approvals_max_concurrency_above_one")
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.tenant_id"],
            name=op.f("fk_spend_approvals_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "approval_id", name=op.f("pk_spend_approvals")),
    )
    op.create_index(
        "ix_spend_approvals_queue",
        "spend_approvals",
        ["tenant_id", "queue", "expires_at"],
        unique=False,
    )
    op.create_table(
        "work_items",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column(
            "item_id",
            sa.UUID(as_uuid=False),
            server_default=sa.text("gen_random_uuid()"),
            nullable=False,
        ),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("priority", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column(
            "state",
            sa.Enum("ready", "leased", "completed", "quarantined", "cancelled", name="item_state"),
            server_default=sa.text("'ready'"),
            nullable=False,
        ),
        sa.Column(
            "available_at",
            sa.DateTime(timezone=True),
            server_default=sa.text("now()"),
            nullable=False,
        ),
        sa.Column("fence", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("acquisition_count", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("max_acquisitions", sa.Integer(), nullable=False),
        sa.Column("lease_holder", sa.Text(), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("result", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("last_failure", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("event_seq", sa.Integer(), server_default=sa.text("0"), nullable=False),
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
            "(state = 'leased') = (lease_holder IS NOT NULL) AND (state = 'leased') = (lease_expires_at IS NOT NULL)",
            name=op.f("ck_work_items_lease_iff_leased"),
        ),
        sa.CheckConstraint(
            "state <> 'completed' OR fence > 0", name=op.f("ck_work_items_completed_was_leased")
        ),
        sa.CheckConstraint(
            "acquisition_count >= 0 AND acquisition_count <= max_acquisitions",
            name=op.f("ck_work_items_acquisitions_within_budget"),
        ),
        sa.CheckConstraint("fence >= 0", name=op.f("ck_work_items_fence_not_negative")),
        sa.CheckConstraint(
            "max_acquisitions BETWEEN 1 AND 100", name=op.f("ck_work_items_max_acquisitions_range")
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.tenant_id"],
            name=op.f("fk_work_items_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "item_id", name=op.f("pk_work_items")),
    )
    op.create_index(
        "ix_work_items_leased",
        "work_items",
        ["tenant_id", "queue", "lease_expires_at"],
        unique=False,
        postgresql_where=sa.text("state = 'leased'"),
    )
    op.create_index(
        "ix_work_items_quarantined",
        "work_items",
        ["tenant_id", "queue"],
        unique=False,
        postgresql_where=sa.text("state = 'quarantined'"),
    )
    # Dead rows of the hot table are vacuumed early so acquire does not wade through them.
    op.execute(
        "ALTER TABLE work_items SET (autovacuum_vacuum_scale_factor = 0.01,"
        " autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 0)"
    )
    op.create_index(
        "ix_work_items_ready",
        "work_items",
        ["tenant_id", "queue", sa.literal_column("priority DESC"), "available_at", "item_id"],
        unique=False,
        postgresql_where=sa.text("state = 'ready'"),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_work_items_ready", table_name="work_items", postgresql_where=sa.text("state = 'ready'")
    )
    op.drop_index(
        "ix_work_items_quarantined",
        table_name="work_items",
        postgresql_where=sa.text("state = 'quarantined'"),
    )
    op.drop_index(
        "ix_work_items_leased",
        table_name="work_items",
        postgresql_where=sa.text("state = 'leased'"),
    )
    op.drop_table("work_items")
    op.drop_index("ix_spend_approvals_queue", table_name="spend_approvals")
    op.drop_table("spend_approvals")
    op.drop_table("api_keys")
    op.drop_table("tenants")
    op.drop_table("item_events")
    op.drop_index("ix_idempotency_receipts_expires_at", table_name="idempotency_receipts")
    op.drop_table("idempotency_receipts")
    op.drop_index(
        "uq_dead_letters_open_item",
        table_name="dead_letters",
        postgresql_where=sa.text("closed_at IS NULL AND kind = 'item'"),
    )
    op.drop_index(
        "ix_dead_letters_open",
        table_name="dead_letters",
        postgresql_where=sa.text("closed_at IS NULL"),
    )
    op.drop_table("dead_letters")
    sa.Enum(name="item_state").drop(op.get_bind(), checkfirst=True)
