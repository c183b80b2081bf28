"""the backlog cap in shards: an admission locks one of the tenant's 32 admission shards
(skipping those other transactions hold) and is charged to it, each shard holding its share
of the cap; no admission waits for another's commit while a shard has room

Until now every admission of a tenant locked the tenant's row until its transaction ended,
so an application enqueueing inside its request transactions ran them one at a time, and a
slow one stalled the tenant's whole intake. Now the cap is split (escrow): shard s of a
tenant with cap C holds ceil((C - s) / W) of it, W = least(32, C), the shares summing to C.
Each item records the shard it was admitted under (`work_items.admission_shard`), each
counter delta the shard it counts for (`shard`), so a release gives its room back to the
shard that admitted the item, and a shard's backlog (admitted - released of its items) is
read exactly under its lock, as the tenant's was. No shard is over its share, so the
tenant is never over its cap.

The backlog in place when this runs is dealt round-robin over the shards of its tenant (no
shard gets more than its share of a cap it fits), and the counters are rebased per shard.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-05
"""

import importlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0028"
down_revision: str | Sequence[str] | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SHARDS = 32

COUNTS = (
    "admitted",
    "released",
    "completed",
    "failed",
    "quarantined",
    "cancelled",
    "purged_completed",
    "purged_cancelled",
    "timed_completions",
    "completion_ms",
)

# Every tenant has its shards, whichever way its row was inserted.
TENANT_SHARDS = """
CREATE FUNCTION queue_server.tenant_admission_shards() RETURNS trigger
LANGUAGE plpgsql
SET search_path = {home}, pg_temp
AS $fn$
BEGIN
    INSERT INTO admission_shards (tenant_id, shard)
    SELECT NEW.tenant_id, s FROM generate_series(0, {shards} - 1) AS s;
    RETURN NULL;
END
$fn$
"""

# The backlog of each (tenant, shard): admitted - released, from the latest base and the
# deltas since, read as counter_totals reads them (neither walks what a held snapshot keeps).
ADMISSION_BACKLOGS = """
CREATE VIEW {home}.admission_backlogs AS
WITH base AS (
    SELECT coalesce((SELECT as_of_xid FROM counter_bases ORDER BY as_of_xid DESC LIMIT 1),
                    '0'::xid8) AS as_of_xid
)
SELECT c.tenant_id, c.shard, sum(c.admitted - c.released)::bigint AS backlog
FROM (
    SELECT b.tenant_id, b.shard, b.admitted, b.released
    FROM counter_bases b WHERE b.as_of_xid = (SELECT as_of_xid FROM base)
    UNION ALL
    SELECT d.tenant_id, d.shard, d.admitted, d.released
    FROM counter_deltas d
    WHERE d.xid >= (SELECT as_of_xid FROM base)
      AND d.xid <= greatest(pg_snapshot_xmax(pg_current_snapshot()),
                            pg_current_xact_id_if_assigned())
) AS c
GROUP BY c.tenant_id, c.shard
"""

# The shards that take `p_n` new items of the tenant, one entry per item, each locked by
# this transaction until it ends. A shard is taken with SKIP LOCKED (one another transaction
# holds is passed over, never waited for; one this transaction holds is taken again) and
# charged as far as its share has room, then the next, until the items fit. The check reads
# after the lock is granted (a statement of its own), so it sees every admission to the shard
# committed before; a release in flight is not counted yet, which errs on the side of the
# cap. Refused (QS429) when the tenant's committed backlog leaves no room: exact as the
# single lock was, and true of a cap lowered below the backlog too. When the room there is
# lies in shards other transactions hold, their commits are waited for by polling (no
# transaction ever blocks on a shard while holding one, so none deadlocks), at most the
# session's lock_timeout (10 s when it has none), then refused saying so.
ADMISSION_SHARDS = """
CREATE FUNCTION queue_server.admission_shards(p_tenant text, p_n int, p_cap bigint)
RETURNS smallint[]
LANGUAGE plpgsql VOLATILE
SET search_path = {home}, pg_temp
AS $fn$
DECLARE
    width int := least({shards}, greatest(p_cap, 1))::int;
    first int := pg_backend_pid() % width;
    taken smallint[] := '{{}}';
    held smallint[] := '{{}}';
    need int := p_n;
    s smallint;
    used bigint;
    backlog bigint;
    take bigint;
    patience interval := coalesce(nullif(current_setting('lock_timeout'), '0')::interval,
                                  interval '10 s');
    deadline timestamptz := clock_timestamp() + patience;
BEGIN
    IF p_n <= 0 THEN
        RETURN taken;
    END IF;
    LOOP
        -- The next shard this transaction can lock, from this session's first one on.
        SELECT a.shard INTO s FROM admission_shards a
        WHERE a.tenant_id = p_tenant AND a.shard < width AND a.shard <> ALL(held)
        ORDER BY (a.shard - first + width) % width
        LIMIT 1
        FOR NO KEY UPDATE SKIP LOCKED;
        IF FOUND THEN
            held := held || s;
            SELECT coalesce(sum(b.backlog) FILTER (WHERE b.shard = s), 0),
                   coalesce(sum(b.backlog), 0)
              INTO used, backlog
            FROM admission_backlogs b WHERE b.tenant_id = p_tenant;
            IF backlog + p_n > p_cap THEN
                RAISE EXCEPTION 'backlog-cap-reached'
                    USING ERRCODE = 'QS429',
                          DETAIL = format('Backlog %s + %s new would exceed the cap of %s.',
                                          backlog, p_n, p_cap);
            END IF;
            take := least(need, (p_cap - s + width - 1) / width - used);
            IF take > 0 THEN
                taken := taken || array_fill(s, ARRAY[take::int]);
                need := need - take::int;
                IF need = 0 THEN
                    RETURN taken;
                END IF;
            END IF;
        ELSE
            -- Every shard with a share is held: by this transaction, or by others in flight.
            SELECT coalesce(sum(b.backlog), 0) INTO backlog
            FROM admission_backlogs b WHERE b.tenant_id = p_tenant;
            IF backlog + p_n > p_cap THEN
                RAISE EXCEPTION 'backlog-cap-reached'
                    USING ERRCODE = 'QS429',
                          DETAIL = format('Backlog %s + %s new would exceed the cap of %s.',
                                          backlog, p_n, p_cap);
            END IF;
            IF clock_timestamp() >= deadline THEN
                RAISE EXCEPTION 'backlog-cap-reached'
                    USING ERRCODE = 'QS429',
                          DETAIL = format('Backlog %s + %s new would exceed the cap of %s with'
                                          ' the admissions not yet committed, which hold the'
                                          ' rest of its room (waited %s).',
                                          backlog, p_n, p_cap, patience);
            END IF;
            PERFORM pg_sleep(0.005);
            -- Look again at the shards held by others (this transaction keeps its own).
            held := ARRAY(SELECT DISTINCT x FROM unnest(taken) AS x);
        END IF;
    END LOOP;
END
$fn$
"""

# The admission (0020's rows, 0023's seal) in one function: the envelope, the tenant, the
# shards the items are charged to (locked until the transaction ends), the items with
# their `enqueued` ledger rows and outbox rows, one `admitted` delta per shard, and the
# NOTIFY that wakes waiting acquires (delivered at the commit). Refused: an SQL error, and
# the transaction's writes roll back with it.
ADMIT_ROWS = """
CREATE FUNCTION queue_server.admit_rows(p_tenant text, p_queue text, p_items jsonb,
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
    -- A cap stored under a looser policy is held to the loaded one.
    shards := queue_server.admission_shards(p_tenant, jsonb_array_length(p_items),
                                            least(t.backlog_cap, p_backlog_ceiling));
    RETURN QUERY
    WITH input AS (
        SELECT x.*, shards[x.i::int] AS shard
        FROM ROWS FROM (jsonb_to_recordset(p_items)
                 AS (item_id uuid, payload jsonb, priority int, delay double precision,
                     max_acquisitions int, traceparent text, tracestate text))
             WITH ORDINALITY AS x(item_id, payload, priority, delay, max_acquisitions,
                                  traceparent, tracestate, i)
    ), ins AS (
        INSERT INTO work_items (tenant_id, item_id, queue, payload, priority, state,
                                available_at, max_acquisitions, event_seq,
                                created_at, updated_at, traceparent, tracestate,
                                admission_shard)
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
               x.shard
        FROM input x
        RETURNING *
    ), ev AS (
        INSERT INTO item_events (tenant_id, item_id, seq, at, kind, fence, actor, data)
        SELECT tenant_id, item_id, 0, created_at, 'enqueued', fence, p_actor,
               jsonb_build_object('queue', queue, 'payload', payload, 'priority', priority,
                                  'available_at', available_at,
                                  'max_acquisitions', max_acquisitions)
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
        SELECT p_tenant, p_queue, x.shard, count(*) FROM input x GROUP BY x.shard
    )
    SELECT ins.* FROM ins;
    PERFORM pg_notify('queue_server_ready', queue_server.ready_tag(p_tenant, p_queue));
END
$fn$
"""

# The admission every enqueue shares (the signature of 0017's): each fire of a schedule,
# queue_server.enqueue's, and the REST route's.
ADMIT = """
CREATE OR REPLACE FUNCTION queue_server.admit(p_tenant text, p_queue text, p_items jsonb,
                                              p_actor text, p_attempt_cap int,
                                              p_backlog_ceiling bigint)
RETURNS SETOF work_items
LANGUAGE plpgsql VOLATILE
SET search_path = {home}, pg_temp
AS $fn$
BEGIN
    RETURN QUERY SELECT * FROM queue_server.admit_rows(p_tenant, p_queue, p_items, p_actor,
                                                       p_attempt_cap, p_backlog_ceiling);
END
$fn$
"""


def _ddl(text: str, home: str) -> str:
    return (
        text.replace("{home}", home)
        .replace("{shards}", str(SHARDS))
        .replace("{{", "{")
        .replace("}}", "}")
    )


def _home() -> str:
    """The tables' schema (as 0020's)."""
    found = op.get_bind().execute(
        sa.text(
            "SELECT relnamespace::regnamespace::text FROM pg_class"
            " WHERE oid = 'work_items'::regclass"
        )
    )
    return str(found.scalar_one())


def upgrade() -> None:
    home = _home()
    # Lock targets only: never updated, so no version chain grows under a held snapshot.
    op.create_table(
        "admission_shards",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("shard", sa.SmallInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            [f"{home}.tenants.tenant_id"],
            name=op.f("fk_admission_shards_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "shard", name=op.f("pk_admission_shards")),
        schema=home,
    )
    op.execute(
        f"INSERT INTO {home}.admission_shards (tenant_id, shard)"
        f" SELECT t.tenant_id, s FROM {home}.tenants t, generate_series(0, {SHARDS - 1}) AS s"
    )
    op.execute(_ddl(TENANT_SHARDS, home))
    op.execute(
        f"CREATE TRIGGER tenants_admission_shards AFTER INSERT ON {home}.tenants"
        " FOR EACH ROW EXECUTE FUNCTION queue_server.tenant_admission_shards()"
    )
    # A constant default: no rewrite of the table.
    for table, column in (
        ("work_items", "admission_shard"),
        ("counter_deltas", "shard"),
        ("counter_bases", "shard"),
    ):
        op.add_column(
            table,
            sa.Column(column, sa.SmallInteger(), server_default=sa.text("0"), nullable=False),
            schema=home,
        )
    op.drop_constraint("pk_counter_bases", "counter_bases", schema=home)
    op.create_primary_key(
        "pk_counter_bases", "counter_bases", ["as_of_xid", "tenant_id", "queue", "shard"],
        schema=home,
    )  # fmt: skip
    # The backlog dealt round-robin over the shards of its tenant: shard s gets
    # ceil((B - s) / 32) of B items, at most its share of any cap B fits in.
    op.execute(
        f"""
        UPDATE {home}.work_items w SET admission_shard = d.shard
        FROM (SELECT tenant_id, item_id,
                     ((row_number() OVER (PARTITION BY tenant_id ORDER BY item_id) - 1)
                      % {SHARDS})::smallint AS shard
              FROM {home}.work_items WHERE state IN ('ready', 'leased')) AS d
        WHERE w.tenant_id = d.tenant_id AND w.item_id = d.item_id
        """
    )
    # One base as of this transaction, per (tenant, queue, shard): each queue's totals on
    # shard 0, then the items each other shard holds moved from shard 0's admitted count to
    # its own (so each shard's admitted - released is its items in the backlog). Nothing
    # runs while the schema migrates: every delta is summed here.
    counts = ", ".join(COUNTS)
    op.execute(
        f"""
        WITH moved AS (
            SELECT tenant_id, queue, admission_shard AS shard, count(*) AS n
            FROM {home}.work_items
            WHERE state IN ('ready', 'leased') AND admission_shard <> 0
            GROUP BY tenant_id, queue, admission_shard
        ), totals AS (
            SELECT tenant_id, queue, 0::smallint AS shard, {counts} FROM {home}.counter_totals
            UNION ALL
            SELECT tenant_id, queue, shard, n, 0, 0, 0, 0, 0, 0, 0, 0, 0 FROM moved
            UNION ALL
            SELECT tenant_id, queue, 0::smallint, -n, 0, 0, 0, 0, 0, 0, 0, 0, 0 FROM moved
        ), fresh AS (
            INSERT INTO {home}.counter_bases (as_of_xid, tenant_id, queue, shard, {counts})
            SELECT pg_current_xact_id(), tenant_id, queue, shard,
                   {", ".join(f"sum({c})" for c in COUNTS)}
            FROM totals
            WHERE EXISTS (SELECT 1 FROM {home}.tenants t WHERE t.tenant_id = totals.tenant_id)
            GROUP BY tenant_id, queue, shard
            RETURNING 1
        )
        SELECT count(*) FROM fresh
        """
    )
    op.execute(f"DELETE FROM {home}.counter_bases WHERE as_of_xid <> pg_current_xact_id()")
    op.execute(f"DELETE FROM {home}.counter_deltas")
    op.execute(_ddl(ADMISSION_BACKLOGS, home))
    op.execute(_ddl(ADMISSION_SHARDS, home))
    # The new admission replaces 0020's two steps; the REST route calls it as the SQL does.
    op.execute(_ddl(ADMIT_ROWS, home))
    op.execute(_ddl(ADMIT, home))
    op.execute("DROP FUNCTION queue_server.admit_rows(text, text, jsonb, text, int)")
    op.execute("DROP FUNCTION queue_server.admit_seal(text, text, int, bigint)")


def downgrade() -> None:
    home = _home()
    previous = importlib.import_module("queue_server.migrations.versions.0020_admission_lock_last")
    later = importlib.import_module("queue_server.migrations.versions.0023_counter_deltas")
    rows: str = previous.ADMIT_ROWS
    op.execute(later._ddl(rows, home))
    op.execute(later._ddl(later.ADMIT_SEAL, home))
    op.execute(later._ddl(previous.ADMIT, home))
    op.execute("DROP FUNCTION queue_server.admit_rows(text, text, jsonb, text, int, bigint)")
    op.execute("DROP FUNCTION queue_server.admission_shards(text, int, bigint)")
    op.execute(f"DROP VIEW {home}.admission_backlogs")
    # The bases summed over shards again (the deltas keep their rows, their shard dropped).
    counts = ", ".join(COUNTS)
    op.execute(
        f"""
        CREATE TEMPORARY TABLE folded ON COMMIT DROP AS
        SELECT as_of_xid, tenant_id, queue, {", ".join(f"sum({c}) AS {c}" for c in COUNTS)},
               max(folded_at) AS folded_at
        FROM {home}.counter_bases GROUP BY as_of_xid, tenant_id, queue
        """
    )
    op.execute(f"DELETE FROM {home}.counter_bases")
    op.drop_constraint("pk_counter_bases", "counter_bases", schema=home)
    op.drop_column("counter_bases", "shard", schema=home)
    op.create_primary_key(
        "pk_counter_bases", "counter_bases", ["as_of_xid", "tenant_id", "queue"], schema=home
    )
    op.execute(
        f"INSERT INTO {home}.counter_bases (as_of_xid, tenant_id, queue, {counts}, folded_at)"
        f" SELECT as_of_xid, tenant_id, queue, {counts}, folded_at FROM folded"
    )
    op.drop_column("counter_deltas", "shard", schema=home)
    op.drop_column("work_items", "admission_shard", schema=home)
    op.execute(f"DROP TRIGGER tenants_admission_shards ON {home}.tenants")
    op.execute("DROP FUNCTION queue_server.tenant_admission_shards()")
    op.drop_table("admission_shards", schema=home)
