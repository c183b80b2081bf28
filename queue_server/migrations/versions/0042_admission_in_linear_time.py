"""the admission costs the same per item whatever the size of its batch, plans its
statements once per session, and sends no notification

Three statements of the admission compared each item of a call with every other: the
`enqueued` ledger rows looked the item's dependencies up in the whole batch (a subquery
per row), each item found its admission shard by its place in the list of items admitted
(`array_position`), and queue_server.enqueue_items found the item answering each one given
by searching every item made. A batch of 500 (a REST batch, an application's
`enqueue_many`) made 250,000 comparisons in each: a third of the database's time in a
batch enqueue. Each is now a join on a key.

And each statement of the admission was planned afresh at every call (PostgreSQL plans a
PL/pgSQL statement anew for its first five runs in a session and then keeps doing so when
it guesses a plan for the values at hand may be cheaper): two fifths of the database's
time in a single `queue_server.enqueue`. The admission's statements are probes by key and
joins on the call's own items, whose best plan does not depend on the values, so both
functions keep one plan per session (`plan_cache_mode = force_generic_plan`, for their
own statements and those they run).

And the admission no longer sends a notification on the ready channel. PostgreSQL takes
one lock for every transaction that has notified, at its commit, and holds it through the
commit's flush to disk: the transactions of an application that enqueue in them committed
one at a time, 16 connections barely faster than one. The server's processes find the
rows made ready instead (store/channels.py, placed_since: the rows placed since their last
look, by transaction id, while acquires wait).

Revision ID: 0042
Revises: 0041
Create Date: 2026-12-07
"""

import importlib
from collections.abc import Sequence
from types import ModuleType

from alembic import op

revision: str = "0042"
down_revision: str | Sequence[str] | None = "0041"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SEARCH_PATH = "SET search_path = {home}, pg_temp\n"
ONE_PLAN = (SEARCH_PATH, SEARCH_PATH + "SET plan_cache_mode = force_generic_plan\n")

# 0038's queue_server.admit_rows.
ADMIT_EDITS = (
    ONE_PLAN,
    ("    END IF;\n"
     "    PERFORM pg_notify('queue_server_ready', queue_server.ready_tag(p_tenant, p_queue));\n"
     "END\n",
     "    END IF;\n"
     "    -- No notification: the waiters' processes look for the rows placed since their\n"
     "    -- last look (store/channels.py, placed_since).\n"
     "END\n"),
    ("        FROM (SELECT g.*, shards[array_position(fresh, g.i)] AS shard,\n",
     "        FROM (SELECT g.*, shards[f.place] AS shard,\n"),
    ("              FROM given g\n"
     "              WHERE g.i = ANY(fresh)) AS a\n",
     "              FROM given g\n"
     "              JOIN unnest(fresh) WITH ORDINALITY AS f(i, place) ON f.i = g.i) AS a\n"),
    ("               || coalesce((SELECT jsonb_build_object('depends_on', x.depends_on,\n"
     "                                                      'on_dependency_failure',\n"
     "                                                      ins.on_dependency_failure)\n"
     "                            FROM input x\n"
     "                            WHERE x.item_id = ins.item_id AND x.depends_on IS NOT NULL),\n"
     "                           '{{}}'::jsonb)\n",
     "               || CASE WHEN x.given_for IS NULL THEN '{{}}'::jsonb\n"
     "                       ELSE jsonb_build_object('depends_on', x.given_depends_on,\n"
     "                                               'on_dependency_failure',\n"
     "                                               ins.on_dependency_failure) END\n"),
    ("                                'traceparent', traceparent, 'tracestate', tracestate))) END\n"
     "        FROM ins\n",
     "                                'traceparent', traceparent, 'tracestate', tracestate))) END\n"
     "        FROM ins\n"
     "        LEFT JOIN (SELECT item_id AS given_for, depends_on AS given_depends_on FROM input\n"
     "                   WHERE depends_on IS NOT NULL) AS x ON x.given_for = ins.item_id\n"),
)  # fmt: skip

# 0039's queue_server.enqueue_items: the item answering each one given, by joins on the
# item's id and on its unique key's first holder, not a search of every item made.
ITEMS_EDITS = (
    ONE_PLAN,
    ("    CROSS JOIN LATERAL (\n"
     "        SELECT u FROM unnest(made) AS u\n"
     "        WHERE (u).item_id = ids[x.i] OR (u).unique_key = x.s->>'unique_key'\n"
     "        ORDER BY (u).item_id = ids[x.i] DESC, (u).item_id\n"
     "        LIMIT 1) AS r(w);\n",
     "    LEFT JOIN (SELECT u FROM unnest(made) AS u) AS own(w) ON (own.w).item_id = ids[x.i]\n"
     "    LEFT JOIN (SELECT DISTINCT ON ((u).unique_key) u FROM unnest(made) AS u\n"
     "               WHERE (u).unique_key IS NOT NULL\n"
     "               ORDER BY (u).unique_key, (u).item_id) AS holder(w)\n"
     "        ON (holder.w).unique_key = x.s->>'unique_key'\n"
     "    CROSS JOIN LATERAL (SELECT coalesce(own.w, holder.w)) AS r(w);\n"),
)  # fmt: skip


def _counts() -> ModuleType:
    """0038, whose helpers find a migration module and make edits to a function's text."""
    return importlib.import_module("queue_server.migrations.versions.0038_dependency_counts")


def admit_rows() -> str:
    counts = _counts()
    return str(counts.edited(counts.admit_rows(), ADMIT_EDITS))


def enqueue_items() -> str:
    counts = _counts()
    fan_in = counts._module("0039_transactional_fan_in")
    return str(counts.edited(fan_in.enqueue_items(), ITEMS_EDITS))


def upgrade() -> None:
    counts = _counts()
    shards = counts._module("0028_admission_shards")
    keys = counts._module("0034_transactional_keys")
    home = shards._home()
    op.execute(shards._ddl(admit_rows(), home))
    op.execute(keys._ddl(enqueue_items(), home))


def downgrade() -> None:
    counts = _counts()
    shards = counts._module("0028_admission_shards")
    keys = counts._module("0034_transactional_keys")
    home = shards._home()
    op.execute(shards._ddl(counts.admit_rows(), home))
    op.execute(keys._ddl(counts._module("0039_transactional_fan_in").enqueue_items(), home))
