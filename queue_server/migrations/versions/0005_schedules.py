"""schedules and their fires

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _ts(name: str, **kw: object) -> sa.Column:
    return sa.Column(name, sa.DateTime(timezone=True), **kw)


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("schedule_id", sa.UUID(as_uuid=False), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("priority", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("max_acquisitions", sa.Integer(), nullable=True),
        sa.Column("cron", sa.Text(), nullable=True),
        sa.Column("every_seconds", sa.Integer(), nullable=True),
        sa.Column("timezone", sa.Text(), server_default=sa.text("'UTC'"), nullable=False),
        sa.Column("catch_up", sa.Text(), nullable=False),
        sa.Column("catch_up_limit", sa.Integer(), nullable=False),
        sa.Column("paused", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        _ts("next_tick_at", nullable=False),
        _ts("due_at", nullable=False),
        sa.Column("fires", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("refusals", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("skipped", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        _ts("created_at", server_default=sa.text("now()"), nullable=False),
        _ts("updated_at", server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint(
            "(cron IS NULL) <> (every_seconds IS NULL)", name=op.f("ck_schedules_cron_or_every")
        ),
        sa.CheckConstraint("every_seconds >= 1", name=op.f("ck_schedules_every_positive")),
        sa.CheckConstraint(
            "catch_up IN ('skip', 'latest', 'all-bounded')",
            name=op.f("ck_schedules_catch_up_known"),
        ),
        sa.CheckConstraint(
            "catch_up_limit BETWEEN 1 AND 1000", name=op.f("ck_schedules_catch_up_limit_range")
        ),
        sa.CheckConstraint(
            "max_acquisitions BETWEEN 1 AND 100", name=op.f("ck_schedules_max_acquisitions_range")
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.tenant_id"],
            name=op.f("fk_schedules_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "name", name=op.f("pk_schedules")),
    )
    op.create_index(
        "uq_schedules_schedule_id", "schedules", ["tenant_id", "schedule_id"], unique=True
    )
    op.create_index(
        "ix_schedules_due",
        "schedules",
        ["due_at"],
        unique=False,
        postgresql_where=sa.text("NOT paused"),
    )
    op.create_table(
        "schedule_fires",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("schedule_id", sa.UUID(as_uuid=False), nullable=False),
        _ts("tick_at", nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.Column("item_id", sa.UUID(as_uuid=False), nullable=True),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("1"), nullable=False),
        _ts("at", nullable=False),
        sa.Column("detail", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.CheckConstraint(
            "kind IN ('tick', 'trigger')", name=op.f("ck_schedule_fires_kind_known")
        ),
        sa.CheckConstraint(
            "outcome IN ('enqueued', 'refused', 'dropped')",
            name=op.f("ck_schedule_fires_outcome_known"),
        ),
        sa.CheckConstraint(
            "(outcome = 'enqueued') = (item_id IS NOT NULL)",
            name=op.f("ck_schedule_fires_item_iff_enqueued"),
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id", "schedule_id"],
            ["schedules.tenant_id", "schedules.schedule_id"],
            name=op.f("fk_schedule_fires_tenant_id_schedules"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "tenant_id", "schedule_id", "tick_at", "kind", name=op.f("pk_schedule_fires")
        ),
    )


def downgrade() -> None:
    op.drop_table("schedule_fires")
    op.drop_index(
        "ix_schedules_due", table_name="schedules", postgresql_where=sa.text("NOT paused")
    )
    op.drop_index("uq_schedules_schedule_id", table_name="schedules")
    op.drop_table("schedules")
