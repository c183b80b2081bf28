"""tenant retention: how long completed and cancelled items are kept; item_events vacuumed
as often as work_items, now that retention deletes from it all the time

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
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
    # The ledger loses the rows of every item retention deletes: reclaim them as work_items'.
    op.execute(
        "ALTER TABLE item_events SET (autovacuum_vacuum_scale_factor = 0.01,"
        " autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 0)"
    )


def downgrade() -> None:
    op.execute(
        "ALTER TABLE item_events RESET (autovacuum_vacuum_scale_factor,"
        " autovacuum_analyze_scale_factor, autovacuum_vacuum_cost_delay)"
    )
    op.drop_constraint(op.f("ck_tenants_retention_positive"), "tenants", type_="check")
    op.drop_column("tenants", "retention")
