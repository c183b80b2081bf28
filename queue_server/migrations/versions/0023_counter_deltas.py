"""the counters become append-only: each transition inserts a delta row (never an update),
a periodic fold sums the deltas into a new base row; `queue_counters`, `backlog_releases`
and `tenants.admitted` go, their totals the first base

While another session holds an old snapshot, PostgreSQL cannot prune any version of a row
newer than it: a counter row updated by every transition grew a version chain that every
read of it, and every foreign-key check against the `tenants` row, walked. A delta row is
written once; a fold deletes the deltas it summed, and a reader's range of the index
(`xid >= the base's as_of_xid`) lies above them, so a reader reads the deltas since the
last fold whatever snapshot is held.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-04
"""

import importlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | Sequence[str] | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

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

# The totals of every (tenant, queue): the latest base (every delta of a transaction below
# its as_of_xid summed in it) and the deltas from its as_of_xid on. The newest base is the
# first row a backward scan of the bases' key meets (older ones are deleted with the fold
# that replaced them); the deltas' range starts above every folded delta, so neither read
# walks what a held snapshot keeps from being pruned. The upper bound is true of every delta
# a snapshot can see (another's committed below the snapshot's xmax, or this transaction's
# own): with it the planner takes the range for a narrow one, where a lower bound it cannot
# know when planning is a third of the table (under a held snapshot, its dead rows too).
COUNTER_TOTALS = """
CREATE VIEW {home}.counter_totals AS
WITH base AS (
    SELECT coalesce((SELECT as_of_xid FROM counter_bases ORDER BY as_of_xid DESC LIMIT 1),
                    '0'::xid8) AS as_of_xid
)
SELECT c.tenant_id, c.queue,
       sum(c.admitted)::bigint AS admitted, sum(c.released)::bigint AS released,
       sum(c.completed)::bigint AS completed, sum(c.failed)::bigint AS failed,
       sum(c.quarantined)::bigint AS quarantined, sum(c.cancelled)::bigint AS cancelled,
       sum(c.purged_completed)::bigint AS purged_completed,
       sum(c.purged_cancelled)::bigint AS purged_cancelled,
       sum(c.timed_completions)::bigint AS timed_completions,
       sum(c.completion_ms)::bigint AS completion_ms
FROM (
    SELECT b.tenant_id, b.queue, b.admitted, b.released, b.completed, b.failed, b.quarantined,
           b.cancelled, b.purged_completed, b.purged_cancelled, b.timed_completions,
           b.completion_ms
    FROM counter_bases b WHERE b.as_of_xid = (SELECT as_of_xid FROM base)
    UNION ALL
    SELECT d.tenant_id, d.queue, d.admitted, d.released, d.completed, d.failed, d.quarantined,
           d.cancelled, d.purged_completed, d.purged_cancelled, d.timed_completions,
           d.completion_ms
    FROM counter_deltas d
    WHERE d.xid >= (SELECT as_of_xid FROM base)
      AND d.xid <= greatest(pg_snapshot_xmax(pg_current_snapshot()),
                            pg_current_xact_id_if_assigned())
) AS c
GROUP BY c.tenant_id, c.queue
"""

# The admission of 0020 (its NOTIFY carrying 0022's ready tag), its counter a delta: the tenant's admission lock (NO KEY UPDATE: the
# row is locked, not updated, so its version chain does not grow), the exact backlog cap
# (admitted - released of the committed work: every admission committed before the lock
# was granted is visible, a release in flight is not yet, which only overestimates the
# backlog), one `admitted` delta and the NOTIFY.
ADMIT_SEAL = """
CREATE OR REPLACE FUNCTION queue_server.admit_seal(p_tenant text, p_queue text, p_n int,
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
    -- A statement of its own: its snapshot is taken after the lock was granted, so it
    -- sees every admission and release committed before.
    SELECT coalesce(sum(c.admitted - c.released), 0) INTO backlog
    FROM counter_totals c WHERE c.tenant_id = p_tenant;
    -- A cap stored under a looser policy is held to the loaded one.
    cap := least(t.backlog_cap, p_backlog_ceiling);
    IF backlog + p_n > cap THEN
        RAISE EXCEPTION 'backlog-cap-reached'
            USING ERRCODE = 'QS429',
                  DETAIL = format('Backlog %s + %s new would exceed the cap of %s.',
                                  backlog, p_n, cap);
    END IF;
    INSERT INTO counter_deltas (tenant_id, queue, admitted) VALUES (p_tenant, p_queue, p_n);
    PERFORM pg_notify('queue_server_ready', queue_server.ready_tag(p_tenant, p_queue));
END
$fn$
"""


def _ddl(text: str, home: str) -> str:
    return text.replace("{home}", home).replace("{{", "{").replace("}}", "}")


def _home() -> str:
    """The tables' schema (as 0020's)."""
    found = op.get_bind().execute(
        sa.text(
            "SELECT relnamespace::regnamespace::text FROM pg_class"
            " WHERE oid = 'work_items'::regclass"
        )
    )
    return str(found.scalar_one())


def _counts() -> str:
    return ",\n".join(f"    {name} bigint NOT NULL DEFAULT 0" for name in COUNTS)


def upgrade() -> None:
    home = _home()
    # One row per (tenant, queue) a transition statement touched, written by it and never
    # updated; `xid` is its transaction's id. No foreign key (as backlog_releases had
    # none): a completion does not lock the tenant's row for a check; deleting a tenant
    # deletes its deltas, and the fold drops any of a tenant that is gone.
    op.execute(
        f"""
        CREATE TABLE {home}.counter_deltas (
            tenant_id text NOT NULL,
            queue text NOT NULL,
            xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
        {_counts()}
        )
        """
    )
    # A tenant's deltas since a fold (its figures, its backlog); everyone's (a scrape, the
    # sampler, the fold).
    op.execute(
        f"CREATE INDEX ix_counter_deltas_tenant_id_xid ON {home}.counter_deltas (tenant_id, xid)"
    )
    op.execute(f"CREATE INDEX ix_counter_deltas_xid ON {home}.counter_deltas (xid)")
    # The totals of every (tenant, queue) as of a fold: every delta of a transaction below
    # `as_of_xid` summed. Inserted by a fold, deleted by the next, never updated.
    op.execute(
        f"""
        CREATE TABLE {home}.counter_bases (
            as_of_xid xid8 NOT NULL,
            tenant_id text NOT NULL,
            queue text NOT NULL,
        {_counts()},
            folded_at timestamptz NOT NULL DEFAULT now(),
            CONSTRAINT pk_counter_bases PRIMARY KEY (as_of_xid, tenant_id, queue),
            CONSTRAINT fk_counter_bases_tenant_id_tenants FOREIGN KEY (tenant_id)
                REFERENCES {home}.tenants (tenant_id) ON DELETE CASCADE
        )
        """
    )
    # The first base, as of this transaction (every later delta is at or above it): each
    # queue's counters, and as its admitted count its items in the backlog (ready or
    # leased), which is what the tenant's admitted - released stood for (nothing runs
    # while the schema migrates).
    op.execute(
        f"""
        INSERT INTO {home}.counter_bases (as_of_xid, tenant_id, queue, {", ".join(COUNTS)})
        SELECT pg_current_xact_id(), tenant_id, queue, sum(admitted), 0, sum(completed),
               sum(failed), sum(quarantined), sum(cancelled), sum(purged_completed),
               sum(purged_cancelled), sum(timed_completions), sum(completion_ms)
        FROM (
            SELECT tenant_id, queue, 0 AS admitted, completed, failed, quarantined, cancelled,
                   purged_completed, purged_cancelled, timed_completions, completion_ms
            FROM queue_counters
            UNION ALL
            SELECT tenant_id, queue, 1, 0, 0, 0, 0, 0, 0, 0, 0 FROM work_items
            WHERE state IN ('ready', 'leased')
        ) AS c
        GROUP BY tenant_id, queue
        """
    )
    op.execute(_ddl(COUNTER_TOTALS, home))
    op.execute(_ddl(ADMIT_SEAL, home))
    op.drop_table("queue_counters", schema=home)
    op.drop_table("backlog_releases", schema=home)
    op.drop_column("tenants", "admitted", schema=home)


def downgrade() -> None:
    home = _home()
    op.add_column(
        "tenants",
        sa.Column("admitted", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        schema=home,
    )
    op.create_table(
        "backlog_releases",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("shard", sa.Integer(), nullable=False),
        sa.Column("released", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.PrimaryKeyConstraint("tenant_id", "shard", name=op.f("pk_backlog_releases")),
        schema=home,
    )
    op.create_table(
        "queue_counters",
        sa.Column("tenant_id", sa.Text(), nullable=False),
        sa.Column("queue", sa.Text(), nullable=False),
        sa.Column("shard", sa.Integer(), nullable=False),
        *[
            sa.Column(name, sa.BigInteger(), server_default=sa.text("0"), nullable=False)
            for name in COUNTS[2:]
        ],
        sa.ForeignKeyConstraint(
            ["tenant_id"],
            ["tenants.tenant_id"],
            name=op.f("fk_queue_counters_tenant_id_tenants"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("tenant_id", "queue", "shard", name=op.f("pk_queue_counters")),
        schema=home,
    )
    # The totals go back on shard 0.
    op.execute(
        """
        INSERT INTO queue_counters (tenant_id, queue, shard, completed, failed, quarantined,
                                    cancelled, purged_completed, purged_cancelled,
                                    timed_completions, completion_ms)
        SELECT tenant_id, queue, 0, completed, failed, quarantined, cancelled,
               purged_completed, purged_cancelled, timed_completions, completion_ms
        FROM counter_totals
        """
    )
    op.execute(
        "INSERT INTO backlog_releases (tenant_id, shard, released)"
        " SELECT tenant_id, 0, sum(released) FROM counter_totals GROUP BY tenant_id"
    )
    op.execute(
        "UPDATE tenants t SET admitted = c.admitted FROM"
        " (SELECT tenant_id, sum(admitted) AS admitted FROM counter_totals GROUP BY tenant_id) c"
        " WHERE c.tenant_id = t.tenant_id"
    )
    # 0022's admission: 0020's, its NOTIFY carrying the ready tag.
    previous = importlib.import_module("queue_server.migrations.versions.0020_admission_lock_last")
    notify = "PERFORM pg_notify('queue_server_ready', p_tenant || '/' || p_queue);"
    tagged = "PERFORM pg_notify('queue_server_ready', queue_server.ready_tag(p_tenant, p_queue));"
    seal: str = previous.ADMIT_SEAL
    assert notify in seal
    seal = seal.replace(notify, tagged).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")
    op.execute(_ddl(seal, home))
    op.execute(f"DROP VIEW {home}.counter_totals")
    op.drop_table("counter_bases", schema=home)
    op.drop_table("counter_deltas", schema=home)
