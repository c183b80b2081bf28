"""a watcher's outbox rows are numbered holding its lock, so they go out in the order their
writers committed

The outbox_admit trigger (0014) admits each row a transition writes while holding its
watcher's row lock to the commit; a backfill holds the same lock while it writes the missed
events. A row's `seq` (the order a watcher's claimed rows are sent in) was drawn before the
trigger, when the statement formed the row: a transition whose statement began while a
backfill's was running, and drew its number before the backfill drew its rows', waited for
the lock and then kept a number lower than theirs, so its later event went out before the
backfilled ones. 0014 numbered a row again only when the watcher had changed after the
row's statement began, which misses that case. The row is now numbered again every time,
once the lock is held: every row of the watcher committed before has a lower number. It is
due no earlier than the watcher's last change, as before.

Revision ID: 0041
Revises: 0040
Create Date: 2026-12-06
"""

import importlib
from collections.abc import Sequence
from types import ModuleType

from alembic import op

revision: str = "0041"
down_revision: str | Sequence[str] | None = "0040"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# 0014's renumbering, taken only when the watcher changed after the row's statement began:
# from this line to its END IF.
SOMETIMES = "            IF touched > NEW.created_at THEN\n"
ALWAYS = """            -- Numbered holding the watcher's lock (to the commit): after every row of the
            -- watcher that a writer holding it before committed, a backfill's among them
            -- (whose statement may have begun before this one and numbered its rows after
            -- this row's default was drawn). Due no earlier than the watcher's last change.
            NEW.seq := nextval(pg_get_serial_sequence('outbox_deliveries', 'seq'));
            NEW.due_at := greatest(NEW.due_at, touched);
"""


def _shards() -> ModuleType:
    return importlib.import_module("queue_server.migrations.versions.0028_admission_shards")


def _cap() -> ModuleType:
    return importlib.import_module("queue_server.migrations.versions.0014_watcher_outbox_cap")


def _outbox_admit(home: str, *, always: bool) -> str:
    """0014's trigger function, created or replaced in `home`; with `always`, its row is
    numbered again every time."""
    text: str = _cap().OUTBOX_ADMIT
    if always:
        start = text.index(SOMETIMES)
        end = text.index("            END IF;\n", start) + len("            END IF;\n")
        text = text[:start] + ALWAYS + text[end:]
    return text.replace(
        "CREATE FUNCTION outbox_admit()", f"CREATE OR REPLACE FUNCTION {home}.outbox_admit()"
    )


def upgrade() -> None:
    op.execute(_outbox_admit(_shards()._home(), always=True))


def downgrade() -> None:
    op.execute(_outbox_admit(_shards()._home(), always=False))
