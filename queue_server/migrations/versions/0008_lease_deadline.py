"""lease deadline: a lease lives at most the policy's deadline from its acquisition

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "work_items", sa.Column("lease_deadline_at", sa.DateTime(timezone=True), nullable=True)
    )
    # Leases held at upgrade time get the built-in deadline (900 s) from now: their
    # acquisition time is not on the row.
    op.execute(
        "UPDATE work_items SET lease_deadline_at ="
        " greatest(lease_expires_at, now() + interval '900 seconds') WHERE state = 'leased'"
    )
    op.create_check_constraint(
        op.f("ck_work_items_lease_within_deadline"),
        "work_items",
        "lease_expires_at IS NULL OR lease_expires_at <= lease_deadline_at",
    )


def downgrade() -> None:
    op.drop_constraint(op.f("ck_work_items_lease_within_deadline"), "work_items", type_="check")
    op.drop_column("work_items", "lease_deadline_at")
