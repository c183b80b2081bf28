"""verification run deadlines and ends; operator settlement of stale confirmation receipts

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _ts(name: str) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=True)  # type: ignore[arg-type]


def upgrade() -> None:
    op.add_column("verification_runs", _ts("deadline_at"))
    # Runs started before this revision get the built-in deadline (1800 s) from their start.
    op.execute("UPDATE verification_runs SET deadline_at = created_at + interval '1800 seconds'")
    op.alter_column("verification_runs", "deadline_at", nullable=False)
    op.add_column("verification_runs", _ts("ended_at"))
    op.add_column("verification_runs", sa.Column("ended_by", sa.Text(), nullable=True))
    op.add_column("verification_runs", sa.Column("end_reason", sa.Text(), nullable=True))
    op.drop_constraint(op.f("ck_verification_runs_state_known"), "verification_runs")
    op.create_check_constraint(
        op.f("ck_verification_runs_state_known"),
        "verification_runs",
        "state IN ('running', 'complete', 'failed', 'abandoned')",
    )
    op.create_check_constraint(
        op.f("ck_verification_runs_ended_has_record"),
        "verification_runs",
        "(state IN ('failed', 'abandoned')) = (ended_at IS NOT NULL)"
        " AND (ended_at IS NULL) = (ended_by IS NULL)"
        " AND (ended_at IS NULL) = (end_reason IS NULL)",
    )
    op.drop_index(op.f("uq_verification_runs_run_key"), table_name="verification_runs")
    op.create_index(
        op.f("uq_verification_runs_run_key"),
        "verification_runs",
        ["tenant_id", "artifact_version", "verifier_version"],
        unique=True,
        postgresql_where=sa.text("state IN ('running', 'complete')"),
    )
    op.add_column("confirmation_receipts", sa.Column("settled_by", sa.Text(), nullable=True))
    op.add_column("confirmation_receipts", sa.Column("settle_reason", sa.Text(), nullable=True))
    op.create_check_constraint(
        op.f("ck_confirmation_receipts_operator_settlement_recorded"),
        "confirmation_receipts",
        "(settled_by IS NULL) = (settle_reason IS NULL)"
        " AND (settled_by IS NULL OR status <> 'pending')",
    )
    op.create_index(
        op.f("ix_confirmation_receipts_pending"),
        "confirmation_receipts",
        ["tenant_id", "created_at"],
        postgresql_where=sa.text("status = 'pending'"),
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_confirmation_receipts_pending"), table_name="confirmation_receipts")
    op.drop_constraint(
        op.f("ck_confirmation_receipts_operator_settlement_recorded"), "confirmation_receipts"
    )
    op.drop_column("confirmation_receipts", "settle_reason")
    op.drop_column("confirmation_receipts", "settled_by")
    # Ended runs have no place in the old schema.
    op.execute("DELETE FROM verification_runs WHERE state IN ('failed', 'abandoned')")
    op.drop_index(op.f("uq_verification_runs_run_key"), table_name="verification_runs")
    op.create_index(
        op.f("uq_verification_runs_run_key"),
        "verification_runs",
        ["tenant_id", "artifact_version", "verifier_version"],
        unique=True,
    )
    op.drop_constraint(op.f("ck_verification_runs_ended_has_record"), "verification_runs")
    op.drop_constraint(op.f("ck_verification_runs_state_known"), "verification_runs")
    op.create_check_constraint(
        op.f("ck_verification_runs_state_known"),
        "verification_runs",
        "state IN ('running', 'complete')",
    )
    op.drop_column("verification_runs", "end_reason")
    op.drop_column("verification_runs", "ended_by")
    op.drop_column("verification_runs", "ended_at")
    op.drop_column("verification_runs", "deadline_at")
