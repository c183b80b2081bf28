"""the transactional enqueue takes dependencies too: `depends_on` (1 to 100 item ids) and
`on_dependency_failure` in each item of queue_server.enqueue_many, and as arguments of
queue_server.enqueue (the admission of migration 0035 does the rest)

A call without them keeps its fingerprint, as 0034's keys do.

Revision ID: 0036
Revises: 0035
Create Date: 2026-12-06
"""

import importlib
from collections.abc import Sequence
from types import ModuleType

from alembic import op

revision: str = "0036"
down_revision: str | Sequence[str] | None = "0035"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UUID_TEXT = "^[0-9a-fA-F]{{8}}-?([0-9a-fA-F]{{4}}-?){{3}}[0-9a-fA-F]{{12}}$"

# 0034's queue_server.enqueue_items, with the dependencies: let through, checked, part of the
# request's fingerprint only when given.
EDITS = (
    (", partition_key and ordering_key are known'",
     ", partition_key, ordering_key, depends_on and on_dependency_failure are known'"),
    ("'partition_key', 'ordering_key'))\n",
     "'partition_key', 'ordering_key', 'depends_on',\n"
     "                                'on_dependency_failure'))\n"),
    ("                  WHEN octet_length((e->'payload')::text) > 1048576\n",
     "                  WHEN jsonb_typeof(e->'depends_on') NOT IN ('array', 'null')\n"
     "                      THEN 'depends_on must be an array of item ids'\n"
     "                  WHEN jsonb_typeof(e->'depends_on') = 'array'\n"
     "                   AND jsonb_array_length(e->'depends_on') NOT BETWEEN 1 AND 100\n"
     "                      THEN 'depends_on must name 1 to 100 items'\n"
     "                  WHEN jsonb_typeof(e->'depends_on') = 'array' AND EXISTS (\n"
     "                           SELECT 1 FROM jsonb_array_elements(e->'depends_on') AS d\n"
     "                           WHERE jsonb_typeof(d) <> 'string'\n"
     "                              OR d #>> '{{}}' !~ '" + UUID_TEXT + "')\n"
     "                      THEN 'depends_on must be item ids (UUIDs)'\n"
     "                  WHEN jsonb_typeof(e->'on_dependency_failure') NOT IN ('string', 'null')\n"
     "                    OR e->>'on_dependency_failure' NOT IN ('cancel', 'run', 'wait')\n"
     "                      THEN 'on_dependency_failure must be cancel, run or wait'\n"
     "                  WHEN octet_length((e->'payload')::text) > 1048576\n"),
    ("               'ordering_key', e->>'ordering_key')) ORDER BY i)\n",
     "               'ordering_key', e->>'ordering_key',\n"
     "               -- The dependencies (0036), as the admission reads them.\n"
     "               'depends_on', e->'depends_on',\n"
     "               'on_dependency_failure', e->>'on_dependency_failure')) ORDER BY i)\n"),
)  # fmt: skip

# queue_server.enqueue, with the dependencies as arguments after 0034's.
ENQUEUE_EDITS = (
    ("                                     ordering_key text DEFAULT NULL)\n",
     "                                     ordering_key text DEFAULT NULL,\n"
     "                                     depends_on uuid[] DEFAULT NULL,\n"
     "                                     on_dependency_failure text DEFAULT NULL)\n"),
    ("                'partition_key', partition_key, 'ordering_key', ordering_key))),\n",
     "                'partition_key', partition_key, 'ordering_key', ordering_key,\n"
     "                'depends_on', to_jsonb(depends_on),\n"
     "                'on_dependency_failure', on_dependency_failure))),\n"),
)  # fmt: skip


def _keys() -> ModuleType:
    return importlib.import_module("queue_server.migrations.versions.0034_transactional_keys")


SIGNATURE = _keys().SIGNATURE.removesuffix(")") + ", uuid[], text)"


def enqueue_items() -> str:
    return str(_keys()._edited(_keys().enqueue_items(), EDITS))


def enqueue() -> str:
    return str(_keys()._edited(_keys().enqueue(), ENQUEUE_EDITS))


def upgrade() -> None:
    keys = _keys()
    home = keys._home()
    op.execute(keys._ddl(enqueue_items(), home))
    op.execute(f"DROP FUNCTION {keys.SIGNATURE}")
    keys._enqueue(enqueue(), SIGNATURE, home)


def downgrade() -> None:
    keys = _keys()
    home = keys._home()
    op.execute(f"DROP FUNCTION {SIGNATURE}")
    keys._enqueue(keys.enqueue(), keys.SIGNATURE, home)
    op.execute(keys._ddl(keys.enqueue_items(), home))
