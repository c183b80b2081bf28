"""unique for a period: an enqueue item may say `unique_for` seconds, and then no item is
made while an item of the queue with its unique key was made within that period, in any
state (a report a day, however many producers ask, also after the first has completed)

The admission looks the key up in a new index of the items that have a unique key, by when
they were made (a range of the period, from its start), besides the unfinished ones (the
unique index); the items it answers with are the unfinished holder, else the newest made
within the period. Two producers racing with one key still make one item: the new item is
unfinished, and the unique index skips the second.

Revision ID: 0033
Revises: 0032
Create Date: 2026-12-05
"""

import importlib
from collections.abc import Sequence
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision: str = "0033"
down_revision: str | Sequence[str] | None = "0032"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UNFINISHED = "w.state IN ('waiting', 'ready', 'leased')"
WITHIN = (
    "w.created_at > statement_timestamp()"
    " - make_interval(secs => coalesce((spans->>{key})::double precision, 0))"
)

# 0032's admission, with the periods: `spans`, each key's longest `unique_for` in this call.
EDITS = (
    ("    orders text[];\n", "    orders text[];\n    spans jsonb := '{{}}';\n"),
    ("    IF cardinality(keys) = 0 THEN\n",
     "    -- Each key's longest period given (0033); none: while unfinished only.\n"
     "    spans := coalesce((SELECT jsonb_object_agg(k, p) FROM (\n"
     "        SELECT e->>'unique_key' AS k, max((e->>'unique_for')::double precision) AS p\n"
     "        FROM jsonb_array_elements(p_items) AS e\n"
     "        WHERE e->>'unique_key' IS NOT NULL AND e->>'unique_for' IS NOT NULL\n"
     "        GROUP BY 1) AS s), '{{}}');\n"
     "    IF cardinality(keys) = 0 THEN\n"),
    ("                     AND w.state IN ('waiting', 'ready', 'leased')))\n"
     "        ORDER BY u.i);",
     "                     AND w.state IN ('waiting', 'ready', 'leased'))\n"
     "               -- Nor one made within the key's period, in any state.\n"
     "               AND NOT (spans ? u.k AND EXISTS (\n"
     "                   SELECT 1 FROM work_items w\n"
     "                   WHERE w.tenant_id = p_tenant AND w.queue = p_queue AND w.unique_key = u.k\n"
     "                     AND " + WITHIN.format(key="u.k") + ")))\n"
     "        ORDER BY u.i);"),
    ("    RETURN QUERY\n"
     "    SELECT w.* FROM work_items w\n"
     "    WHERE w.tenant_id = p_tenant AND w.queue = p_queue\n"
     "      AND w.state IN ('waiting', 'ready', 'leased') AND w.unique_key = ANY(keys)\n"
     "      AND w.item_id NOT IN (SELECT (e->>'item_id')::uuid\n"
     "                            FROM jsonb_array_elements(p_items) AS e);\n",
     "    IF spans = '{{}}' THEN\n"
     "    RETURN QUERY\n"
     "    SELECT w.* FROM work_items w\n"
     "    WHERE w.tenant_id = p_tenant AND w.queue = p_queue\n"
     "      AND w.state IN ('waiting', 'ready', 'leased') AND w.unique_key = ANY(keys)\n"
     "      AND w.item_id NOT IN (SELECT (e->>'item_id')::uuid\n"
     "                            FROM jsonb_array_elements(p_items) AS e);\n"
     "    ELSE\n"
     "    -- With a period: the unfinished holder, else the newest made within it.\n"
     "    RETURN QUERY\n"
     "    SELECT DISTINCT ON (w.unique_key) w.* FROM work_items w\n"
     "    WHERE w.tenant_id = p_tenant AND w.queue = p_queue AND w.unique_key = ANY(keys)\n"
     "      AND (" + UNFINISHED + "\n"
     "           OR (spans ? w.unique_key AND " + WITHIN.format(key="w.unique_key") + "))\n"
     "      AND w.item_id NOT IN (SELECT (e->>'item_id')::uuid\n"
     "                            FROM jsonb_array_elements(p_items) AS e)\n"
     "    ORDER BY w.unique_key, " + UNFINISHED + " DESC, w.created_at DESC;\n"
     "    END IF;\n"),
    ("                        AND w.unique_key = k AND w.state IN ('waiting', 'ready', 'leased'))",
     "                        AND w.unique_key = k\n"
     "                        AND (" + UNFINISHED + "\n"
     "                             OR (spans ? k AND " + WITHIN.format(key="k") + ")))"),
)  # fmt: skip


def _rate_limits() -> ModuleType:
    return importlib.import_module("queue_server.migrations.versions.0032_rate_limits")


def _shards() -> ModuleType:
    return importlib.import_module("queue_server.migrations.versions.0028_admission_shards")


def admit_rows() -> str:
    text = _rate_limits().admit_rows()
    for old, new in EDITS:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


def upgrade() -> None:
    shards = _shards()
    home = shards._home()
    op.create_index(
        "ix_work_items_unique_made",
        "work_items",
        ["tenant_id", "queue", "unique_key", "created_at"],
        postgresql_where=sa.text("unique_key IS NOT NULL"),
        schema=home,
    )
    op.execute(shards._ddl(admit_rows(), home))


def downgrade() -> None:
    shards = _shards()
    home = shards._home()
    op.execute(shards._ddl(_rate_limits().admit_rows(), home))
    op.drop_index("ix_work_items_unique_made", table_name="work_items", schema=home)
