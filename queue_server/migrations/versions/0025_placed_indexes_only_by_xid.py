"""the indexes of rows placed since a snapshot serve only a scan by `placed_xid`: their
predicate also names `placed_xid IS NOT NULL`, which a range of `placed_xid` implies and
no other scan of ready or leased rows does

With `state = 'leased'` alone, the planner took the leased one for the acquire's scan of
expired leases (by `lease_expires_at`): the whole index and a sort looked cheap beside the
leased index, as statistics see few leases. Under an old snapshot that index holds every
lease taken since it began, and that scan read 9,366 buffers a minute into the hold, where
the leased index reads a few. Rows whose `placed_xid` is NULL (older than 0021 and not
placed since) were never found by such a scan: the ranges compare to a value.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | Sequence[str] | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INDEXES = {"ix_work_items_ready_placed": "ready", "ix_work_items_leased_placed": "leased"}


def _recreate(where: str) -> None:
    for name, state in INDEXES.items():
        op.drop_index(name, table_name="work_items")
        op.create_index(
            name,
            "work_items",
            ["placed_xid"],
            unique=False,
            postgresql_where=sa.text(where.format(state=state)),
        )


def upgrade() -> None:
    _recreate("state = '{state}' AND placed_xid IS NOT NULL")


def downgrade() -> None:
    _recreate("state = '{state}'")
