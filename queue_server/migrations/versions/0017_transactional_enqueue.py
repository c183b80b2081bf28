"""queue_server.enqueue and queue_server.enqueue_many: enqueue inside an application's own
transaction, through the one admission the REST route uses (queue_server.admit); the role
queue_server_enqueuer and the per-tenant grants it is checked against

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0017"
down_revision: str | Sequence[str] | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The SQLSTATEs an application sees (class QS: queue server). queue_server.client maps them
# to typed errors; queue_server.db maps them to the API's problems.
#   QS400 invalid-request             an argument is malformed (the detail names it)
#   QS404 tenant-not-found
#   QS422 policy-envelope-exceeded    above the loaded policy (the detail names the cell)
#   QS429 backlog-cap-reached
#   QS409 idempotency-key-reuse       the key was used for another request
#   42501 (insufficient_privilege)    the calling role is not granted this tenant

# The role an application's role is made a member of: EXECUTE on the two functions and
# nothing else. Roles are the cluster's, not the database's: made once, kept on downgrade.
# Creating it needs CREATEROLE; the embedded server and the Docker image make it as the
# superuser before migrating.
ENQUEUER_ROLE = """
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'queue_server_enqueuer') THEN
        BEGIN
            CREATE ROLE queue_server_enqueuer NOLOGIN;
        EXCEPTION WHEN insufficient_privilege THEN
            RAISE EXCEPTION 'the role queue_server_enqueuer does not exist and % may not create it',
                current_user
                USING HINT = 'As a superuser (or a CREATEROLE role): '
                             'CREATE ROLE queue_server_enqueuer NOLOGIN; then migrate again.';
        END;
    END IF;
END
$$
"""

# A time-ordered id (UUID version 7: 48 bits of Unix milliseconds, then random), like
# queue_server.models.uuid7, on any PostgreSQL version (uuidv7() is 18's only).
UUID7 = """
CREATE FUNCTION queue_server.uuid7() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE
RETURN encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
    PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint)
                      FROM 3)
    FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid
"""

# The W3C trace context an enqueue keeps, read with exactly the rules of
# queue_server/tracecontext.py (`parse`): {"traceparent": ..., "tracestate": ...} (without
# tracestate when it is absent, malformed or longer than 512 characters), or NULL when
# traceparent is missing or malformed. Never an error: a bad header costs no enqueue.
# tests/transactional/test_trace_context_in_sql.py holds it to the Python rules.
TRACE_CONTEXT = """
CREATE FUNCTION queue_server.trace_context(traceparent text, tracestate text DEFAULT NULL)
RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN CASE
    -- Version 00, lower-case hex; a trace id and a parent id that are not all zeros.
    WHEN traceparent ~ '^00-[0-9a-f]{{32}}-[0-9a-f]{{16}}-[0-9a-f]{{2}}$'
     AND substr(traceparent, 4, 32) <> repeat('0', 32)
     AND substr(traceparent, 37, 16) <> repeat('0', 16)
    THEN jsonb_build_object('traceparent', traceparent)
         -- tracestate: at most 512 characters; 1 to 32 list members `key=value` (empty
         -- ones and the spaces and tabs around each skipped), each key once.
         || CASE WHEN length(tracestate) <= 512 AND (
                    SELECT count(*) BETWEEN 1 AND 32
                       AND bool_and(m ~ ('^(?:[a-z][a-z0-9_*/-]{{0,255}}'
                                         '|[a-z0-9][a-z0-9_*/-]{{0,240}}@[a-z][a-z0-9_*/-]{{0,13}})'
                                         '=[\\x20-\\x2b\\x2d-\\x3c\\x3e-\\x7e]{{0,255}}'
                                         '[\\x21-\\x2b\\x2d-\\x3c\\x3e-\\x7e]$'))
                       AND count(DISTINCT split_part(m, '=', 1)) = count(*)
                    FROM (SELECT btrim(member, E' \\t') AS m
                          FROM regexp_split_to_table(tracestate, ',') AS member) AS members
                    WHERE m <> '')
                 THEN jsonb_build_object('tracestate', tracestate)
                 ELSE '{{}}'::jsonb END
END
"""

# The admission of every enqueue: the REST route's (`transitions.enqueue` calls it), each
# fire of a schedule, and queue_server.enqueue's. In the caller's transaction: the tenant's
# admission lock, the backlog cap, the policy envelope, then the items with their ledger
# rows, the tenant's admitted counter, the outbox rows of its watchers and the NOTIFY that
# wakes waiting acquires (delivered when the caller commits). All or nothing.
#
# `items`: [{"item_id", "payload", "priority", "delay" (seconds), "max_acquisitions"}];
# `attempt_cap` and `backlog_ceiling`: the loaded policy's attempt cap and max-queued.
# SECURITY INVOKER: it runs with the table privileges of whoever calls it (the server's
# role, or the owner through queue_server.enqueue); a role without them gets nothing.
ADMIT = """
CREATE FUNCTION queue_server.admit(p_tenant text, p_queue text, p_items jsonb, p_actor text,
                                   p_attempt_cap int, p_backlog_ceiling bigint)
RETURNS SETOF work_items
LANGUAGE plpgsql VOLATILE
SET search_path = {home}, pg_temp
AS $fn$
DECLARE
    t tenants%ROWTYPE;
    n int := jsonb_array_length(p_items);
    backlog bigint;
    cap bigint;
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
    -- The admission lock (NO KEY UPDATE: it serialises admissions without blocking
    -- inserts that reference the tenant), held until the caller's transaction ends.
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
    IF backlog + n > cap THEN
        RAISE EXCEPTION 'backlog-cap-reached'
            USING ERRCODE = 'QS429',
                  DETAIL = format('Backlog %s + %s new would exceed the cap of %s.',
                                  backlog, n, cap);
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
    ), admitted AS (
        -- This transaction holds the row's lock (the admission lock) already.
        UPDATE tenants SET admitted = admitted + (SELECT count(*) FROM ins)
        WHERE tenant_id = p_tenant
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
    SELECT ins.* FROM ins,
         (SELECT pg_notify('queue_server_ready', p_tenant || '/' || p_queue)) AS n;
END
$fn$
"""

# What an application calls (SECURITY DEFINER: as the owner of the tables, which the
# caller cannot see). The calling session's role must be granted the tenant; its
# idempotency key is the tenant's, in the receipts the REST routes keep: the same key with
# the same arguments returns the first call's ids, with others raises QS409. The caller's
# trace context (p_traceparent, p_tracestate: the W3C headers' values) goes with every
# item, read by queue_server.trace_context (malformed: none); it is not part of the
# request's fingerprint: a retry from another trace is the same request.
ENQUEUE_ITEMS = """
CREATE FUNCTION queue_server.enqueue_items(p_tenant text, p_queue text, p_items jsonb,
                                           p_key text, p_call text, p_traceparent text,
                                           p_tracestate text)
RETURNS uuid[]
LANGUAGE plpgsql VOLATILE
SET search_path = {home}, pg_temp
AS $fn$
DECLARE
    env enqueue_envelope%ROWTYPE;
    specs jsonb;
    fingerprint text;
    receipt idempotency_receipts%ROWTYPE;
    ids uuid[];
    body jsonb;
    bad text;
    trace_ctx jsonb := coalesce(queue_server.trace_context(p_traceparent, p_tracestate), '{{}}');
BEGIN
    -- session_user: inside a SECURITY DEFINER function current_user is the owner. A login
    -- role may enqueue for a tenant granted to it or to a role it is a member of; the
    -- owner's own sessions (and superusers) for every tenant.
    IF p_tenant IS NULL OR NOT (
        pg_has_role(session_user, current_user, 'MEMBER')
        OR EXISTS (SELECT 1 FROM enqueue_grants g
                   WHERE g.tenant_id = p_tenant
                     AND coalesce(pg_has_role(session_user, g.role_oid, 'MEMBER'), false)))
    THEN
        RAISE EXCEPTION 'permission denied to enqueue for tenant %', coalesce(p_tenant, 'NULL')
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'An operator grants it: queue-server db grant-enqueue ROLE --tenant TENANT.';
    END IF;
    IF p_key IS NULL OR p_key !~ '^[!-~]{{1,255}}$' THEN
        bad := 'idempotency_key must be 1 to 255 printable ASCII characters.';
    ELSIF p_queue IS NULL OR p_queue !~ '^[A-Za-z0-9][A-Za-z0-9._-]{{0,63}}$' THEN
        bad := format('No queue can be named %L.', p_queue);
    ELSIF p_items IS NULL OR jsonb_typeof(p_items) <> 'array' THEN
        bad := 'items must be a JSON array of objects.';
    ELSIF jsonb_array_length(p_items) NOT BETWEEN 1 AND 500 THEN
        bad := format('items must hold 1 to 500 items, not %s.', jsonb_array_length(p_items));
    ELSE
        -- One CASE, its branches in order: a cast is reached only once the type is known.
        SELECT format('items[%s]: %s.', i - 1, why) INTO bad
        FROM (SELECT i, CASE
                  WHEN jsonb_typeof(e) <> 'object' THEN 'an item is a JSON object'
                  WHEN NOT e ? 'payload' THEN 'payload is required'
                  WHEN EXISTS (SELECT 1 FROM jsonb_object_keys(e) k WHERE k NOT IN
                               ('payload', 'priority', 'delay', 'max_acquisitions'))
                      THEN 'only payload, priority, delay and max_acquisitions are known'
                           || CASE WHEN e ? 'traceparent' OR e ? 'tracestate'
                                   THEN ' (the trace context is an argument of the call,'
                                        ' for every item)' ELSE '' END
                  WHEN jsonb_typeof(e->'priority') NOT IN ('number', 'null')
                      THEN 'priority must be a whole number'
                  WHEN (e->>'priority')::numeric NOT BETWEEN -1000000 AND 1000000
                    OR (e->>'priority')::numeric <> trunc((e->>'priority')::numeric)
                      THEN 'priority must be a whole number from -1000000 to 1000000'
                  WHEN jsonb_typeof(e->'delay') NOT IN ('number', 'null')
                      THEN 'delay must be a number of seconds'
                  WHEN (e->>'delay')::numeric NOT BETWEEN 0 AND 31536000
                      THEN 'delay must be 0 to 31536000 seconds'
                  WHEN jsonb_typeof(e->'max_acquisitions') NOT IN ('number', 'null')
                      THEN 'max_acquisitions must be a whole number'
                  WHEN (e->>'max_acquisitions')::numeric NOT BETWEEN 1 AND 100
                    OR (e->>'max_acquisitions')::numeric
                       <> trunc((e->>'max_acquisitions')::numeric)
                      THEN 'max_acquisitions must be a whole number from 1 to 100'
                  WHEN octet_length((e->'payload')::text) > 1048576
                      THEN 'payload is larger than 1 MiB'
              END AS why
              FROM jsonb_array_elements(p_items) WITH ORDINALITY AS x(e, i)) AS c
        WHERE why IS NOT NULL
        ORDER BY i LIMIT 1;
    END IF;
    IF bad IS NOT NULL THEN
        RAISE EXCEPTION 'invalid-request' USING ERRCODE = 'QS400', DETAIL = bad;
    END IF;
    PERFORM 1 FROM tenants WHERE tenant_id = p_tenant;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'tenant-not-found'
            USING ERRCODE = 'QS404', DETAIL = format('No tenant is named %s.', p_tenant);
    END IF;
    SELECT * INTO STRICT env FROM enqueue_envelope;
    -- Each item as admitted, defaults filled: the same call is the same fingerprint (the
    -- trace context is not in it).
    SELECT jsonb_agg(jsonb_build_object(
               'payload', e->'payload',
               'priority', coalesce((e->>'priority')::int, 0),
               'delay', coalesce((e->>'delay')::double precision, 0),
               'max_acquisitions', (e->>'max_acquisitions')::int) ORDER BY i)
        INTO specs
    FROM jsonb_array_elements(p_items) WITH ORDINALITY AS x(e, i);
    fingerprint := encode(sha256(convert_to(
        jsonb_build_array(p_call, p_queue, specs)::text, 'UTF8')), 'hex');
    -- The claim: ON CONFLICT waits while another transaction holds an uncommitted receipt
    -- with this key, then sees its outcome.
    INSERT INTO idempotency_receipts AS r
        (tenant_id, idempotency_key, fingerprint, response_status, response_body, expires_at)
    VALUES (p_tenant, p_key, fingerprint, 0, '', statement_timestamp() + env.receipt_retention)
    ON CONFLICT (tenant_id, idempotency_key) DO NOTHING;
    IF NOT FOUND THEN
        SELECT * INTO STRICT receipt FROM idempotency_receipts r
        WHERE r.tenant_id = p_tenant AND r.idempotency_key = p_key;
        IF receipt.fingerprint <> fingerprint OR receipt.response_status <> 201 THEN
            RAISE EXCEPTION 'idempotency-key-reuse'
                USING ERRCODE = 'QS409',
                      DETAIL = format('The key %L of tenant %s was used for another request.',
                                      p_key, p_tenant);
        END IF;
        RETURN ARRAY(SELECT (x.e->>'item_id')::uuid
                     FROM jsonb_array_elements(receipt.response_body::jsonb -> 'items')
                          WITH ORDINALITY AS x(e, i) ORDER BY x.i);
    END IF;
    ids := ARRAY(SELECT queue_server.uuid7() FROM generate_series(1, jsonb_array_length(specs)));
    SELECT jsonb_build_object('items', jsonb_agg(item_json(a)
                                                 ORDER BY array_position(ids, a.item_id)))
        INTO body
    FROM queue_server.admit(
        p_tenant, p_queue,
        (SELECT jsonb_agg(s || jsonb_build_object('item_id', ids[i]) || trace_ctx ORDER BY i)
         FROM jsonb_array_elements(specs) WITH ORDINALITY AS x(s, i)),
        'role:' || session_user, env.attempt_cap, env.backlog_cap) AS a;
    UPDATE idempotency_receipts r SET response_status = 201, response_body = body::text
    WHERE r.tenant_id = p_tenant AND r.idempotency_key = p_key;
    RETURN ids;
END
$fn$
"""

ENQUEUE = """
CREATE FUNCTION queue_server.enqueue(tenant text, queue text, payload jsonb,
                                     idempotency_key text, priority int DEFAULT 0,
                                     delay interval DEFAULT '0',
                                     max_acquisitions int DEFAULT NULL,
                                     traceparent text DEFAULT NULL,
                                     tracestate text DEFAULT NULL)
RETURNS uuid
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = {home}, pg_temp
BEGIN ATOMIC
    SELECT (queue_server.enqueue_items(
        tenant, queue,
        jsonb_build_array(jsonb_build_object(
            'payload', payload, 'priority', priority,
            'delay', extract(epoch FROM delay), 'max_acquisitions', max_acquisitions)),
        idempotency_key, 'queue_server.enqueue', traceparent, tracestate))[1];
END
"""

ENQUEUE_MANY = """
CREATE FUNCTION queue_server.enqueue_many(tenant text, queue text, items jsonb,
                                          idempotency_key text,
                                          traceparent text DEFAULT NULL,
                                          tracestate text DEFAULT NULL)
RETURNS uuid[]
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = {home}, pg_temp
BEGIN ATOMIC
    SELECT queue_server.enqueue_items(tenant, queue, items, idempotency_key,
                                      'queue_server.enqueue_many', traceparent, tracestate);
END
"""

# What `queue-server db grant-enqueue` and `revoke-enqueue` run, as a role that may create
# roles and grant queue_server_enqueuer (a superuser, or CREATEROLE with its ADMIN option):
# identifiers are quoted here, by format(%I), never in Python. A new role logs in with
# `password`; an existing role keeps its own. Returns whether the role was created.
GRANT_ENQUEUE = """
CREATE FUNCTION queue_server.grant_enqueue(p_role text, p_tenant text, p_password text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = {home}, pg_temp
AS $fn$
DECLARE
    created boolean := false;
BEGIN
    IF p_role IS NULL OR p_role = '' OR p_role ~ '^pg_' THEN
        RAISE EXCEPTION 'invalid-request'
            USING ERRCODE = 'QS400', DETAIL = format('No role can be named %L here.', p_role);
    END IF;
    PERFORM 1 FROM tenants WHERE tenant_id = p_tenant;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'tenant-not-found'
            USING ERRCODE = 'QS404', DETAIL = format('No tenant is named %s.', p_tenant);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = p_role) THEN
        IF p_password IS NULL THEN
            RAISE EXCEPTION 'invalid-request' USING ERRCODE = 'QS400',
                DETAIL = format('The role %s does not exist and no password was given.', p_role);
        END IF;
        EXECUTE format('CREATE ROLE %I LOGIN PASSWORD %L', p_role, p_password);
        created := true;
    END IF;
    IF NOT pg_has_role(p_role, 'queue_server_enqueuer', 'MEMBER') THEN
        EXECUTE format('GRANT queue_server_enqueuer TO %I', p_role);
    END IF;
    INSERT INTO enqueue_grants (tenant_id, role_oid, role_name)
    SELECT p_tenant, oid, rolname FROM pg_roles WHERE rolname = p_role
    ON CONFLICT (tenant_id, role_oid) DO UPDATE SET role_name = EXCLUDED.role_name;
    RETURN created;
END
$fn$
"""

# The grant of one tenant taken back (at once: the next call is refused); with no tenant of
# this database left to the role, its membership of queue_server_enqueuer too. The role
# itself stays: the application may use it for its own tables. Returns whether a grant
# was there.
REVOKE_ENQUEUE = """
CREATE FUNCTION queue_server.revoke_enqueue(p_role text, p_tenant text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path = {home}, pg_temp
AS $fn$
DECLARE
    found_grant boolean;
BEGIN
    DELETE FROM enqueue_grants g
    WHERE g.tenant_id = p_tenant AND g.role_oid = (SELECT oid FROM pg_roles WHERE rolname = p_role);
    found_grant := FOUND;
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = p_role)
       AND NOT EXISTS (SELECT 1 FROM enqueue_grants g
                       WHERE g.role_oid = (SELECT oid FROM pg_roles WHERE rolname = p_role))
       AND EXISTS (SELECT 1 FROM pg_auth_members m
                   WHERE m.member = (SELECT oid FROM pg_roles WHERE rolname = p_role)
                     AND m.roleid = (SELECT oid FROM pg_roles
                                     WHERE rolname = 'queue_server_enqueuer'))
    THEN
        EXECUTE format('REVOKE queue_server_enqueuer FROM %I', p_role);
    END IF;
    RETURN found_grant;
END
$fn$
"""


def _ts(name: str, **kw: object) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), **kw)  # type: ignore[arg-type]


def upgrade() -> None:
    conn = op.get_bind()
    # Where the tables are (public, unless the database says otherwise): the functions pin
    # it as their search_path, and the tables below go there before the schema exists.
    home = conn.execute(sa.text("SELECT current_schema()")).scalar_one()
    op.execute(ENQUEUER_ROLE)
    # Which tenants a role may enqueue for. By oid: a role renamed keeps its grants, a
    # role dropped matches nothing; its name is kept for the operator's listing.
    op.create_table(
        "enqueue_grants",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("role_oid", postgresql.OID(), nullable=False),
        sa.Column("role_name", sa.Text(), nullable=False),
        _ts("granted_at", server_default=sa.text("now()"), nullable=False),
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.tenant_id"],
            name=op.f("fk_enqueue_grants_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "role_oid", name=op.f("pk_enqueue_grants")),
        schema=home,
    )
    # The loaded policy's ceilings for queue_server.enqueue, and the receipts' retention:
    # the server writes its own at each start; until then the built-in v2's.
    op.create_table(
        "enqueue_envelope",
        sa.Column("singleton", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("policy_version", sa.Text(), nullable=False),
        sa.Column("attempt_cap", sa.Integer(), nullable=False),
        sa.Column("backlog_cap", sa.BigInteger(), nullable=False),
        sa.Column("receipt_retention", sa.Interval(), nullable=False),
        _ts("updated_at", server_default=sa.text("now()"), nullable=False),
        sa.CheckConstraint("singleton", name=op.f("ck_enqueue_envelope_one_row")),
        sa.PrimaryKeyConstraint("singleton", name=op.f("pk_enqueue_envelope")),
        schema=home,
    )
    op.execute(
        f"INSERT INTO {home}.enqueue_envelope (policy_version, attempt_cap, backlog_cap,"
        " receipt_retention) VALUES ('operation-reliability.v2', 5, 10000, interval '24 hours')"
    )
    op.execute("CREATE SCHEMA queue_server")
    # A role named like the schema ("$user" in the default search_path: the embedded
    # server's and the Docker image's) would otherwise create every later table there.
    if conn.execute(sa.text("SELECT current_user = 'queue_server'")).scalar_one():
        op.execute(f"ALTER ROLE CURRENT_USER SET search_path = {home}")
        op.execute(f"SET LOCAL search_path = {home}")
    for ddl in (
        UUID7,
        TRACE_CONTEXT,
        ADMIT,
        ENQUEUE_ITEMS,
        ENQUEUE,
        ENQUEUE_MANY,
        GRANT_ENQUEUE,
        REVOKE_ENQUEUE,
    ):
        op.execute(ddl.replace("{home}", home).replace("{{", "{").replace("}}", "}"))
    # The schema is visible to every role; what runs is what EXECUTE allows. uuid7 and
    # admit run with their caller's rights (admit needs the tables'), trace_context (it
    # reads no table) by anyone; enqueue_items only from the two entry points, which only
    # queue_server_enqueuer may call; grant_enqueue and revoke_enqueue by the owner and
    # superusers.
    op.execute("GRANT USAGE ON SCHEMA queue_server TO PUBLIC")
    for function in (
        "queue_server.grant_enqueue(text, text, text)",
        "queue_server.revoke_enqueue(text, text)",
        "queue_server.enqueue_items(text, text, jsonb, text, text, text, text)",
        "queue_server.enqueue(text, text, jsonb, text, int, interval, int, text, text)",
        "queue_server.enqueue_many(text, text, jsonb, text, text, text)",
    ):
        op.execute(f"REVOKE EXECUTE ON FUNCTION {function} FROM PUBLIC")
    for function in (
        "queue_server.enqueue(text, text, jsonb, text, int, interval, int, text, text)",
        "queue_server.enqueue_many(text, text, jsonb, text, text, text)",
    ):
        op.execute(f"GRANT EXECUTE ON FUNCTION {function} TO queue_server_enqueuer")


def downgrade() -> None:
    conn = op.get_bind()
    op.execute("DROP SCHEMA queue_server CASCADE")
    if conn.execute(sa.text("SELECT current_user = 'queue_server'")).scalar_one():
        op.execute("ALTER ROLE CURRENT_USER RESET search_path")
    op.drop_table("enqueue_envelope")
    op.drop_table("enqueue_grants")
