"""the console's charts: acquire-to-complete time in the counters, depth and the oldest ready
item in each sample, and a day of samples at a 15-minute grain

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | Sequence[str] | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _ts(name: str, **kw: object) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), **kw)  # type: ignore[arg-type]


def _counter(name: str) -> sa.Column[object]:
    return sa.Column(name, sa.BigInteger(), server_default=sa.text("0"), nullable=False)


def upgrade() -> None:
    # Completions whose lease start is known, and the sum of their acquire-to-complete
    # times in milliseconds: a window's mean is the rise of one over the rise of the other.
    op.add_column("queue_counters", _counter("timed_completions"))
    op.add_column("queue_counters", _counter("completion_ms"))
    # Samples taken before this revision read as no ready item and no timed completion.
    op.add_column("queue_samples", _counter("timed_completions"))
    op.add_column("queue_samples", _counter("completion_ms"))
    op.add_column("queue_samples", _counter("ready"))
    op.add_column("queue_samples", _ts("oldest_ready_at", nullable=True))
    # Each queue's last sample of each 15-minute bucket, kept for 25 hours (the day's charts).
    op.create_table(
        "queue_day_samples",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        _ts("sampled_at", nullable=False),
        sa.Column("completed", sa.BigInteger(), nullable=False),
        sa.Column("failed", sa.BigInteger(), nullable=False),
        sa.Column("timed_completions", sa.BigInteger(), nullable=False),
        sa.Column("completion_ms", sa.BigInteger(), nullable=False),
        sa.Column("ready", sa.BigInteger(), nullable=False),
        _ts("oldest_ready_at", nullable=True),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.tenant_id"],
            name=op.f("fk_queue_day_samples_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "tenant_id", "queue", "sampled_at", name=op.f("pk_queue_day_samples")
        ),
    )
    op.create_index(
        op.f("ix_queue_day_samples_sampled_at"), "queue_day_samples", ["sampled_at"], unique=False
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_queue_day_samples_sampled_at"), table_name="queue_day_samples")
    op.drop_table("queue_day_samples")
    for column in ("oldest_ready_at", "ready", "completion_ms", "timed_completions"):
        op.drop_column("queue_samples", column)
    for column in ("completion_ms", "timed_completions"):
        op.drop_column("queue_counters", column)
