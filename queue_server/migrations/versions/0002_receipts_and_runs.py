"""durable confirmation receipts and artifact verification runs

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _ts(name: str, *, nullable: bool, now: bool = False) -> sa.Column[object]:
    default = sa.text("now()") if now else None
    return sa.Column(name, sa.DateTime(timezone=True), server_default=default, nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "confirmation_receipts",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("outcome_ref", sa.Text(), nullable=False),
        sa.Column("idempotency_key", sa.Text(), nullable=False),
        sa.Column("claim_token", sa.Text(), nullable=True),
        sa.Column("status", sa.Text(), server_default=sa.text("'pending'"), nullable=False),
        sa.Column("outcome", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        _ts("created_at", nullable=False, now=True),
        _ts("settled_at", nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'succeeded', 'failed')",
            name=op.f("ck_confirmation_receipts_status_known"),
        ),
        sa.CheckConstraint(
            "(status = 'pending') = (settled_at IS NULL) "
            "AND (status = 'pending') = (outcome IS NULL)",
            name=op.f("ck_confirmation_receipts_settled_iff_outcome"),
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.tenant_id"],
            name=op.f("fk_confirmation_receipts_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "outcome_ref", name=op.f("pk_confirmation_receipts")),
    )
    op.create_index(
        "uq_confirmation_receipts_tenant_id_idempotency_key",
        "confirmation_receipts",
        ["tenant_id", "idempotency_key"],
        unique=True,
    )
    op.create_table(
        "verification_runs",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("run_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("artifact_version", sa.Text(), nullable=False),
        sa.Column("verifier_version", sa.Text(), nullable=False),
        sa.Column("items", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("state", sa.Text(), server_default=sa.text("'running'"), nullable=False),
        _ts("created_at", nullable=False, now=True),
        _ts("completed_at", nullable=True),
        sa.CheckConstraint(
            "state IN ('running', 'complete')", name=op.f("ck_verification_runs_state_known")
        ),
        sa.CheckConstraint(
            "(state = 'complete') = (completed_at IS NOT NULL)",
            name=op.f("ck_verification_runs_complete_has_time"),
        ),
        sa.CheckConstraint(
            "jsonb_typeof(items) = 'array' AND jsonb_array_length(items) >= 1",
            name=op.f("ck_verification_runs_declares_items"),
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.tenant_id"],
            name=op.f("fk_verification_runs_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "run_id", name=op.f("pk_verification_runs")),
    )
    op.create_index(
        "uq_verification_runs_run_key",
        "verification_runs",
        ["tenant_id", "artifact_version", "verifier_version"],
        unique=True,
    )
    op.create_index(
        "uq_verification_runs_running",
        "verification_runs",
        ["tenant_id"],
        unique=True,
        postgresql_where=sa.text("state = 'running'"),
    )
    op.create_table(
        "verification_checkpoints",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("run_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("item", sa.Text(), nullable=False),
        sa.Column("result", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        _ts("recorded_at", nullable=False, now=True),
        sa.ForeignKeyConstraint(
            ["tenant_id", "run_id"],
            ["verification_runs.tenant_id", "verification_runs.run_id"],
            name=op.f("fk_verification_checkpoints_tenant_id_verification_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "tenant_id", "run_id", "item", name=op.f("pk_verification_checkpoints")
        ),
    )


def downgrade() -> None:
    op.drop_table("verification_checkpoints")
    op.drop_index("uq_verification_runs_running", table_name="verification_runs")
    op.drop_index("uq_verification_runs_run_key", table_name="verification_runs")
    op.drop_table("verification_runs")
    op.drop_index(
        "uq_confirmation_receipts_tenant_id_idempotency_key", table_name="confirmation_receipts"
    )
    op.drop_table("confirmation_receipts")
