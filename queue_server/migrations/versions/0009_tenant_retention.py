"""tenant retention: how long completed and cancelled items are kept

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


def upgrade() -> None:
    op.add_column(
        "tenants",
        sa.Column("retention", sa.Interval(), server_default=sa.text("'7 days'"), nullable=False),
    )
    op.create_check_constraint(
        op.f("ck_tenants_retention_positive"), "tenants", "retention >= interval '1 second'"
    )


def downgrade() -> None:
    op.drop_constraint(op.f("ck_tenants_retention_positive"), "tenants", type_="check")
    op.drop_column("tenants", "retention")
