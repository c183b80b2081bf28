"""The migrations build the schema the code expects, and undo it."""

from __future__ import annotations

from datetime import timedelta

import psycopg
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from psycopg.rows import dict_row
from sqlalchemy import create_engine, pool

from queue_server.infra import migrate
from queue_server.store.tables import metadata
from queue_server.store.transitions import _ACQUIRE


def _tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        ).fetchall()
    return {row[0] for row in rows}


def test_upgrade_downgrade_upgrade_round_trips(database_url: str) -> None:
    assert migrate.is_at_head(database_url)
    migrate.downgrade(database_url, "base")
    assert _tables(database_url) == {"alembic_version"}
    assert migrate.current_revisions(database_url) == set()
    migrate.upgrade(database_url)
    assert migrate.is_at_head(database_url)
    assert {"work_items", "item_events", "idempotency_receipts", "tenants"} <= _tables(database_url)


def test_autogenerate_finds_no_difference_between_migrations_and_tables(database_url: str) -> None:
    engine = create_engine(migrate.sqlalchemy_url(database_url), poolclass=pool.NullPool)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), metadata)
    engine.dispose()
    assert diff == []


def test_prepared_acquire_plan_reads_the_ready_index_not_the_whole_table(
    database_url: str,
) -> None:
    """The planner trap of DESIGN.md: a generic plan must still use the acquire-order index."""
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as conn:
        conn.execute("INSERT INTO tenants VALUES ('t', 10, 5, '30 seconds', now(), now())")
        # Plenty of finished history, so a scan past it would show.
        conn.execute(
            "INSERT INTO work_items (tenant_id, queue, payload, state, fence, acquisition_count,"
            " max_acquisitions) SELECT 't', 'q', '{}', 'completed', 1, 1, 5"
            " FROM generate_series(1, 20000)"
        )
        conn.execute(
            "INSERT INTO work_items (tenant_id, queue, payload, max_acquisitions)"
            " SELECT 't', 'q', '{}', 5 FROM generate_series(1, 20000)"
        )
        conn.execute("ANALYZE work_items")
        conn.execute("SET plan_cache_mode = force_generic_plan")
        sql = _ACQUIRE.replace("%(tenant)s", "$1").replace("%(queue)s", "$2")
        sql = sql.replace("%(worker)s", "$3").replace("%(ttl)s", "$4::interval")
        sql = sql.replace("%(max_items)s", "$5::int").replace("%(shard)s", "$6::int")
        sql = sql.replace("%(shared)s", "$7::bool").replace("%(slack)s", "$8::int")
        sql = sql.replace("%(deadline)s", "$9::interval").replace("%(base_limit)s", "$10::int")
        conn.execute(
            f"PREPARE acq(text, text, text, interval, int, int, bool, int, interval, int) AS {sql}"
        )
        generic = "\n".join(
            row["QUERY PLAN"]
            for row in conn.execute(
                "EXPLAIN EXECUTE acq('t', 'q', 'w', '30 seconds', 50, 0, false, 0, '900 seconds', 1)"
            ).fetchall()
        )
        custom = "\n".join(
            row["QUERY PLAN"]
            for row in conn.execute(
                "EXPLAIN " + _ACQUIRE,
                {
                    "tenant": "t",
                    "queue": "q",
                    "worker": "w",
                    "ttl": timedelta(seconds=30),
                    "deadline": timedelta(seconds=900),
                    "base_limit": 1,
                    "max_items": 50,
                    "shard": 0,
                    "shared": False,
                    "slack": 0,
                },
            ).fetchall()
        )
    for plan in (generic, custom):
        assert "ix_work_items_ready" in plan
        # Neither the candidate scan nor the update of the picked rows may read the table.
        assert "Seq Scan on work_items" not in plan
        assert "Index Scan using pk_work_items on work_items w" in plan
