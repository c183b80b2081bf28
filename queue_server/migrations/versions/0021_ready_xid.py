"""every ready row records the transaction that made it ready (`ready_xid`), so that an
acquire can resume its scan of the ready index from a cursor and still find every row
that a transaction committed late

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

# Rows ready before this migration keep NULL: a connection's first acquire on a queue reads
# the whole ready index (queue_server/store/lanes.py), which finds them. A new row gets its
# inserting transaction's id; an update that makes a row ready, or moves a ready row to
# another place in the acquire order, gets the updating transaction's (the trigger), however
# the update was written.
READY_XID = """
CREATE FUNCTION work_items_ready_xid() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    NEW.ready_xid := pg_current_xact_id();
    RETURN NEW;
END
$fn$
"""

TRIGGER = """
CREATE TRIGGER work_items_ready_xid BEFORE UPDATE ON work_items
FOR EACH ROW WHEN (NEW.state = 'ready' AND (OLD.state <> 'ready'
                                             OR NEW.queue <> OLD.queue
                                             OR NEW.priority <> OLD.priority
                                             OR NEW.available_at <> OLD.available_at))
EXECUTE FUNCTION work_items_ready_xid()
"""


def upgrade() -> None:
    op.execute("ALTER TABLE work_items ADD COLUMN ready_xid xid8")
    # Set apart from the ADD: a volatile default there would rewrite every existing row.
    op.execute("ALTER TABLE work_items ALTER COLUMN ready_xid SET DEFAULT pg_current_xact_id()")
    op.execute(READY_XID)
    op.execute(TRIGGER)
    op.create_index(
        "ix_work_items_ready_xid",
        "work_items",
        ["tenant_id", "queue", "ready_xid"],
        unique=False,
        postgresql_where=sa.text("state = 'ready'"),
    )


def downgrade() -> None:
    op.drop_index("ix_work_items_ready_xid", table_name="work_items")
    op.execute("DROP TRIGGER work_items_ready_xid ON work_items")
    op.execute("DROP FUNCTION work_items_ready_xid()")
    op.drop_column("work_items", "ready_xid")
