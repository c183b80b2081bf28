"""deliveries in flight: the index every claim counts them by

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The policy's watcher-delivery/concurrency bounds the deliveries in flight across all
    # deliverers: each claim counts the claimed, unrecorded rows through this index.
    op.create_index(
        "ix_outbox_deliveries_in_flight",
        "outbox_deliveries",
        ["claimed_until"],
        unique=False,
        postgresql_where=sa.text("state = 'pending' AND claim_token IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_outbox_deliveries_in_flight",
        table_name="outbox_deliveries",
        postgresql_where=sa.text("state = 'pending' AND claim_token IS NOT NULL"),
    )
