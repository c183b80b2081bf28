"""queue_server.admit in two steps: the rows first (queue_server.admit_rows), then the
tenant's admission lock, the exact backlog cap, the admitted counter and the NOTIFY
(queue_server.admit_seal), so that the lock is held for as little of the transaction as
possible; the REST route runs the two steps as statements of its own, the seal last

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-03
"""

import importlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | Sequence[str] | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The rows of an admission, without its lock: the envelope (no item's budget above the
# attempt cap), the items with their `enqueued` ledger rows and the outbox rows of the
# tenant's watchers. Nothing is admitted until queue_server.admit_seal has run in the same
# transaction: rows it refuses roll back with it, and until the commit no other
# transaction sees them (an acquire, a count, a page). The tenant is read without a lock:
# its default budget as of this statement.
#
# `items`: [{"item_id", "payload", "priority", "delay" (seconds), "max_acquisitions",
# "traceparent", "tracestate"}]; `attempt_cap`: the loaded policy's attempt cap.
ADMIT_ROWS = """
CREATE FUNCTION queue_server.admit_rows(p_tenant text, p_queue text, p_items jsonb,
                                        p_actor text, p_attempt_cap int)
RETURNS SETOF work_items
LANGUAGE plpgsql VOLATILE
SET search_path = {home}, pg_temp
AS $fn$
DECLARE
    t tenants%ROWTYPE;
    above record;
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
    RETURN QUERY
    WITH input AS (
        SELECT * FROM jsonb_to_recordset(p_items)
            AS x(item_id uuid, payload jsonb, priority int, delay double precision,
                 max_acquisitions int, traceparent text, tracestate text)
    ), ins AS (
        INSERT INTO work_items (tenant_id, item_id, queue, payload, priority, state,
                                available_at, max_acquisitions, event_seq,
                                created_at, updated_at, traceparent, tracestate)
        SELECT p_tenant, x.item_id, p_queue, coalesce(x.payload, 'null'::jsonb),
               coalesce(x.priority, 0), 'ready',
               statement_timestamp() + make_interval(secs => coalesce(x.delay, 0)),
               -- The item's budget, else the queue's, else the tenant's default, each held
               -- to the policy's attempt cap.
               coalesce(x.max_acquisitions,
                        (SELECT least(q.max_acquisitions, p_attempt_cap) FROM queues q
                         WHERE q.tenant_id = p_tenant AND q.queue = p_queue),
                        least(t.default_max_acquisitions, p_attempt_cap)),
               1, statement_timestamp(), statement_timestamp(), x.traceparent, x.tracestate
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
    )
    SELECT ins.* FROM ins;
END
$fn$
"""

# The admission of `n` items whose rows this transaction wrote (queue_server.admit_rows):
# the tenant's admission lock (NO KEY UPDATE: it serialises admissions without blocking
# inserts that reference the tenant), held until the transaction ends, the backlog cap,
# the admitted counter and the NOTIFY that wakes waiting acquires (delivered at the
# commit). Refused: an SQL error, and the rows roll back with the transaction. Run last,
# so that the lock is held from here to the commit only.
ADMIT_SEAL = """
CREATE FUNCTION queue_server.admit_seal(p_tenant text, p_queue text, p_n int,
                                        p_backlog_ceiling bigint)
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = {home}, pg_temp
AS $fn$
DECLARE
    t tenants%ROWTYPE;
    backlog bigint;
    cap bigint;
BEGIN
    SELECT * INTO t FROM tenants WHERE tenant_id = p_tenant FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'tenant-not-found'
            USING ERRCODE = 'QS404', DETAIL = format('No tenant is named %s.', p_tenant);
    END IF;
    -- Backlog = admitted (under this lock) - released (on all shards, without it). A
    -- statement of its own: its snapshot is taken after the lock was granted, so it sees
    -- every release committed before. One still in flight errs on the side of the cap.
    SELECT t.admitted - coalesce(sum(r.released), 0) INTO backlog
    FROM backlog_releases r WHERE r.tenant_id = p_tenant;
    -- A cap stored under a looser policy is held to the loaded one.
    cap := least(t.backlog_cap, p_backlog_ceiling);
    IF backlog + p_n > cap THEN
        RAISE EXCEPTION 'backlog-cap-reached'
            USING ERRCODE = 'QS429',
                  DETAIL = format('Backlog %s + %s new would exceed the cap of %s.',
                                  backlog, p_n, cap);
    END IF;
    -- This transaction holds the row's lock (the admission lock) already.
    UPDATE tenants SET admitted = admitted + p_n WHERE tenant_id = p_tenant;
    PERFORM pg_notify('queue_server_ready', p_tenant || '/' || p_queue);
END
$fn$
"""

# The admission every enqueue shares (the signature of 0017's): each fire of a schedule
# and queue_server.enqueue's call it in one statement; the REST route runs its two steps.
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
                                                       p_attempt_cap);
    PERFORM queue_server.admit_seal(p_tenant, p_queue, jsonb_array_length(p_items),
                                    p_backlog_ceiling);
END
$fn$
"""


def _ddl(text: str, home: str) -> str:
    return text.replace("{home}", home).replace("{{", "{").replace("}}", "}")


def _home() -> str:
    """The tables' schema (public, unless the database says otherwise). Not
    current_schema(): for a role named like the `queue_server` schema (the embedded
    server's, the image's) that is the schema 0017 made, first in its search_path."""
    found = op.get_bind().execute(
        sa.text(
            "SELECT relnamespace::regnamespace::text FROM pg_class"
            " WHERE oid = 'work_items'::regclass"
        )
    )
    return str(found.scalar_one())


def upgrade() -> None:
    home = _home()
    for ddl in (ADMIT_ROWS, ADMIT_SEAL, ADMIT):
        op.execute(_ddl(ddl, home))


def downgrade() -> None:
    home = _home()
    previous = importlib.import_module(
        "queue_server.migrations.versions.0017_transactional_enqueue"
    )
    op.execute(_ddl(previous.ADMIT.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION"), home))
    op.execute("DROP FUNCTION queue_server.admit_seal(text, text, int, bigint)")
    op.execute("DROP FUNCTION queue_server.admit_rows(text, text, jsonb, text, int)")
