"""an admission waiting for room that other transactions hold looks again less and less
often, up to every 50 ms, instead of every 5 ms

queue_server.admission_shards (0028) waits, when the room left under the cap lies in shards
other transactions hold, for their commits by looking again every 5 ms, up to the session's
lock_timeout (10 s when it has none). At the cap with a transaction left open (an
application's request, a forgotten `BEGIN`), every admitting session looked 200 times a
second for as long: 24 sessions kept one core of the database busy doing nothing else.
Each look now waits twice as long as the one before, from 5 ms up to 50 ms, so a session
that waits the whole 10 s looks about 200 times instead of 2,000; a commit that frees room
is still seen within 5 to 50 ms.

Revision ID: 0043
Revises: 0042
Create Date: 2026-12-07
"""

import importlib
from collections.abc import Sequence
from types import ModuleType

from alembic import op

revision: str = "0043"
down_revision: str | Sequence[str] | None = "0042"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BACK_OFF = (
    ("CREATE FUNCTION queue_server.admission_shards(",
     "CREATE OR REPLACE FUNCTION queue_server.admission_shards("),
    ("    deadline timestamptz := clock_timestamp() + patience;\n",
     "    deadline timestamptz := clock_timestamp() + patience;\n"
     "    pause double precision := 0.005;\n"),
    ("            PERFORM pg_sleep(0.005);\n",
     "            -- Each look waits twice as long as the one before, up to 50 ms.\n"
     "            PERFORM pg_sleep(pause);\n"
     "            pause := least(pause * 2, 0.05);\n"),
)  # fmt: skip


def _counts() -> ModuleType:
    """0038, whose helpers find a migration module and make edits to a function's text."""
    return importlib.import_module("queue_server.migrations.versions.0038_dependency_counts")


def admission_shards(edits: Sequence[tuple[str, str]]) -> str:
    """0028's queue_server.admission_shards with `edits` made."""
    counts = _counts()
    return str(counts.edited(counts._module("0028_admission_shards").ADMISSION_SHARDS, edits))


def upgrade() -> None:
    shards = _counts()._module("0028_admission_shards")
    op.execute(shards._ddl(admission_shards(BACK_OFF), shards._home()))


def downgrade() -> None:
    shards = _counts()._module("0028_admission_shards")
    op.execute(shards._ddl(admission_shards(BACK_OFF[:1]), shards._home()))
