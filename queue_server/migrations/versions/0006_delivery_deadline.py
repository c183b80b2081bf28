"""delivery deadlines: the instant a delivery's deadline counts from; when a watcher paused

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The delivery's deadline (the policy's watcher-delivery/deadline) counts from here:
    # its event, moved on by the time its watcher spent paused; a replay starts it again.
    op.add_column(
        "outbox_deliveries",
        sa.Column(
            "deadline_from",
            sa.DateTime(timezone=True),
            server_default=sa.text("statement_timestamp()"),
            nullable=False,
        ),
    )
    op.execute("UPDATE outbox_deliveries SET deadline_from = created_at WHERE state = 'pending'")
    op.create_index(
        "ix_outbox_deliveries_deadline",
        "outbox_deliveries",
        ["deadline_from"],
        unique=False,
        postgresql_where=sa.text("state = 'pending'"),
    )
    op.add_column("watchers", sa.Column("paused_at", sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE watchers SET paused_at = updated_at WHERE state = 'paused'")
    op.create_check_constraint(
        op.f("ck_watchers_paused_since"), "watchers", "(state = 'paused') = (paused_at IS NOT NULL)"
    )


def downgrade() -> None:
    op.drop_constraint(op.f("ck_watchers_paused_since"), "watchers", type_="check")
    op.drop_column("watchers", "paused_at")
    op.drop_index(
        "ix_outbox_deliveries_deadline",
        table_name="outbox_deliveries",
        postgresql_where=sa.text("state = 'pending'"),
    )
    op.drop_column("outbox_deliveries", "deadline_from")
