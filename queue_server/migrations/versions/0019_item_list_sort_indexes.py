"""the item list sorts by priority and by attempts from an index, as by creation

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | Sequence[str] | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Each (state, queue) range in the sort key's order, then creation: a page sorted by
# priority or attempts reads its rows from the cursor on (either direction) instead of
# sorting every item of the state. Leased rows stay out, as in ix_work_items_list.
INDEXES = {
    "ix_work_items_list_priority": "priority",
    "ix_work_items_list_attempts": "acquisition_count",
}


def upgrade() -> None:
    # Built without blocking writes to work_items (outside the migration's transaction).
    with op.get_context().autocommit_block():
        for name, key in INDEXES.items():
            op.create_index(
                name,
                "work_items",
                ["tenant_id", "state", "queue", key, "created_at", "item_id"],
                unique=False,
                postgresql_where=sa.text("state <> 'leased'"),
                postgresql_concurrently=True,
                if_not_exists=True,
            )


def downgrade() -> None:
    with op.get_context().autocommit_block():
        for name in INDEXES:
            op.drop_index(
                name, table_name="work_items", postgresql_concurrently=True, if_exists=True
            )
