"""dependencies within one request: an item of a batch may depend on an item made by the same
batch (the API names it by its `ref`, the admission sees its id), so a whole graph of work is
enqueued atomically, under one idempotency key

Such a dependency is not looked up nor locked (no other transaction can see it before the
commit): it is not completed, so its dependent waits, and it is made already marked as
depended on. Only earlier items of the request may be named (the API checks it), so a
request cannot make a cycle.

Revision ID: 0037
Revises: 0036
Create Date: 2026-12-06
"""

import importlib
from collections.abc import Sequence
from types import ModuleType

from alembic import op

revision: str = "0037"
down_revision: str | Sequence[str] | None = "0036"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# 0035's admission: the request's own items left out of the look-up, and marked when made.
EDITS = (
    ("    deps uuid[];\n",
     "    deps uuid[];\n    made_here uuid[];\n"),
    ("                  ORDER BY 1);\n    IF cardinality(deps) > 0 THEN\n",
     "                  ORDER BY 1);\n"
     "    -- Items of this request depended on (0037): made below, not completed, not looked up.\n"
     "    made_here := ARRAY(SELECT (e->>'item_id')::uuid FROM jsonb_array_elements(p_items) AS e\n"
     "                       WHERE (e->>'item_id')::uuid = ANY(deps));\n"
     "    deps := ARRAY(SELECT d FROM unnest(deps) AS d WHERE d <> ALL(made_here) ORDER BY d);\n"
     "    IF cardinality(deps) + cardinality(made_here) > 0 THEN\n"),
    # A dependency made by this request is in no state yet read: `waiting` (never NULL,
    # which would make the test NULL and the item ready).
    ("                        WHERE NOT (dep_states->>(d::uuid::text) = 'completed'\n"
     "                                   OR (a.on_dependency_failure = 'run'\n"
     "                                       AND dep_states->>(d::uuid::text)\n"
     "                                           IN ('quarantined', 'cancelled'))))\n",
     "                        WHERE NOT (coalesce(dep_states->>(d::uuid::text), 'waiting')\n"
     "                                   = 'completed'\n"
     "                                   OR (a.on_dependency_failure = 'run'\n"
     "                                       AND coalesce(dep_states->>(d::uuid::text),\n"
     "                                                    'waiting')\n"
     "                                           IN ('quarantined', 'cancelled'))))\n"),
    ("                                partition_key, on_dependency_failure)\n",
     "                                partition_key, on_dependency_failure, has_dependents)\n"),
    ("                    ELSE coalesce(x.on_dependency_failure, 'cancel') END\n        FROM input x\n",
     "                    ELSE coalesce(x.on_dependency_failure, 'cancel') END,\n"
     "               x.item_id = ANY(made_here)\n"
     "        FROM input x\n"),
)  # fmt: skip


def _dependencies() -> ModuleType:
    return importlib.import_module("queue_server.migrations.versions.0035_dependencies")


def admit_rows() -> str:
    text: str = _dependencies().admit_rows()
    for old, new in EDITS:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


def upgrade() -> None:
    shards = _dependencies()._shards()
    op.execute(shards._ddl(admit_rows(), shards._home()))


def downgrade() -> None:
    shards = _dependencies()._shards()
    op.execute(shards._ddl(_dependencies().admit_rows(), shards._home()))
