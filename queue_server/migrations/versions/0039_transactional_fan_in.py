"""the transactional enqueue names up to 10,000 dependencies: a fan-in of 10,000 items is
enqueued in one transaction of the application's, all or nothing

An item of queue_server.enqueue_many (and queue_server.enqueue's `depends_on`) names 1 to
10,000 items, as a REST batch's callback may (0038 counts them once each, whatever their
number); the items of one call name at most 10,000 in all. An application enqueues its
10,000 items in calls of 500, then the callback naming them all, and commits once.

Revision ID: 0039
Revises: 0038
Create Date: 2026-12-06
"""

import importlib
from collections.abc import Sequence
from types import ModuleType

from alembic import op

revision: str = "0039"
down_revision: str | Sequence[str] | None = "0038"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# 0036's queue_server.enqueue_items: the bound per item raised, and one over the call.
EDITS = (
    ("                   AND jsonb_array_length(e->'depends_on') NOT BETWEEN 1 AND 100\n"
     "                      THEN 'depends_on must name 1 to 100 items'\n",
     "                   AND jsonb_array_length(e->'depends_on') NOT BETWEEN 1 AND 10000\n"
     "                      THEN 'depends_on must name 1 to 10,000 items'\n"),
    ("    ELSE\n"
     "        -- One CASE, its branches in order: a cast is reached only once the type is known.\n",
     "    ELSIF (SELECT coalesce(sum(jsonb_array_length(e->'depends_on')), 0)\n"
     "           FROM jsonb_array_elements(p_items) AS e\n"
     "           WHERE jsonb_typeof(e) = 'object' AND jsonb_typeof(e->'depends_on') = 'array')\n"
     "          > 10000 THEN\n"
     "        bad := 'the items of a call name at most 10,000 dependencies in all.';\n"
     "    ELSE\n"
     "        -- One CASE, its branches in order: a cast is reached only once the type is known.\n"),
)  # fmt: skip


def _dependencies() -> ModuleType:
    return importlib.import_module(
        "queue_server.migrations.versions.0036_transactional_dependencies"
    )


def enqueue_items() -> str:
    counts = importlib.import_module("queue_server.migrations.versions.0038_dependency_counts")
    return str(counts.edited(_dependencies().enqueue_items(), EDITS))


def upgrade() -> None:
    keys = _dependencies()._keys()
    op.execute(keys._ddl(enqueue_items(), keys._home()))


def downgrade() -> None:
    keys = _dependencies()._keys()
    op.execute(keys._ddl(_dependencies().enqueue_items(), keys._home()))
