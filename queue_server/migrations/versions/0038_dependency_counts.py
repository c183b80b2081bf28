"""a waiting item counts the dependencies it still waits for, so the finish of a dependency
costs the same whether it is the first or the ten-thousandth of a fan-in, a held snapshot
or not

Migration 0035 read every dependency of a waiting dependent again at each finish, under
the dependent's row lock: cheap for a few, a reread of thousands for each item of a large
fan-in. The count is kept instead. The admission counts the dependencies an item waits for
(each once) into `dependencies_pending`, and so does the retry of a dependent. A change of
state of a dependency that meets the dependent's rule (completed; or, to run anyway, gone
to dead letters or cancelled) takes one off; one that unmeets it (a dependency run anyway,
replayed out of dead letters) puts one back; the dependent is released at nought.

Each change is a row appended to `dependency_tallies`, the count after it, never updated:
under the dependent's row lock, the trigger reads the dependent's newest tally (a probe of
the primary key, backwards, one row) and appends the next. Updating a counter on the
dependent's row would leave a dead version of that row per completion while any snapshot
is older (a pg_dump, a report), and every later completion of the fan-in would walk them
all. Tallies are numbered from one sequence, so after a retry deletes an item's tallies its
new ones sort above the deleted ones. So the trigger now also fires when a depended-on item
leaves a finished state.

Items waiting when this runs are counted from their dependencies.

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
     "    rule text;\n    was_met boolean;\n    is_met boolean;\n    left_to_wait int;\n"),
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
     "        IF is_met <> was_met THEN\n"
     "            -- Its count: the newest tally, else the one made at its enqueue (or retry).\n"
     "            SELECT t.pending INTO left_to_wait FROM dependency_tallies t\n"
     "            WHERE t.tenant_id = d.tenant_id AND t.item_id = d.item_id\n"
     "            ORDER BY t.seq DESC LIMIT 1;\n"
     "            left_to_wait := coalesce(left_to_wait, d.dependencies_pending)\n"
     "                            + CASE WHEN is_met THEN -1 ELSE 1 END;\n"
     "        END IF;\n"
     "        IF is_met <> was_met AND left_to_wait > 0 THEN\n"
     "            -- Still waiting (or, its dependency replayed, waiting again): appended.\n"
     "            INSERT INTO dependency_tallies (tenant_id, item_id, seq, pending, dependency)\n"
     "            VALUES (d.tenant_id, d.item_id, nextval('{home}.dependency_tallies_seq'),\n"
     "                    left_to_wait, NEW.item_id);\n"
     "        ELSIF is_met AND NOT was_met THEN\n"
     "            -- The last one it waited for: released.\n"
     "            UPDATE work_items w\n"
     "            SET state = 'ready', updated_at = statement_timestamp(),\n"
     "                event_seq = w.event_seq + 1\n"),
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

# 0037's admission: each new item's count of the dependencies it waits for (each once); a
# dependency already marked only locked.
ADMIT_EDITS = (
    ("                SELECT w.item_id FROM work_items w\n"
     "                WHERE w.tenant_id = p_tenant AND w.item_id = ANY(deps)\n"
     "                ORDER BY w.item_id FOR UPDATE\n"
     "            ), marked AS (\n"
     "                UPDATE work_items w SET has_dependents = true FROM locked l\n"
     "                WHERE w.tenant_id = p_tenant AND w.item_id = l.item_id\n"
     "                RETURNING w.item_id, w.state\n"
     "            )\n"
     "            SELECT coalesce(jsonb_object_agg(item_id, state), '{{}}') INTO dep_states\n"
     "            FROM marked;\n",
     "                SELECT w.item_id, w.state, w.has_dependents FROM work_items w\n"
     "                WHERE w.tenant_id = p_tenant AND w.item_id = ANY(deps)\n"
     "                ORDER BY w.item_id FOR UPDATE\n"
     "            ), marked AS (\n"
     "                -- Marked once (0038): one already marked is only locked, so an item\n"
     "                -- many enqueues depend on gets no new version of its row from each.\n"
     "                UPDATE work_items w SET has_dependents = true FROM locked l\n"
     "                WHERE w.tenant_id = p_tenant AND w.item_id = l.item_id\n"
     "                  AND NOT l.has_dependents\n"
     "            )\n"
     "            SELECT coalesce(jsonb_object_agg(item_id, state), '{{}}') INTO dep_states\n"
     "            FROM locked;\n"),
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


def edited(text: str, edits: Sequence[tuple[str, str]]) -> str:
    """`text` with each of `edits` (old, new) made, each old text found exactly once."""
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


def release() -> str:
    return edited(_module("0035_dependencies").RELEASE, RELEASE_EDITS)


def admit_rows() -> str:
    return edited(_module("0037_dependencies_in_one_request").admit_rows(), ADMIT_EDITS)


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
    op.execute(f"CREATE SEQUENCE {home}.dependency_tallies_seq AS bigint")
    op.create_table(
        "dependency_tallies",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("item_id", sa.Uuid(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("pending", sa.Integer(), nullable=False),
        sa.Column("dependency", sa.Uuid(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id", "item_id"],
            [f"{home}.work_items.tenant_id", f"{home}.work_items.item_id"],
            name=op.f("fk_dependency_tallies_item"),
            ondelete="CASCADE",
        ),
        sa.CheckConstraint("pending > 0", name=op.f("ck_dependency_tallies_pending_positive")),
        sa.PrimaryKeyConstraint("tenant_id", "item_id", "seq", name=op.f("pk_dependency_tallies")),
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
    op.drop_table("dependency_tallies", schema=home)
    op.execute(f"DROP SEQUENCE {home}.dependency_tallies_seq")
    op.drop_constraint(
        op.f("ck_work_items_dependencies_pending_not_negative"), "work_items", schema=home
    )
    op.drop_column("work_items", "dependencies_pending", schema=home)
