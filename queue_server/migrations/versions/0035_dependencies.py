"""dependencies: an enqueued item may name items of its tenant it depends on (`depends_on`);
it is `waiting` until every one has completed, and made ready in the transaction of the last
completion, with an `unblocked` ledger row naming that dependency. A dependency that fails
for good (dead letter, cancelled) applies the dependent's `on_dependency_failure`: `cancel`
it (the default; its own dependents follow), `run` it anyway, or keep it `wait`ing until
the dependency is replayed and completes

Who depends on whom is `item_dependencies`, written once at enqueue and never updated (a
probe by the dependency's id finds its dependents, whatever history lies elsewhere). An item
depended on is marked (`has_dependents`): the trigger that releases its dependents runs only
for such items, so a completion of any other item pays nothing for it. Both sides take the
same row lock before they look: the admission marks each dependency (an update, in id
order), and a dependency's finishing transition holds its row's lock; so an enqueue racing
the completion of its dependency either sees it completed or is seen by it. Each dependent is
locked before its dependencies are read, so two dependencies completing at once on two
connections are read one after the other's commit, and the later one releases it.

The acquire is untouched: a waiting item is not ready, so no acquire reads it. A waiting item
is in the backlog (admitted, not released), as an item behind its ordering key is.

Revision ID: 0035
Revises: 0034
Create Date: 2026-12-06
"""

import importlib
from collections.abc import Sequence
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision: str = "0035"
down_revision: str | Sequence[str] | None = "0034"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RULES = ("cancel", "run", "wait")
FINISHED = "('completed', 'quarantined', 'cancelled')"

# After a marked item finishes (completed, to dead letters, cancelled): each of its
# dependents still waiting, locked, is read again and released, cancelled or left waiting.
RELEASE = """CREATE FUNCTION queue_server.release_dependents() RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = {home}, pg_temp
AS $fn$
DECLARE
    dependent uuid;
    d work_items%ROWTYPE;
    rule text;
    moved work_items%ROWTYPE;
BEGIN
    FOR dependent IN SELECT x.item_id FROM item_dependencies x
                WHERE x.tenant_id = NEW.tenant_id AND x.depends_on = NEW.item_id
                ORDER BY x.item_id LOOP
        -- Locked before it is read: a dependency finishing at once on another connection
        -- waits here for this transaction, then reads what it committed (a new statement).
        PERFORM 1 FROM work_items w
        WHERE w.tenant_id = NEW.tenant_id AND w.item_id = dependent FOR UPDATE;
        SELECT * INTO d FROM work_items w
        WHERE w.tenant_id = NEW.tenant_id AND w.item_id = dependent;
        CONTINUE WHEN NOT FOUND OR d.state <> 'waiting';
        rule := coalesce(d.on_dependency_failure, 'cancel');
        IF NEW.state = 'completed' OR rule = 'run' THEN
            -- Released when none of its dependencies is unfinished (nor, unless it runs
            -- anyway, failed).
            CONTINUE WHEN EXISTS (
                SELECT 1 FROM item_dependencies x
                JOIN work_items w ON w.tenant_id = x.tenant_id AND w.item_id = x.depends_on
                WHERE x.tenant_id = d.tenant_id AND x.item_id = d.item_id
                  AND NOT (w.state = 'completed'
                           OR (rule = 'run' AND w.state IN ('quarantined', 'cancelled'))));
            UPDATE work_items w
            SET state = 'ready', updated_at = statement_timestamp(), event_seq = w.event_seq + 1
            WHERE w.tenant_id = d.tenant_id AND w.item_id = d.item_id
            RETURNING w.* INTO moved;
            INSERT INTO item_events (tenant_id, item_id, seq, at, kind, fence, actor, data)
            VALUES (moved.tenant_id, moved.item_id, moved.event_seq - 1, moved.updated_at,
                    'unblocked', moved.fence, 'server',
                    jsonb_build_object('dependency', NEW.item_id::text,
                                       'dependency_state', NEW.state));
            PERFORM pg_notify('queue_server_ready',
                              queue_server.ready_tag(moved.tenant_id, moved.queue));
        ELSIF rule = 'cancel' THEN
            -- As a cancel does (store/sql/transitions.sql `cancel`): the ledger, the
            -- backlog, the watchers. Its own dependents follow, by this trigger on it.
            UPDATE work_items w
            SET state = 'cancelled', updated_at = statement_timestamp(),
                event_seq = w.event_seq + 1
            WHERE w.tenant_id = d.tenant_id AND w.item_id = d.item_id
            RETURNING w.* INTO moved;
            INSERT INTO item_events (tenant_id, item_id, seq, at, kind, fence, actor, data)
            VALUES (moved.tenant_id, moved.item_id, moved.event_seq - 1, moved.updated_at,
                    'cancelled', moved.fence, 'server',
                    jsonb_build_object('reason', format('its dependency %s is %s',
                                                        NEW.item_id, NEW.state),
                                       'previous_state', 'waiting',
                                       'dependency', NEW.item_id::text,
                                       'dependency_state', NEW.state));
            INSERT INTO counter_deltas (tenant_id, queue, shard, released, cancelled)
            VALUES (moved.tenant_id, moved.queue, moved.admission_shard, 1, 1);
            INSERT INTO outbox_deliveries (tenant_id, watcher_id, delivery_key, event, item_id,
                                           queue, body, state, next_attempt_at, due_at,
                                           created_at, updated_at)
            SELECT moved.tenant_id, w.watcher_id,
                   delivery_key(w.watcher_id, moved.item_id, moved.event_seq - 1),
                   'item.cancelled', moved.item_id, moved.queue,
                   jsonb_build_object('event', 'item.cancelled',
                                      'occurred_at', api_timestamp(statement_timestamp()),
                                      'item', item_json(moved)),
                   'pending', statement_timestamp(), statement_timestamp(),
                   statement_timestamp(), statement_timestamp()
            FROM watchers w
            WHERE w.tenant_id = moved.tenant_id AND w.state = 'active'
              AND 'item.cancelled' = ANY(w.events)
              AND (w.queues IS NULL OR moved.queue = ANY(w.queues))
            ORDER BY w.watcher_id;
        END IF;
    END LOOP;
    RETURN NULL;
END
$fn$
"""

TRIGGER = f"""CREATE TRIGGER work_items_dependencies AFTER UPDATE OF state ON work_items
FOR EACH ROW WHEN (NEW.has_dependents AND OLD.state IS DISTINCT FROM NEW.state
                   AND NEW.state IN {FINISHED})
EXECUTE FUNCTION queue_server.release_dependents()
"""

# 0033's admission, with the dependencies: each item depended on is of this tenant, marked
# and locked (in id order); an item waits while one of its dependencies is not completed.
EDITS = (
    ("    busy text[] := '{{}}';\n",
     "    busy text[] := '{{}}';\n"
     "    deps uuid[];\n"
     "    dep_states jsonb := '{{}}';\n"
     "    refused text;\n"),
    ("    -- A cap stored under a looser policy is held to the loaded one.\n",
     "    -- The items depended on (migration 0035), each once: each of this tenant, marked as\n"
     "    -- depended on, which locks it (in id order) until this transaction ends; its\n"
     "    -- finishing transition locks it too, so it either finished before this look or\n"
     "    -- sees the dependents made here.\n"
     "    deps := ARRAY(SELECT DISTINCT d::uuid FROM jsonb_array_elements(p_items) AS e,\n"
     "                  jsonb_array_elements_text(coalesce(e->'depends_on', '[]')) AS d\n"
     "                  ORDER BY 1);\n"
     "    IF cardinality(deps) > 0 THEN\n"
     "        SELECT format('items[%s]: an item with depends_on takes no ordering_key.', i - 1)\n"
     "            INTO refused\n"
     "        FROM jsonb_array_elements(p_items) WITH ORDINALITY AS x(e, i)\n"
     "        WHERE e ? 'depends_on' AND e->>'ordering_key' IS NOT NULL ORDER BY i LIMIT 1;\n"
     "        IF refused IS NULL THEN\n"
     "            WITH locked AS (\n"
     "                SELECT w.item_id FROM work_items w\n"
     "                WHERE w.tenant_id = p_tenant AND w.item_id = ANY(deps)\n"
     "                ORDER BY w.item_id FOR UPDATE\n"
     "            ), marked AS (\n"
     "                UPDATE work_items w SET has_dependents = true FROM locked l\n"
     "                WHERE w.tenant_id = p_tenant AND w.item_id = l.item_id\n"
     "                RETURNING w.item_id, w.state\n"
     "            )\n"
     "            SELECT coalesce(jsonb_object_agg(item_id, state), '{{}}') INTO dep_states\n"
     "            FROM marked;\n"
     "            SELECT format('depends_on: no item %s in tenant %s.', d, p_tenant) INTO refused\n"
     "            FROM unnest(deps) AS d WHERE NOT dep_states ? d::text LIMIT 1;\n"
     "        END IF;\n"
     "        IF refused IS NULL THEN\n"
     "            -- A dependency already failed for good, and the item would be cancelled.\n"
     "            SELECT format('items[%s]: its dependency %s is %s (on_dependency_failure'\n"
     "                          ' cancel).', i - 1, d, dep_states->>(d::uuid::text)) INTO refused\n"
     "            FROM jsonb_array_elements(p_items) WITH ORDINALITY AS x(e, i),\n"
     "                 jsonb_array_elements_text(coalesce(e->'depends_on', '[]')) AS d\n"
     "            WHERE dep_states->>(d::uuid::text) IN ('quarantined', 'cancelled')\n"
     "              AND coalesce(e->>'on_dependency_failure', 'cancel') = 'cancel'\n"
     "            ORDER BY i LIMIT 1;\n"
     "        END IF;\n"
     "        IF refused IS NOT NULL THEN\n"
     "            RAISE EXCEPTION 'invalid-request' USING ERRCODE = 'QS400', DETAIL = refused;\n"
     "        END IF;\n"
     "    END IF;\n"
     "    -- A cap stored under a looser policy is held to the loaded one.\n"),
    ("                     partition_key text))\n"
     "             WITH ORDINALITY AS x(item_id, payload, priority, delay, max_acquisitions,\n"
     "                                  traceparent, tracestate, unique_key, ordering_key,\n"
     "                                  partition_key, i)\n",
     "                     partition_key text, depends_on jsonb, on_dependency_failure text))\n"
     "             WITH ORDINALITY AS x(item_id, payload, priority, delay, max_acquisitions,\n"
     "                                  traceparent, tracestate, unique_key, ordering_key,\n"
     "                                  partition_key, depends_on, on_dependency_failure, i)\n"),
    ("               CASE WHEN a.ordering_key IS NULL\n",
     "               -- Waiting while a dependency is not completed (nor failed, to run anyway).\n"
     "               CASE WHEN EXISTS (\n"
     "                        SELECT 1 FROM jsonb_array_elements_text(a.depends_on) AS d\n"
     "                        WHERE NOT (dep_states->>(d::uuid::text) = 'completed'\n"
     "                                   OR (a.on_dependency_failure = 'run'\n"
     "                                       AND dep_states->>(d::uuid::text)\n"
     "                                           IN ('quarantined', 'cancelled'))))\n"
     "                        THEN 'waiting'\n"
     "                    WHEN a.ordering_key IS NULL\n"),
    ("                                partition_key)\n",
     "                                partition_key, on_dependency_failure)\n"),
    ("               x.partition_key\n        FROM input x\n",
     "               x.partition_key,\n"
     "               CASE WHEN x.depends_on IS NULL THEN NULL\n"
     "                    ELSE coalesce(x.on_dependency_failure, 'cancel') END\n"
     "        FROM input x\n"),
    ("    ), ev AS (\n",
     "    ), dependencies AS (\n"
     "        INSERT INTO item_dependencies (tenant_id, item_id, depends_on)\n"
     "        SELECT DISTINCT p_tenant, x.item_id, d::uuid\n"
     "        FROM input x JOIN ins USING (item_id),\n"
     "             jsonb_array_elements_text(x.depends_on) AS d\n"
     "    ), ev AS (\n"),
    ("               || CASE WHEN partition_key IS NULL THEN '{{}}'::jsonb\n"
     "                       ELSE jsonb_build_object('partition_key', partition_key) END\n",
     "               || CASE WHEN partition_key IS NULL THEN '{{}}'::jsonb\n"
     "                       ELSE jsonb_build_object('partition_key', partition_key) END\n"
     "               -- What it depends on (0035), as given, and its rule.\n"
     "               || coalesce((SELECT jsonb_build_object('depends_on', x.depends_on,\n"
     "                                                      'on_dependency_failure',\n"
     "                                                      ins.on_dependency_failure)\n"
     "                            FROM input x\n"
     "                            WHERE x.item_id = ins.item_id AND x.depends_on IS NOT NULL),\n"
     "                           '{{}}'::jsonb)\n"),
)  # fmt: skip


def _unique_for() -> ModuleType:
    return importlib.import_module("queue_server.migrations.versions.0033_unique_for_a_period")


def _shards() -> ModuleType:
    return importlib.import_module("queue_server.migrations.versions.0028_admission_shards")


def admit_rows() -> str:
    text: str = _unique_for().admit_rows()
    for old, new in EDITS:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


def upgrade() -> None:
    shards = _shards()
    home = shards._home()
    op.add_column(
        "work_items",
        sa.Column("has_dependents", sa.Boolean(), nullable=False, server_default=sa.false()),
        schema=home,
    )
    op.add_column(
        "work_items", sa.Column("on_dependency_failure", sa.Text(), nullable=True), schema=home
    )
    op.create_check_constraint(
        op.f("ck_work_items_on_dependency_failure_known"),
        "work_items",
        "on_dependency_failure IS NULL OR on_dependency_failure IN ("
        + ", ".join(f"'{rule}'" for rule in RULES)
        + ")",
        schema=home,
    )
    op.create_table(
        "item_dependencies",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("item_id", sa.Uuid(), nullable=False),
        sa.Column("depends_on", sa.Uuid(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id", "item_id"],
            [f"{home}.work_items.tenant_id", f"{home}.work_items.item_id"],
            name=op.f("fk_item_dependencies_item"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["tenant_id", "depends_on"],
            [f"{home}.work_items.tenant_id", f"{home}.work_items.item_id"],
            name=op.f("fk_item_dependencies_depends_on"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "tenant_id", "item_id", "depends_on", name=op.f("pk_item_dependencies")
        ),
        schema=home,
    )
    op.create_index(
        "ix_item_dependencies_depends_on",
        "item_dependencies",
        ["tenant_id", "depends_on"],
        schema=home,
    )
    op.execute(shards._ddl(RELEASE, home))
    op.execute(TRIGGER)
    op.execute(shards._ddl(admit_rows(), home))


def downgrade() -> None:
    shards = _shards()
    home = shards._home()
    op.execute(shards._ddl(_unique_for().admit_rows(), home))
    op.execute("DROP TRIGGER work_items_dependencies ON work_items")
    op.execute("DROP FUNCTION queue_server.release_dependents()")
    op.drop_table("item_dependencies", schema=home)
    op.drop_constraint(op.f("ck_work_items_on_dependency_failure_known"), "work_items", schema=home)
    op.drop_column("work_items", "on_dependency_failure", schema=home)
    op.drop_column("work_items", "has_dependents", schema=home)
