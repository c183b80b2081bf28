"""unique jobs: an item may carry a `unique_key`; while an item of its queue with that key
is ready or leased, an enqueue with the same key makes nothing and is answered with it

`work_items.unique_key` (NULL: none) with a partial unique index over the queue's ready and
leased items that have one: two producers racing with one key make one item (the loser's
insert meets the winner's index entry, waits for its commit and is skipped), and the key is
free again once its item completes, is cancelled or goes to dead letters. Items without a
key are not in the index, so they pay nothing for it. The admission (`admit_rows`) looks up
each key first (a probe of the index) and charges the backlog cap only for what it makes,
counts only what it inserted, writes the key in the `enqueued` ledger row, and returns the
items holding the keys it did not admit after its own.

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-05
"""

import importlib
from collections.abc import Sequence
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision: str = "0030"
down_revision: str | Sequence[str] | None = "0029"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PRINTABLE = "unique_key IS NULL OR unique_key ~ '^[!-~]{1,255}$'"

# 0028's admission, with the unique keys: the items to make (those without a key, and the
# first of each key no ready or leased item of the queue holds), charged and counted alone;
# ON CONFLICT skips an item whose key a racing producer took first; then the holders.
ADMIT_ROWS = """CREATE OR REPLACE FUNCTION queue_server.admit_rows(p_tenant text, p_queue text, p_items jsonb,
                                        p_actor text, p_attempt_cap int,
                                        p_backlog_ceiling bigint)
RETURNS SETOF work_items
LANGUAGE plpgsql VOLATILE
SET search_path = {home}, pg_temp
AS $fn$
DECLARE
    t tenants%ROWTYPE;
    above record;
    shards smallint[];
    fresh bigint[];
    keys text[];
    missing text;
BEGIN
    -- The policy envelope: no item's budget above the attempt cap.
    SELECT i - 1 AS at, (e->>'max_acquisitions')::int AS budget INTO above
    FROM jsonb_array_elements(p_items) WITH ORDINALITY AS x(e, i)
    WHERE (e->>'max_acquisitions')::int > p_attempt_cap
    ORDER BY i LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'policy-envelope-exceeded'
            USING ERRCODE = 'QS422',
                  DETAIL = format('items[%s].max_acquisitions %s exceeds the policy''s attempt'
                                  ' cap of %s (durable-leased-work/retry).',
                                  above.at, above.budget, p_attempt_cap);
    END IF;
    SELECT * INTO t FROM tenants WHERE tenant_id = p_tenant;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'tenant-not-found'
            USING ERRCODE = 'QS404', DETAIL = format('No tenant is named %s.', p_tenant);
    END IF;
    -- The unique keys given, each once: an enqueue without any (the most of them) admits
    -- every item and makes none of the lookups below.
    keys := ARRAY(SELECT DISTINCT e->>'unique_key' FROM jsonb_array_elements(p_items) AS e
                  WHERE e->>'unique_key' IS NOT NULL);
    -- The items to admit: those without a unique key, and the first of each key that no
    -- ready or leased item of the queue holds (a probe of ix_work_items_unique each). The
    -- others are answered with the item holding their key: not admitted, not charged.
    IF cardinality(keys) = 0 THEN
        fresh := ARRAY(SELECT generate_series(1, jsonb_array_length(p_items)));
    ELSE
    fresh := ARRAY(
        SELECT u.i FROM (
            SELECT i, e->>'unique_key' AS k,
                   row_number() OVER (PARTITION BY e->>'unique_key' ORDER BY i) AS nth
            FROM jsonb_array_elements(p_items) WITH ORDINALITY AS x(e, i)
        ) AS u
        WHERE u.k IS NULL
           OR (u.nth = 1 AND NOT EXISTS (
                   SELECT 1 FROM work_items w
                   WHERE w.tenant_id = p_tenant AND w.queue = p_queue AND w.unique_key = u.k
                     AND w.state IN ('ready', 'leased')))
        ORDER BY u.i);
    END IF;
    -- A cap stored under a looser policy is held to the loaded one.
    shards := queue_server.admission_shards(p_tenant, cardinality(fresh),
                                            least(t.backlog_cap, p_backlog_ceiling));
    RETURN QUERY
    WITH given AS (
        SELECT x.*
        FROM ROWS FROM (jsonb_to_recordset(p_items)
                 AS (item_id uuid, payload jsonb, priority int, delay double precision,
                     max_acquisitions int, traceparent text, tracestate text,
                     unique_key text))
             WITH ORDINALITY AS x(item_id, payload, priority, delay, max_acquisitions,
                                  traceparent, tracestate, unique_key, i)
    ), input AS (
        -- The items admitted above, in order, each with its shard.
        SELECT g.*, shards[array_position(fresh, g.i)] AS shard FROM given g
        WHERE g.i = ANY(fresh)
    ), ins AS (
        INSERT INTO work_items (tenant_id, item_id, queue, payload, priority, state,
                                available_at, max_acquisitions, event_seq,
                                created_at, updated_at, traceparent, tracestate,
                                admission_shard, unique_key)
        SELECT p_tenant, x.item_id, p_queue, coalesce(x.payload, 'null'::jsonb),
               coalesce(x.priority, 0), 'ready',
               statement_timestamp() + make_interval(secs => coalesce(x.delay, 0)),
               -- The item's budget, else the queue's, else the tenant's default, each held
               -- to the policy's attempt cap.
               coalesce(x.max_acquisitions,
                        (SELECT least(q.max_acquisitions, p_attempt_cap) FROM queues q
                         WHERE q.tenant_id = p_tenant AND q.queue = p_queue),
                        least(t.default_max_acquisitions, p_attempt_cap)),
               1, statement_timestamp(), statement_timestamp(), x.traceparent, x.tracestate,
               x.shard, x.unique_key
        FROM input x
        -- A producer racing this one to the same key committed first: this item is not
        -- made (nor counted), and is answered with that one below.
        ON CONFLICT (tenant_id, queue, unique_key)
            WHERE unique_key IS NOT NULL AND state IN ('ready', 'leased') DO NOTHING
        RETURNING *
    ), ev AS (
        INSERT INTO item_events (tenant_id, item_id, seq, at, kind, fence, actor, data)
        SELECT tenant_id, item_id, 0, created_at, 'enqueued', fence, p_actor,
               jsonb_build_object('queue', queue, 'payload', payload, 'priority', priority,
                                  'available_at', available_at,
                                  'max_acquisitions', max_acquisitions)
               || CASE WHEN unique_key IS NULL THEN '{{}}'::jsonb
                       ELSE jsonb_build_object('unique_key', unique_key) END
               -- The producer's trace context, when it sent one (W3C traceparent/tracestate).
               || CASE WHEN traceparent IS NULL THEN '{{}}'::jsonb
                       ELSE jsonb_build_object('trace', jsonb_strip_nulls(jsonb_build_object(
                                'traceparent', traceparent, 'tracestate', tracestate))) END
        FROM ins
    ), outbox AS (
        INSERT INTO outbox_deliveries (tenant_id, watcher_id, delivery_key, event, item_id, queue,
                                       body, state, next_attempt_at, due_at, created_at, updated_at)
        SELECT s.tenant_id, w.watcher_id, delivery_key(w.watcher_id, s.item_id, s.event_seq - 1),
               'item.enqueued', s.item_id, s.queue,
               jsonb_build_object('event', 'item.enqueued',
                                  'occurred_at', api_timestamp(statement_timestamp()),
                                  'item', item_json(s)),
               'pending', statement_timestamp(), statement_timestamp(), statement_timestamp(),
               statement_timestamp()
        FROM ins s
        JOIN watchers w ON w.tenant_id = s.tenant_id AND w.state = 'active'
         AND 'item.enqueued' = ANY(w.events) AND (w.queues IS NULL OR s.queue = ANY(w.queues))
        ORDER BY s.item_id, w.watcher_id
    ), counted AS (
        INSERT INTO counter_deltas (tenant_id, queue, shard, admitted)
        SELECT p_tenant, p_queue, s.admission_shard, count(*) FROM ins s
        GROUP BY s.admission_shard
    )
    SELECT ins.* FROM ins;
    IF cardinality(keys) > 0 THEN
    -- Each unique key not admitted here: the ready or leased item holding it (a statement
    -- of its own, so it sees a racing producer's item committed since).
    RETURN QUERY
    SELECT w.* FROM work_items w
    WHERE w.tenant_id = p_tenant AND w.queue = p_queue AND w.state IN ('ready', 'leased')
      AND w.unique_key = ANY(keys)
      AND w.item_id NOT IN (SELECT (e->>'item_id')::uuid
                            FROM jsonb_array_elements(p_items) AS e);
    -- The holder finished between the look and this answer: the producer tries again.
    SELECT k INTO missing FROM unnest(keys) AS k
    WHERE NOT EXISTS (SELECT 1 FROM work_items w
                      WHERE w.tenant_id = p_tenant AND w.queue = p_queue
                        AND w.unique_key = k AND w.state IN ('ready', 'leased'))
    LIMIT 1;
    IF missing IS NOT NULL THEN
        RAISE EXCEPTION 'unique-key-released'
            USING ERRCODE = 'QS409',
                  DETAIL = format('The item holding unique_key %L finished while this enqueue'
                                  ' ran; send it again.', missing);
    END IF;
    END IF;
    PERFORM pg_notify('queue_server_ready', queue_server.ready_tag(p_tenant, p_queue));
END
$fn$
"""


def _item_json() -> str:
    """0012's item_json (the item webhooks carry), as CREATE OR REPLACE."""
    module = importlib.import_module("queue_server.migrations.versions.0012_item_json")
    text: str = module.ITEM_JSON
    return text.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")


def _shards() -> ModuleType:
    return importlib.import_module("queue_server.migrations.versions.0028_admission_shards")


def upgrade() -> None:
    shards = _shards()
    home = shards._home()
    op.add_column("work_items", sa.Column("unique_key", sa.Text(), nullable=True), schema=home)
    op.create_check_constraint(
        op.f("ck_work_items_unique_key_printable"), "work_items", PRINTABLE, schema=home
    )
    op.create_index(
        "ix_work_items_unique",
        "work_items",
        ["tenant_id", "queue", "unique_key"],
        unique=True,
        postgresql_where=sa.text(
            "unique_key IS NOT NULL AND state IN ('ready'::item_state, 'leased'::item_state)"
        ),
        schema=home,
    )
    op.execute(shards._ddl(ADMIT_ROWS, home))
    # The item as webhooks carry it shows its unique key too (the API's item does).
    closing = "'updated_at', api_timestamp(s.updated_at))"
    op.execute(
        _item_json().replace(
            closing,
            "'updated_at', api_timestamp(s.updated_at), 'unique_key', s.unique_key)",
        )
    )


def downgrade() -> None:
    shards = _shards()
    home = shards._home()
    op.execute(_item_json())
    op.execute(
        shards._ddl(
            shards.ADMIT_ROWS.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION"), home
        )
    )
    op.drop_index("ix_work_items_unique", table_name="work_items", schema=home)
    op.drop_constraint(
        op.f("ck_work_items_unique_key_printable"), "work_items", type_="check", schema=home
    )
    op.drop_column("work_items", "unique_key", schema=home)
