"""a queue's concurrency is the operator's setting, below the approved limit, and an
approval's expiry is an event in the queue's ledger

`queues.concurrency` (NULL: the approved limit itself) is changed live by an operator
(`PUT .../queues/{q}/concurrency`); the acquire leases at most the lesser of it and the
approved limit (the largest live spend approval, else the policy's one), so an approval
that lapses still brings the queue down to one lease at a time, but never silently: the
sweeper writes an `approval-expired` event in the queue's ledger for each approval whose
expiry passed (`spend_approvals.expiry_ledgered_at` says it was written), and the partial
index keeps that look a probe of the approvals not yet ledgered.

Approvals that expired before this revision are marked ledgered at their expiry without
an event: the ledger records expiries from now on, not a backlog of old ones at once.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0029"
down_revision: str | Sequence[str] | None = "0028"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("queues", sa.Column("concurrency", sa.Integer(), nullable=True))
    op.create_check_constraint(
        op.f("ck_queues_concurrency_positive"), "queues", "concurrency IS NULL OR concurrency >= 1"
    )
    op.add_column(
        "spend_approvals",
        sa.Column("expiry_ledgered_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.execute(
        "UPDATE spend_approvals SET expiry_ledgered_at = expires_at"
        " WHERE expires_at <= statement_timestamp() OR revoked_at IS NOT NULL"
    )
    op.create_index(
        "ix_spend_approvals_unledgered",
        "spend_approvals",
        ["expires_at"],
        postgresql_where=sa.text("expiry_ledgered_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_spend_approvals_unledgered", table_name="spend_approvals")
    op.drop_column("spend_approvals", "expiry_ledgered_at")
    op.drop_constraint(op.f("ck_queues_concurrency_positive"), "queues", type_="check")
    op.drop_column("queues", "concurrency")
