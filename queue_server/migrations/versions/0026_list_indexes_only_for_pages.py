"""the item list's indexes serve only the pages that ask for them: their predicate also
names `fence >= 0`, which every row satisfies (a check constraint) and which only the list
pages and the retention sweeper say

With `state <> 'leased'` alone, every scan of ready rows by tenant and queue could take
them: `state = 'ready'` implies it. After an autoanalyze under an old snapshot the generic
plan of the acquire cursor's lane scan (and of the queue figures) switched to
ix_work_items_list_attempts, whose ready range holds every dead ready version the snapshot
keeps: 1.8 million buffers a call, 15 minutes into the hold. The ready index reads from
the lane's position; these must never be a choice for it. A planner proves a partial
index's predicate from the query's own conditions only, never from a check constraint.

Each index is built anew beside the old one without blocking writes, then takes its name.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: str | Sequence[str] | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXES = {
    "ix_work_items_list": [],
    "ix_work_items_list_priority": ["priority"],
    "ix_work_items_list_attempts": ["acquisition_count"],
}


def _rebuild(where: str) -> None:
    with op.get_context().autocommit_block():
        for name, key in INDEXES.items():
            building = f"{name}_next"
            op.drop_index(
                building, table_name="work_items", postgresql_concurrently=True, if_exists=True
            )
            op.create_index(
                building,
                "work_items",
                ["tenant_id", "state", "queue", *key, "created_at", "item_id"],
                unique=False,
                postgresql_where=sa.text(where),
                postgresql_concurrently=True,
            )
            op.drop_index(name, table_name="work_items", postgresql_concurrently=True)
            op.execute(f"ALTER INDEX {building} RENAME TO {name}")


def upgrade() -> None:
    _rebuild("state <> 'leased' AND fence >= 0")


def downgrade() -> None:
    _rebuild("state <> 'leased'")
