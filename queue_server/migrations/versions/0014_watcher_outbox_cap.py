"""the watcher outbox cap: a watcher past it is backlogged (since when, missed from which
ledger instant); its rows are admitted by one trigger; backfilled rows are marked

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _ts(name: str, **kw: object) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), **kw)  # type: ignore[arg-type]


# A delivery's key (its `webhook-id`), derived from its event: the watcher, the item and the
# ledger seq of the event. The transition that writes the row and a backfill that writes
# it from the ledger derive the same key, so the unique (tenant_id, delivery_key) index
# lets one event become at most one delivery per watcher. One expression, inlined.
DELIVERY_KEY = """
CREATE FUNCTION delivery_key(watcher uuid, item uuid, seq bigint) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN 'msg_' || md5(watcher::text || '/' || item::text || '/' || seq::text)
"""

# Every outbox row a transition writes passes here (the `outbox` CTE of each statement in
# store/sql/transitions.sql). The cap is the session's `queue_server.outbox_cap` (the
# loaded policy's watcher-delivery max-queued, set on every server session; a session
# without it, such as a psql one, writes every row). The watcher's row lock is held to
# the commit, so the writers of one watcher's rows count one after another: VOLATILE, each
# statement below takes a new snapshot and sees what the writer before committed (and
# the rows this statement wrote before). A watcher at the cap, or already backlogged,
# gets no row: it is marked, with the earliest ledger instant it missed (the event's
# statement_timestamp(), the `at` of its item_events row), and the deliverer writes
# the missed events from the ledger once its outbox has room (`backfilled` rows pass).
OUTBOX_ADMIT = """
CREATE FUNCTION outbox_admit() RETURNS trigger
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    cap integer := nullif(current_setting('queue_server.outbox_cap', true), '')::integer;
    marked timestamptz;
    touched timestamptz;
    pending bigint;
BEGIN
    IF cap IS NULL OR NEW.backfilled OR NEW.state <> 'pending' THEN
        RETURN NEW;
    END IF;
    SELECT w.backlogged_at, w.updated_at INTO marked, touched FROM watchers w
    WHERE w.tenant_id = NEW.tenant_id AND w.watcher_id = NEW.watcher_id
    FOR UPDATE;
    IF marked IS NULL THEN
        SELECT count(*) INTO pending FROM outbox_deliveries o
        WHERE o.tenant_id = NEW.tenant_id AND o.watcher_id = NEW.watcher_id
          AND o.state = 'pending';
        IF pending < cap THEN
            IF touched > NEW.created_at THEN
                -- The watcher changed after this statement began (a backfill that this row
                -- waited for): the row is numbered and due after the backfill's rows, as
                -- its event is after theirs (seq and due_at were given before the wait).
                NEW.seq := nextval(pg_get_serial_sequence('outbox_deliveries', 'seq'));
                NEW.due_at := greatest(NEW.due_at, touched);
            END IF;
            RETURN NEW;
        END IF;
    END IF;
    UPDATE watchers w
    SET backlogged_at = coalesce(w.backlogged_at, statement_timestamp()),
        backlog_from = least(w.backlog_from, statement_timestamp())
    WHERE w.tenant_id = NEW.tenant_id AND w.watcher_id = NEW.watcher_id
      AND (w.backlog_from IS NULL OR w.backlog_from > statement_timestamp());
    RETURN NULL;
END
$$
"""


def upgrade() -> None:
    op.add_column("watchers", _ts("backlogged_at", nullable=True))
    op.add_column("watchers", _ts("backlog_from", nullable=True))
    op.create_check_constraint(
        "backlog_from_known",
        "watchers",
        "(backlogged_at IS NULL) = (backlog_from IS NULL)",
    )
    # Written from the ledger by a backfill (the cap was checked by the backfill).
    op.add_column(
        "outbox_deliveries",
        sa.Column("backfilled", sa.Boolean(), server_default=sa.text("false"), nullable=False),
    )
    # The cap's count: a watcher's pending rows, whatever its delivered history.
    op.create_index(
        "ix_outbox_deliveries_watcher_pending",
        "outbox_deliveries",
        ["tenant_id", "watcher_id"],
        unique=False,
        postgresql_where=sa.text("state = 'pending'"),
    )
    # The backfill reads the ledger from an instant on: BRIN, since rows arrive in time
    # order, costs the transitions next to nothing.
    op.create_index(
        "ix_item_events_at", "item_events", ["at"], unique=False, postgresql_using="brin"
    )
    op.execute(DELIVERY_KEY)
    op.execute(OUTBOX_ADMIT)
    op.execute(
        "CREATE TRIGGER outbox_admit BEFORE INSERT ON outbox_deliveries"
        " FOR EACH ROW EXECUTE FUNCTION outbox_admit()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER outbox_admit ON outbox_deliveries")
    op.execute("DROP FUNCTION outbox_admit()")
    op.execute("DROP FUNCTION delivery_key(uuid, uuid, bigint)")
    op.drop_index("ix_item_events_at", table_name="item_events", postgresql_using="brin")
    op.drop_index(
        "ix_outbox_deliveries_watcher_pending",
        table_name="outbox_deliveries",
        postgresql_where=sa.text("state = 'pending'"),
    )
    op.drop_column("outbox_deliveries", "backfilled")
    op.drop_constraint(op.f("ck_watchers_backlog_from_known"), "watchers")
    op.drop_column("watchers", "backlog_from")
    op.drop_column("watchers", "backlogged_at")
