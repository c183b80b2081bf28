"""every ready or leased row records the transaction that put it where it is in the acquire's
order (`placed_xid`): made it ready or leased, or moved it (an instant, a priority, a lease's
expiry), so that an acquire can resume its scans of the ready and leased indexes from a
cursor and still find every row that a transaction committed late

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | Sequence[str] | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Rows ready or leased before this migration keep NULL: a connection's first acquire on a
# queue reads both indexes from their start (queue_server/store/cursors.py), which finds
# them. A new row gets its inserting transaction's id (the default); an update that makes a
# row ready or leased, or moves it in either order, gets the updating transaction's (the
# trigger), however the update was written.
PLACED_XID = """
CREATE FUNCTION work_items_placed_xid() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    NEW.placed_xid := pg_current_xact_id();
    RETURN NEW;
END
$fn$
"""

TRIGGER = """
CREATE TRIGGER work_items_placed_xid BEFORE UPDATE ON work_items
FOR EACH ROW WHEN (
    (NEW.state = 'ready' AND (OLD.state <> 'ready' OR NEW.queue <> OLD.queue
                              OR NEW.priority <> OLD.priority
                              OR NEW.available_at <> OLD.available_at))
    OR (NEW.state = 'leased' AND (OLD.state <> 'leased' OR NEW.queue <> OLD.queue
                                  OR NEW.lease_expires_at IS DISTINCT FROM OLD.lease_expires_at)))
EXECUTE FUNCTION work_items_placed_xid()
"""

# Each index holds the id alone: a statement reads it by a range of ids (every queue's rows
# placed since a snapshot), and checks tenant and queue after; with them in the index, the
# planner could choose it, or the ready and leased indexes, for scans meant for the other.
INDEXES = {"ix_work_items_ready_placed": "ready", "ix_work_items_leased_placed": "leased"}


def upgrade() -> None:
    op.execute("ALTER TABLE work_items ADD COLUMN placed_xid xid8")
    # Set apart from the ADD: a volatile default there would rewrite every existing row.
    op.execute("ALTER TABLE work_items ALTER COLUMN placed_xid SET DEFAULT pg_current_xact_id()")
    op.execute(PLACED_XID)
    op.execute(TRIGGER)
    for name, state in INDEXES.items():
        op.create_index(
            name,
            "work_items",
            ["placed_xid"],
            unique=False,
            postgresql_where=sa.text(f"state = '{state}'"),
        )


def downgrade() -> None:
    for name in INDEXES:
        op.drop_index(name, table_name="work_items")
    op.execute("DROP TRIGGER work_items_placed_xid ON work_items")
    op.execute("DROP FUNCTION work_items_placed_xid()")
    op.drop_column("work_items", "placed_xid")
