"""fairness between partition keys: a queue may hand out its items round-robin between their
partition keys (`fairness = 'partition_key'`) instead of by when each became due, so a key
that floods the queue does not hold back another key's items

The ready rows by (queue, partition key, priority, when due): the acquire of a fair queue
reads each key's first due rows from its own place in this index (store/cursors.py keeps a
place per priority and key, as it keeps one per priority), so its cost is the rows taken
since its last look, never the history an old snapshot keeps. Items without a key are one
more key, ''.

Revision ID: 0040
Revises: 0039
Create Date: 2026-12-06
"""

import importlib
from collections.abc import Sequence
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision: str = "0040"
down_revision: str | Sequence[str] | None = "0039"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KNOWN = "fairness IN ('arrival', 'partition_key')"
# Only a statement that names a row's key (`coalesce(partition_key, '') = ...`, which
# implies it) may read the keyed index: with the ready rows alone as its predicate, the
# planner read a priority of a whole queue from it, walking every key's rows.
KEYED = "state = 'ready' AND coalesce(partition_key, '') IS NOT NULL"


def _shards() -> ModuleType:
    return importlib.import_module("queue_server.migrations.versions.0028_admission_shards")


def upgrade() -> None:
    home = _shards()._home()
    op.add_column(
        "queues",
        sa.Column("fairness", sa.Text(), nullable=False, server_default=sa.text("'arrival'")),
        schema=home,
    )
    op.create_check_constraint(op.f("ck_queues_fairness_known"), "queues", KNOWN, schema=home)
    op.create_index(
        "ix_work_items_ready_keyed",
        "work_items",
        [
            "tenant_id",
            "queue",
            sa.text("coalesce(partition_key, '')"),
            sa.text("priority DESC"),
            "available_at",
            "item_id",
        ],
        postgresql_where=sa.text(KEYED),
        # The key itself too, so that a read of the whole index needs no row (index only).
        postgresql_include=["partition_key"],
        schema=home,
    )


def downgrade() -> None:
    home = _shards()._home()
    op.drop_index("ix_work_items_ready_keyed", table_name="work_items", schema=home)
    op.drop_constraint(op.f("ck_queues_fairness_known"), "queues", type_="check", schema=home)
    op.drop_column("queues", "fairness", schema=home)
