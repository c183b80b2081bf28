"""rate limits: a queue may hand out at most `rate_limit` leases in any `rate_interval`,
over the whole queue or per partition key (an item's `partition_key`, set by its producer)

Every acquire of a rate-limited queue writes how many leases it made, and for which key, to
`rate_grants`, an append-only table: the room left is the limit less the grants of the last
interval, a range of its index that holds only that interval's rows (older ones lie before
it, and the sweeper deletes them), so its cost follows the limit, never the history. The
acquire of a rate-limited queue takes the queue's lock exclusively (a shared attempt steps
aside), so no two acquires count the same room. Per partition key, the acquire looks at more
candidates than it may lease (ten times, at most 1,000) and takes, in order, those whose key
has room.

Revision ID: 0032
Revises: 0031
Create Date: 2026-12-05
"""

import importlib
from collections.abc import Sequence
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision: str = "0032"
down_revision: str | Sequence[str] | None = "0031"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PRINTABLE = "partition_key IS NULL OR partition_key ~ '^[!-~]{1,255}$'"


def _ordered() -> ModuleType:
    return importlib.import_module("queue_server.migrations.versions.0031_ordered_keys")


def _shards() -> ModuleType:
    return importlib.import_module("queue_server.migrations.versions.0028_admission_shards")


# 0031's admission, writing each item's partition key (and ledgering it with `enqueued`).
EDITS = (
    ("unique_key text, ordering_key text))", "unique_key text, ordering_key text,\n"
     "                     partition_key text))"),
    ("traceparent, tracestate, unique_key, ordering_key, i)",
     "traceparent, tracestate, unique_key, ordering_key,\n"
     "                                  partition_key, i)"),
    ("admission_shard, unique_key, ordering_key, ordering_seq)",
     "admission_shard, unique_key, ordering_key, ordering_seq,\n"
     "                                partition_key)"),
    ("x.shard, x.unique_key, x.ordering_key, x.ordering_seq",
     "x.shard, x.unique_key, x.ordering_key, x.ordering_seq,\n"
     "               x.partition_key"),
    ("               || CASE WHEN state = 'waiting'",
     "               || CASE WHEN partition_key IS NULL THEN '{{}}'::jsonb\n"
     "                       ELSE jsonb_build_object('partition_key', partition_key) END\n"
     "               || CASE WHEN state = 'waiting'"),
)  # fmt: skip


def admit_rows() -> str:
    text: str = _ordered().ADMIT_ROWS
    for old, new in EDITS:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


SHOWN = "'unique_key', s.unique_key, 'ordering_key', s.ordering_key"


def upgrade() -> None:
    shards = _shards()
    home = shards._home()
    op.add_column("work_items", sa.Column("partition_key", sa.Text(), nullable=True), schema=home)
    op.create_check_constraint(
        op.f("ck_work_items_partition_key_printable"), "work_items", PRINTABLE, schema=home
    )
    op.add_column("queues", sa.Column("rate_limit", sa.Integer(), nullable=True), schema=home)
    op.add_column("queues", sa.Column("rate_interval", sa.Interval(), nullable=True), schema=home)
    op.add_column(
        "queues",
        sa.Column(
            "rate_partitioned", sa.Boolean(), nullable=False, server_default=sa.text("false")
        ),
        schema=home,
    )
    op.create_check_constraint(
        op.f("ck_queues_rate_limit_given_whole"),
        "queues",
        "(rate_limit IS NULL) = (rate_interval IS NULL)"
        " AND (rate_limit IS NULL OR rate_limit >= 1)"
        " AND (rate_interval IS NULL OR rate_interval > interval '0')",
        schema=home,
    )
    # No key and no foreign key, as counter_deltas: an acquire inserts its row and locks
    # nothing for it. A deleted tenant's grants go with their interval (the sweeper).
    op.create_table(
        "rate_grants",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("partition_key", sa.Text(), nullable=False),
        sa.Column("granted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("n", sa.Integer(), nullable=False),
        schema=home,
    )
    op.create_index(
        "ix_rate_grants_window",
        "rate_grants",
        ["tenant_id", "queue", "partition_key", "granted_at"],
        schema=home,
    )
    op.create_index("ix_rate_grants_granted_at", "rate_grants", ["granted_at"], schema=home)
    op.execute(shards._ddl(admit_rows(), home))
    op.execute(_ordered()._item_json(f"{SHOWN}, 'partition_key', s.partition_key"))


def downgrade() -> None:
    shards = _shards()
    home = shards._home()
    op.execute(_ordered()._item_json(SHOWN))
    op.execute(shards._ddl(_ordered().ADMIT_ROWS, home))
    op.drop_index("ix_rate_grants_granted_at", table_name="rate_grants", schema=home)
    op.drop_index("ix_rate_grants_window", table_name="rate_grants", schema=home)
    op.drop_table("rate_grants", schema=home)
    op.drop_constraint(
        op.f("ck_queues_rate_limit_given_whole"), "queues", type_="check", schema=home
    )
    op.drop_column("queues", "rate_partitioned", schema=home)
    op.drop_column("queues", "rate_interval", schema=home)
    op.drop_column("queues", "rate_limit", schema=home)
    op.drop_constraint(
        op.f("ck_work_items_partition_key_printable"), "work_items", type_="check", schema=home
    )
    op.drop_column("work_items", "partition_key", schema=home)
