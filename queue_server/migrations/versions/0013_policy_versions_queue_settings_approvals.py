"""policy_versions: every policy the server has run under; queue settings below the envelope;
spend approvals by an authenticated key, revocable

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _ts(name: str, **kw: object) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), **kw)  # type: ignore[arg-type]


def upgrade() -> None:
    # One row per (version, sha256) the server has loaded at start.
    op.create_table(
        "policy_versions",
        sa.Column("version", sa.Text(), nullable=False),
        sa.Column("sha256", sa.Text(), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("document", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        _ts("first_loaded_at", server_default=sa.text("now()"), nullable=False),
        _ts("last_loaded_at", server_default=sa.text("now()"), nullable=False),
        sa.Column("loads", sa.BigInteger(), server_default=sa.text("1"), nullable=False),
        sa.CheckConstraint("sha256 ~ '^[0-9a-f]{64}$'", name=op.f("ck_policy_versions_sha256")),
        sa.PrimaryKeyConstraint("version", "sha256", name=op.f("pk_policy_versions")),
    )
    # A queue's own settings, each at most the loaded policy's envelope; NULL: the tenant's
    # default, else the policy's.
    op.add_column("queues", sa.Column("lease_ttl", sa.Interval(), nullable=True))
    op.add_column("queues", sa.Column("deadline", sa.Interval(), nullable=True))
    op.add_column("queues", sa.Column("max_acquisitions", sa.Integer(), nullable=True))
    op.add_column("queues", sa.Column("retry_base", sa.Float(), nullable=True))
    op.add_column("queues", sa.Column("retry_cap", sa.Float(), nullable=True))
    op.add_column("queues", sa.Column("retry_jitter", sa.Boolean(), nullable=True))
    op.add_column("queues", _ts("settings_updated_at", nullable=True))
    op.add_column("queues", sa.Column("settings_updated_by", sa.Text(), nullable=True))
    op.create_check_constraint(
        "queue_settings_positive",
        "queues",
        "(lease_ttl IS NULL OR lease_ttl > interval '0')"
        " AND (deadline IS NULL OR deadline > interval '0')"
        " AND (max_acquisitions IS NULL OR max_acquisitions >= 1)"
        " AND (retry_base IS NULL OR retry_base >= 0)"
        " AND (retry_cap IS NULL OR retry_cap >= 0)",
    )
    # The approving key (its id and role), not free text; a revoked approval raises nothing.
    op.add_column("spend_approvals", sa.Column("approved_by_key_id", sa.Text(), nullable=True))
    op.add_column("spend_approvals", sa.Column("approved_by_role", sa.Text(), nullable=True))
    op.add_column("spend_approvals", _ts("revoked_at", nullable=True))
    op.add_column("spend_approvals", sa.Column("revoked_by", sa.Text(), nullable=True))
    op.create_check_constraint(
        "spend_approvals_revoked_has_actor",
        "spend_approvals",
        "(revoked_at IS NULL) = (revoked_by IS NULL)",
    )


def downgrade() -> None:
    op.drop_constraint(
        op.f("ck_spend_approvals_spend_approvals_revoked_has_actor"), "spend_approvals"
    )
    for column in ("revoked_by", "revoked_at", "approved_by_role", "approved_by_key_id"):
        op.drop_column("spend_approvals", column)
    op.drop_constraint(op.f("ck_queues_queue_settings_positive"), "queues")
    for column in (
        "settings_updated_by",
        "settings_updated_at",
        "retry_jitter",
        "retry_cap",
        "retry_base",
        "max_acquisitions",
        "deadline",
        "lease_ttl",
    ):
        op.drop_column("queues", column)
    op.drop_table("policy_versions")
