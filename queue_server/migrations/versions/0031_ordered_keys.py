"""ordered keys: items that share an `ordering_key` in a queue are handed out one at a time,
in enqueue order; the next waits (a new state, `waiting`) until the one before it completes,
is cancelled, or goes to dead letters (a queue setting, `ordering_dead_letters`, says
whether a dead letter lets the next go, `release`, or holds the key until it is replayed
or discarded, `hold`)

The acquire is untouched: a waiting item is not ready, so no acquire reads it. Each item with
a key takes the next place in its key's line (`ordering_seq`, from a sequence). The admission
locks each key it is given (an advisory lock held to its commit) and makes the item ready only
when the key's newest item is finished (a probe from the end of ix_work_items_ordering);
otherwise it waits. One trigger, after any update that takes a keyed item out of the key's
active states (ready, leased; quarantined under `hold`), locks the key and makes the next
waiting item of the line ready (a probe from the finished item's place in the line), with an
`unblocked` ledger row naming the item it followed and a NOTIFY; the same trigger sends an
item replayed from its dead letter to the back of its key's line, `waiting` (ledgered as
`held`) when the key is busy. Both sides take the key's lock before they look, and each
look is a statement of its own after the lock, so an enqueue racing the last completion of
its key either sees that completion or is seen by it.

A waiting item is in the backlog (admitted, not released) and holds its unique key: the
unique index now covers every item that is not finished.

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-05
"""

import importlib
from collections.abc import Sequence
from types import ModuleType

import sqlalchemy as sa
from alembic import op

revision: str = "0031"
down_revision: str | Sequence[str] | None = "0030"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PRINTABLE = "ordering_key IS NULL OR ordering_key ~ '^[!-~]{1,255}$'"

# Whether an item of the key other than `p_except` is not finished: the newest of the key's
# line decides (every item behind the active one waits), a probe from the end of the index.
# (PL/pgSQL: a SQL function's body is checked at creation, where `waiting` is not usable yet.)
ORDERING_BUSY = """CREATE FUNCTION queue_server.ordering_busy(p_tenant text, p_queue text, p_key text,
                                            p_except uuid)
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = {home}, pg_temp
AS $fn$
BEGIN
    RETURN coalesce((
        SELECT n.state IN ('waiting', 'ready', 'leased')
               OR (n.state = 'quarantined'
                   AND coalesce((SELECT q.ordering_dead_letters = 'hold' FROM queues q
                                 WHERE q.tenant_id = p_tenant AND q.queue = p_queue), false))
        FROM work_items n
        WHERE n.tenant_id = p_tenant AND n.queue = p_queue AND n.ordering_key = p_key
          AND (p_except IS NULL OR n.item_id <> p_except)
        ORDER BY n.ordering_seq DESC
        LIMIT 1), false);
END
$fn$
"""

ORDERED_KEYS = """CREATE FUNCTION queue_server.ordered_keys() RETURNS trigger
LANGUAGE plpgsql VOLATILE
SET search_path = {home}, pg_temp
AS $fn$
DECLARE
    hold boolean;
    was_active boolean;
    now_active boolean;
    busy boolean;
    moved work_items%ROWTYPE;
    ahead uuid;
BEGIN
    hold := coalesce((SELECT q.ordering_dead_letters = 'hold' FROM queues q
                      WHERE q.tenant_id = NEW.tenant_id AND q.queue = NEW.queue), false);
    was_active := OLD.state IN ('ready', 'leased') OR (hold AND OLD.state = 'quarantined');
    now_active := NEW.state IN ('ready', 'leased') OR (hold AND NEW.state = 'quarantined');
    IF was_active = now_active OR OLD.state = 'waiting' THEN
        RETURN NULL;  -- still the key's active item, or made ready by this trigger
    END IF;
    -- The admission locks the key too: what it reads after its lock includes this change.
    PERFORM pg_advisory_xact_lock(
        hashtextextended(NEW.tenant_id || '/' || NEW.queue || '/' || NEW.ordering_key, 11));
    IF was_active THEN
        -- The key's active item finished: the next in its line is ready.
        UPDATE work_items w
        SET state = 'ready', updated_at = statement_timestamp(), event_seq = w.event_seq + 1
        WHERE w.tenant_id = NEW.tenant_id AND w.state = 'waiting' AND w.item_id = (
            SELECT n.item_id FROM work_items n
            WHERE n.tenant_id = NEW.tenant_id AND n.queue = NEW.queue
              AND n.ordering_key = NEW.ordering_key AND n.ordering_seq > NEW.ordering_seq
              AND n.state = 'waiting'
            ORDER BY n.ordering_seq
            LIMIT 1)
        RETURNING w.* INTO moved;
        IF FOUND THEN
            INSERT INTO item_events (tenant_id, item_id, seq, at, kind, fence, actor, data)
            VALUES (moved.tenant_id, moved.item_id, moved.event_seq - 1, moved.updated_at,
                    'unblocked', moved.fence, 'server',
                    jsonb_build_object('ordering_key', moved.ordering_key,
                                       'after', NEW.item_id::text, 'after_state', NEW.state));
            PERFORM pg_notify('queue_server_ready',
                              queue_server.ready_tag(moved.tenant_id, moved.queue));
        END IF;
    ELSE
        -- Back from its dead letter (a replay, a retry): to the back of its key's line,
        -- waiting behind the key's others if any is not finished.
        busy := queue_server.ordering_busy(NEW.tenant_id, NEW.queue, NEW.ordering_key,
                                           NEW.item_id);
        IF busy THEN
            SELECT n.item_id INTO ahead FROM work_items n
            WHERE n.tenant_id = NEW.tenant_id AND n.queue = NEW.queue
              AND n.ordering_key = NEW.ordering_key AND n.item_id <> NEW.item_id
            ORDER BY n.ordering_seq DESC
            LIMIT 1;
        END IF;
        UPDATE work_items w
        SET ordering_seq = nextval('{home}.work_items_ordering_seq'),
            state = CASE WHEN busy THEN 'waiting'::item_state ELSE w.state END,
            event_seq = w.event_seq + busy::int
        WHERE w.tenant_id = NEW.tenant_id AND w.item_id = NEW.item_id
        RETURNING w.* INTO moved;
        IF busy THEN
            INSERT INTO item_events (tenant_id, item_id, seq, at, kind, fence, actor, data)
            VALUES (moved.tenant_id, moved.item_id, moved.event_seq - 1, moved.updated_at,
                    'held', moved.fence, 'server',
                    jsonb_build_object('ordering_key', moved.ordering_key,
                                       'behind', ahead::text));
        END IF;
    END IF;
    RETURN NULL;
END
$fn$
"""

# Not for a move between ready and leased (an acquire, a requeue, a takeover): the key's
# active item stays active, and the acquire pays no call for it.
TRIGGER = """CREATE TRIGGER work_items_ordered_keys AFTER UPDATE OF state ON work_items
FOR EACH ROW WHEN (NEW.ordering_key IS NOT NULL AND OLD.state IS DISTINCT FROM NEW.state
                   AND NOT (OLD.state IN ('ready', 'leased') AND NEW.state IN ('ready', 'leased')))
EXECUTE FUNCTION queue_server.ordered_keys()
"""

# 0030's admission, with the ordering keys: each key given is locked, in order; an item with
# one takes the next place in its key's line and waits unless it is the first of its key in
# this enqueue and the key's newest item is finished.
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
    orders text[];
    busy text[] := '{{}}';
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
    -- waiting, ready or leased item of the queue holds (a probe of ix_work_items_unique). The
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
                     AND w.state IN ('waiting', 'ready', 'leased')))
        ORDER BY u.i);
    END IF;
    -- The ordering keys given, each once (migration 0031): each locked, in order, until the
    -- transaction ends (as the transition that finishes a key's item locks it before it
    -- hands out the next); a key whose newest item is not finished is busy: its items wait.
    -- The newest by its place in the key's line (ordering_seq), a probe from the end of
    -- ix_work_items_ordering, not a walk over the key's history.
    orders := ARRAY(SELECT DISTINCT e->>'ordering_key' FROM jsonb_array_elements(p_items) AS e
                    WHERE e->>'ordering_key' IS NOT NULL ORDER BY 1);
    IF cardinality(orders) > 0 THEN
        PERFORM pg_advisory_xact_lock(hashtextextended(p_tenant || '/' || p_queue || '/' || k, 11))
        FROM (SELECT k FROM unnest(orders) AS k ORDER BY k) AS ordered;
        busy := ARRAY(
            SELECT k FROM unnest(orders) AS k
            WHERE queue_server.ordering_busy(p_tenant, p_queue, k, NULL));
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
                     unique_key text, ordering_key text))
             WITH ORDINALITY AS x(item_id, payload, priority, delay, max_acquisitions,
                                  traceparent, tracestate, unique_key, ordering_key, i)
    ), input AS (
        -- The items admitted above, in order, each with its shard; an item with an ordering
        -- key takes the next place in its key's line and waits unless it is the first of a
        -- key that is not busy.
        SELECT a.*,
               CASE WHEN a.ordering_key IS NULL THEN NULL
                    ELSE nextval('{home}.work_items_ordering_seq') END AS ordering_seq,
               CASE WHEN a.ordering_key IS NULL
                      OR (a.nth = 1 AND NOT a.ordering_key = ANY(busy)) THEN 'ready'
                    ELSE 'waiting' END::item_state AS state
        FROM (SELECT g.*, shards[array_position(fresh, g.i)] AS shard,
                     row_number() OVER (PARTITION BY g.ordering_key ORDER BY g.i) AS nth
              FROM given g
              WHERE g.i = ANY(fresh)) AS a
        ORDER BY a.i
    ), ins AS (
        INSERT INTO work_items (tenant_id, item_id, queue, payload, priority, state,
                                available_at, max_acquisitions, event_seq,
                                created_at, updated_at, traceparent, tracestate,
                                admission_shard, unique_key, ordering_key, ordering_seq)
        SELECT p_tenant, x.item_id, p_queue, coalesce(x.payload, 'null'::jsonb),
               coalesce(x.priority, 0), x.state,
               statement_timestamp() + make_interval(secs => coalesce(x.delay, 0)),
               -- The item's budget, else the queue's, else the tenant's default, each held
               -- to the policy's attempt cap.
               coalesce(x.max_acquisitions,
                        (SELECT least(q.max_acquisitions, p_attempt_cap) FROM queues q
                         WHERE q.tenant_id = p_tenant AND q.queue = p_queue),
                        least(t.default_max_acquisitions, p_attempt_cap)),
               1, statement_timestamp(), statement_timestamp(), x.traceparent, x.tracestate,
               x.shard, x.unique_key, x.ordering_key, x.ordering_seq
        FROM input x
        -- A producer racing this one to the same key committed first: this item is not
        -- made (nor counted), and is answered with that one below.
        ON CONFLICT (tenant_id, queue, unique_key)
            WHERE unique_key IS NOT NULL
              AND state NOT IN ('completed', 'quarantined', 'cancelled') DO NOTHING
        RETURNING *
    ), ev AS (
        INSERT INTO item_events (tenant_id, item_id, seq, at, kind, fence, actor, data)
        SELECT tenant_id, item_id, 0, created_at, 'enqueued', fence, p_actor,
               jsonb_build_object('queue', queue, 'payload', payload, 'priority', priority,
                                  'available_at', available_at,
                                  'max_acquisitions', max_acquisitions)
               || CASE WHEN unique_key IS NULL THEN '{{}}'::jsonb
                       ELSE jsonb_build_object('unique_key', unique_key) END
               -- Its ordering key, and `waiting` when it queues behind the key's others.
               || CASE WHEN ordering_key IS NULL THEN '{{}}'::jsonb
                       ELSE jsonb_build_object('ordering_key', ordering_key) END
               || CASE WHEN state = 'waiting' THEN jsonb_build_object('state', 'waiting')
                       ELSE '{{}}'::jsonb END
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
    -- Each unique key not admitted here: the item holding it (a statement
    -- of its own, so it sees a racing producer's item committed since).
    RETURN QUERY
    SELECT w.* FROM work_items w
    WHERE w.tenant_id = p_tenant AND w.queue = p_queue
      AND w.state IN ('waiting', 'ready', 'leased') AND w.unique_key = ANY(keys)
      AND w.item_id NOT IN (SELECT (e->>'item_id')::uuid
                            FROM jsonb_array_elements(p_items) AS e);
    -- The holder finished between the look and this answer: the producer tries again.
    SELECT k INTO missing FROM unnest(keys) AS k
    WHERE NOT EXISTS (SELECT 1 FROM work_items w
                      WHERE w.tenant_id = p_tenant AND w.queue = p_queue
                        AND w.unique_key = k AND w.state IN ('waiting', 'ready', 'leased'))
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

UNIQUE_BEFORE = "unique_key IS NOT NULL AND state IN ('ready'::item_state, 'leased'::item_state)"
# Not finished: waiting (a value this migration adds, which it may not name yet), ready or
# leased.
UNIQUE_AFTER = (
    "unique_key IS NOT NULL AND state NOT IN"
    " ('completed'::item_state, 'quarantined'::item_state, 'cancelled'::item_state)"
)


def _item_json(shown: str) -> str:
    """0012's item_json (the item webhooks carry), as CREATE OR REPLACE, showing `shown`
    after `updated_at`."""
    module = importlib.import_module("queue_server.migrations.versions.0012_item_json")
    text: str = module.ITEM_JSON
    closing = "'updated_at', api_timestamp(s.updated_at))"
    assert closing in text
    return text.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION").replace(
        closing, f"'updated_at', api_timestamp(s.updated_at), {shown})"
    )


UNIQUE_SHOWN = "'unique_key', s.unique_key"


def _unique_keys() -> ModuleType:
    return importlib.import_module("queue_server.migrations.versions.0030_unique_keys")


def _shards() -> ModuleType:
    return importlib.import_module("queue_server.migrations.versions.0028_admission_shards")


def _unique_index(home: str, where: str) -> None:
    op.drop_index("ix_work_items_unique", table_name="work_items", schema=home)
    op.create_index(
        "ix_work_items_unique",
        "work_items",
        ["tenant_id", "queue", "unique_key"],
        unique=True,
        postgresql_where=sa.text(where),
        schema=home,
    )


def upgrade() -> None:
    shards = _shards()
    home = shards._home()
    # Usable once this migration's transaction commits: nothing below names it outside a
    # function's body.
    op.execute(f"ALTER TYPE {home}.item_state ADD VALUE IF NOT EXISTS 'waiting' BEFORE 'ready'")
    op.add_column("work_items", sa.Column("ordering_key", sa.Text(), nullable=True), schema=home)
    op.add_column(
        "work_items", sa.Column("ordering_seq", sa.BigInteger(), nullable=True), schema=home
    )
    op.create_check_constraint(
        op.f("ck_work_items_ordering_key_printable"), "work_items", PRINTABLE, schema=home
    )
    op.create_check_constraint(
        op.f("ck_work_items_ordering_placed"),
        "work_items",
        "(ordering_key IS NULL) = (ordering_seq IS NULL)",
        schema=home,
    )
    op.execute(f"CREATE SEQUENCE {home}.work_items_ordering_seq AS bigint")
    op.create_index(
        "ix_work_items_ordering",
        "work_items",
        ["tenant_id", "queue", "ordering_key", "ordering_seq"],
        postgresql_where=sa.text("ordering_key IS NOT NULL"),
        schema=home,
    )
    op.add_column(
        "queues",
        sa.Column("ordering_dead_letters", sa.Text(), nullable=False, server_default="release"),
        schema=home,
    )
    op.create_check_constraint(
        op.f("ck_queues_ordering_dead_letters_known"),
        "queues",
        "ordering_dead_letters IN ('release', 'hold')",
        schema=home,
    )
    _unique_index(home, UNIQUE_AFTER)
    op.execute(shards._ddl(ORDERING_BUSY, home))
    op.execute(shards._ddl(ORDERED_KEYS, home))
    op.execute(TRIGGER)
    op.execute(shards._ddl(ADMIT_ROWS, home))
    # The item as webhooks carry it shows its ordering key too (the API's item does).
    op.execute(_item_json(f"{UNIQUE_SHOWN}, 'ordering_key', s.ordering_key"))


def downgrade() -> None:
    shards = _shards()
    home = shards._home()
    op.execute(_item_json(UNIQUE_SHOWN))
    op.execute(shards._ddl(_unique_keys().ADMIT_ROWS, home))
    op.execute("DROP TRIGGER work_items_ordered_keys ON work_items")
    op.execute("DROP FUNCTION queue_server.ordered_keys()")
    op.execute("DROP FUNCTION queue_server.ordering_busy(text, text, text, uuid)")
    # A waiting item is ready again (its key's order is gone with the key); the type keeps
    # the value (PostgreSQL cannot drop one), which no row then holds.
    op.execute("UPDATE work_items SET state = 'ready' WHERE state = 'waiting'")
    _unique_index(home, UNIQUE_BEFORE)
    op.drop_constraint(
        op.f("ck_queues_ordering_dead_letters_known"), "queues", type_="check", schema=home
    )
    op.drop_column("queues", "ordering_dead_letters", schema=home)
    op.drop_index("ix_work_items_ordering", table_name="work_items", schema=home)
    op.execute(f"DROP SEQUENCE {home}.work_items_ordering_seq")
    op.drop_constraint(
        op.f("ck_work_items_ordering_placed"), "work_items", type_="check", schema=home
    )
    op.drop_constraint(
        op.f("ck_work_items_ordering_key_printable"), "work_items", type_="check", schema=home
    )
    op.drop_column("work_items", "ordering_seq", schema=home)
    op.drop_column("work_items", "ordering_key", schema=home)
