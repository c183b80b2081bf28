"""backlog counters: admitted per tenant, releases in shards

Revision ID: 0004
Revises: 0002, 0003
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = ("0002", "0003")
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "tenants",
        sa.Column("admitted", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
    )
    op.create_table(
        "backlog_releases",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("shard", sa.Integer(), nullable=False),
        sa.Column("released", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "shard", name=op.f("pk_backlog_releases")),
    )
    # The backlog as it stands becomes the admitted count; nothing has been released yet.
    op.execute(
        "UPDATE tenants t SET admitted = (SELECT count(*) FROM work_items w"
        " WHERE w.tenant_id = t.tenant_id AND w.state IN ('ready', 'leased'))"
    )


def downgrade() -> None:
    op.drop_table("backlog_releases")
    op.drop_column("tenants", "admitted")
