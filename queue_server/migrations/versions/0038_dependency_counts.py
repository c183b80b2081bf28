"""a waiting item counts the dependencies it still waits for (`dependencies_pending`), so
the finish of a dependency costs the same whether it is the first or the ten-thousandth of a
fan-in

Migration 0035 read every dependency of a waiting dependent again at each finish: cheap for a
few, but a callback over 10,000 items, whose items finish in the order they were enqueued
(their ids' order, which the read walks), reread the finished ones each time, about 50
million probes in all, each under the dependent's row lock. The count is kept on the
dependent instead, under that same lock: a dependency's change of state that meets the
dependent's rule (completed; or, to run anyway, gone to dead letters or cancelled) takes one
off, a change that unmeets it (a dependency run anyway replayed out of dead letters) puts one
back, and the dependent is released when it reaches nought. So the trigger now also fires
when a depended-on item leaves a finished state.

The admission sets the count (each dependency once) and the retry of a dependent sets it
again; items waiting when this runs are counted from their dependencies.

Revision ID: 0038
Revises: 0037
Create Date: 2026-12-06
"""

import importlib
from collections.abc import Sequence
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision: str = "0038"
down_revision: str | Sequence[str] | None = "0037"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FINISHED = "('completed', 'quarantined', 'cancelled')"

# 0035's trigger function, the dependent's dependencies counted instead of read again.
RELEASE_EDITS = (
    ("CREATE FUNCTION queue_server.release_dependents()",
     "CREATE OR REPLACE FUNCTION queue_server.release_dependents()"),
    ("    rule text;\n",
     "    rule text;\n    was_met boolean;\n    is_met boolean;\n"),
    ("        CONTINUE WHEN NOT FOUND OR d.state <> 'waiting';\n"
     "        rule := coalesce(d.on_dependency_failure, 'cancel');\n"
     "        IF NEW.state = 'completed' OR rule = 'run' THEN\n"
     "            -- Released when none of its dependencies is unfinished (nor, unless it runs\n"
     "            -- anyway, failed).\n"
     "            CONTINUE WHEN EXISTS (\n"
     "                SELECT 1 FROM item_dependencies x\n"
     "                JOIN work_items w ON w.tenant_id = x.tenant_id AND w.item_id = x.depends_on\n"
     "                WHERE x.tenant_id = d.tenant_id AND x.item_id = d.item_id\n"
     "                  AND NOT (w.state = 'completed'\n"
     "                           OR (rule = 'run' AND w.state IN ('quarantined', 'cancelled'))));\n"
     "            UPDATE work_items w\n"
     "            SET state = 'ready', updated_at = statement_timestamp(), event_seq = w.event_seq + 1\n",
     "        CONTINUE WHEN NOT FOUND OR d.state <> 'waiting' OR d.dependencies_pending IS NULL;\n"
     "        rule := coalesce(d.on_dependency_failure, 'cancel');\n"
     "        -- Does this dependency meet the dependent's rule, before and after (0038)?\n"
     "        was_met := OLD.state = 'completed'\n"
     "                   OR (rule = 'run' AND OLD.state IN ('quarantined', 'cancelled'));\n"
     "        is_met := NEW.state = 'completed'\n"
     "                  OR (rule = 'run' AND NEW.state IN ('quarantined', 'cancelled'));\n"
     "        IF is_met AND NOT was_met AND d.dependencies_pending > 1 THEN\n"
     "            UPDATE work_items w SET dependencies_pending = w.dependencies_pending - 1\n"
     "            WHERE w.tenant_id = d.tenant_id AND w.item_id = d.item_id;\n"
     "        ELSIF was_met AND NOT is_met THEN\n"
     "            -- Replayed out of dead letters while run anyway: waited for again.\n"
     "            UPDATE work_items w SET dependencies_pending = w.dependencies_pending + 1\n"
     "            WHERE w.tenant_id = d.tenant_id AND w.item_id = d.item_id;\n"
     "        ELSIF is_met AND NOT was_met THEN\n"
     "            -- The last one it waited for: released.\n"
     "            UPDATE work_items w\n"
     "            SET state = 'ready', dependencies_pending = 0,\n"
     "                updated_at = statement_timestamp(), event_seq = w.event_seq + 1\n"),
    ("        ELSIF rule = 'cancel' THEN\n",
     "        ELSIF rule = 'cancel' AND NEW.state IN ('quarantined', 'cancelled') THEN\n"),
)  # fmt: skip

TRIGGER = f"""CREATE TRIGGER work_items_dependencies AFTER UPDATE OF state ON work_items
FOR EACH ROW WHEN (NEW.has_dependents AND OLD.state IS DISTINCT FROM NEW.state
                   AND (NEW.state IN {FINISHED} OR OLD.state IN {FINISHED}))
EXECUTE FUNCTION queue_server.release_dependents()
"""

# The dependencies an item waits for, given its rule: neither completed nor, to run anyway,
# failed for good. (States read as text: an enum value added in this upgrade's transaction,
# `waiting`, may not be named in it.)
UNMET = """(SELECT count(*) FROM item_dependencies x
             JOIN work_items d ON d.tenant_id = x.tenant_id AND d.item_id = x.depends_on
             WHERE x.tenant_id = w.tenant_id AND x.item_id = w.item_id
               AND NOT (d.state::text = 'completed'
                        OR (w.on_dependency_failure = 'run'
                            AND d.state::text IN ('quarantined', 'cancelled'))))"""

# 0037's admission: each new item's count of the dependencies it waits for (each once).
ADMIT_EDITS = (
    ("               -- Waiting while a dependency is not completed (nor failed, to run anyway).\n"
     "               CASE WHEN EXISTS (\n"
     "                        SELECT 1 FROM jsonb_array_elements_text(a.depends_on) AS d\n"
     "                        WHERE NOT (coalesce(dep_states->>(d::uuid::text), 'waiting')\n"
     "                                   = 'completed'\n"
     "                                   OR (a.on_dependency_failure = 'run'\n"
     "                                       AND coalesce(dep_states->>(d::uuid::text),\n"
     "                                                    'waiting')\n"
     "                                           IN ('quarantined', 'cancelled'))))\n"
     "                        THEN 'waiting'\n",
     "               -- Waiting while a dependency is not completed (nor failed, to run anyway).\n"
     "               CASE WHEN a.pending > 0 THEN 'waiting'\n"),
    ("                     row_number() OVER (PARTITION BY g.ordering_key ORDER BY g.i) AS nth\n",
     "                     row_number() OVER (PARTITION BY g.ordering_key ORDER BY g.i) AS nth,\n"
     "                     -- The dependencies it waits for, each once (0038).\n"
     "                     (SELECT count(DISTINCT d::uuid)\n"
     "                      FROM jsonb_array_elements_text(g.depends_on) AS d\n"
     "                      WHERE NOT (coalesce(dep_states->>(d::uuid::text), 'waiting')\n"
     "                                 = 'completed'\n"
     "                                 OR (g.on_dependency_failure = 'run'\n"
     "                                     AND coalesce(dep_states->>(d::uuid::text), 'waiting')\n"
     "                                         IN ('quarantined', 'cancelled')))) AS pending\n"),
    ("                                partition_key, on_dependency_failure, has_dependents)\n",
     "                                partition_key, on_dependency_failure, has_dependents,\n"
     "                                dependencies_pending)\n"),
    ("               x.item_id = ANY(made_here)\n        FROM input x\n",
     "               x.item_id = ANY(made_here),\n"
     "               CASE WHEN x.depends_on IS NULL THEN NULL ELSE x.pending END\n"
     "        FROM input x\n"),
)  # fmt: skip


def _module(name: str) -> ModuleType:
    return importlib.import_module(f"queue_server.migrations.versions.{name}")


def _edited(text: str, edits: Sequence[tuple[str, str]]) -> str:
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


def release() -> str:
    return _edited(_module("0035_dependencies").RELEASE, RELEASE_EDITS)


def admit_rows() -> str:
    return _edited(_module("0037_dependencies_in_one_request").admit_rows(), ADMIT_EDITS)


def upgrade() -> None:
    shards = _module("0028_admission_shards")
    home = shards._home()
    op.add_column(
        "work_items",
        sa.Column("dependencies_pending", sa.Integer(), nullable=True),
        schema=home,
    )
    op.create_check_constraint(
        op.f("ck_work_items_dependencies_pending_not_negative"),
        "work_items",
        "dependencies_pending >= 0",
        schema=home,
    )
    op.execute(
        f"UPDATE {home}.work_items w SET dependencies_pending = {UNMET}"
        " WHERE w.on_dependency_failure IS NOT NULL AND w.state::text = 'waiting'"
    )
    op.execute(shards._ddl(release(), home))
    op.execute(f"DROP TRIGGER work_items_dependencies ON {home}.work_items")
    op.execute(TRIGGER.replace("ON work_items", f"ON {home}.work_items"))
    op.execute(shards._ddl(admit_rows(), home))


def downgrade() -> None:
    shards = _module("0028_admission_shards")
    home = shards._home()
    dependencies = _module("0035_dependencies")
    op.execute(shards._ddl(_module("0037_dependencies_in_one_request").admit_rows(), home))
    op.execute(f"DROP TRIGGER work_items_dependencies ON {home}.work_items")
    op.execute(dependencies.TRIGGER.replace("ON work_items", f"ON {home}.work_items"))
    op.execute(
        shards._ddl(
            dependencies.RELEASE.replace(
                "CREATE FUNCTION queue_server.release_dependents()",
                "CREATE OR REPLACE FUNCTION queue_server.release_dependents()",
            ),
            home,
        )
    )
    op.drop_constraint(
        op.f("ck_work_items_dependencies_pending_not_negative"), "work_items", schema=home
    )
    op.drop_column("work_items", "dependencies_pending", schema=home)
