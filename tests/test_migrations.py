"""The migrations build the schema the code expects, and undo it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from psycopg import sql as pgsql
from psycopg.rows import dict_row
from sqlalchemy import create_engine, pool

from queue_server.infra import migrate
from queue_server.store import channels, cursors, reads, transitions
from queue_server.store import queues as queue_store
from queue_server.store.cursors import Cursor
from queue_server.store.tables import metadata


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
        _completed_history(conn, 20000)
        conn.execute(
            "INSERT INTO work_items (tenant_id, queue, payload, max_acquisitions)"
            " SELECT 't', 'q', '{}', 5 FROM generate_series(1, 20000)"
        )
        # A few leases: the statistics make the whole index of leases placed since a
        # snapshot look cheaper than a range of the leased index.
        conn.execute(
            "INSERT INTO work_items (tenant_id, queue, payload, state, fence, acquisition_count,"
            " max_acquisitions, lease_holder, lease_expires_at, lease_deadline_at)"
            " SELECT 't', 'q', '{}', 'leased', 1, 1, 5, 'w',"
            "        now() + interval '30 seconds', now() + interval '1 hour'"
            " FROM generate_series(1, 16)"
        )
        conn.execute("ANALYZE work_items")
        conn.execute("SET plan_cache_mode = force_generic_plan")
        sql = transitions._SQL["acquire"].replace("%(tenant)s", "$1").replace("%(queue)s", "$2")
        sql = sql.replace("%(worker)s", "$3").replace("%(ttl)s", "$4::interval")
        sql = sql.replace("%(max_items)s", "$5::int").replace("%(shard)s", "$6::int")
        sql = sql.replace("%(shared)s", "$7::bool").replace("%(deadline)s", "$8::interval")
        sql = sql.replace("%(base_limit)s", "$9::int").replace("%(max_ttl)s", "$10::interval")
        sql = sql.replace("%(max_approved)s", "$11::int").replace("%(key_id)s", "$12::text")
        sql = sql.replace("%(since_xid)s", "$13").replace("%(lane_priority)s", "$14")
        sql = sql.replace("%(lane_at)s", "$15").replace("%(lane_id)s", "$16")
        sql = sql.replace("%(expired_from)s", "$17").replace("%(active_ids)s", "$18")
        sql = sql.replace("%(until_xid)s", "$19").replace("%(lane_key)s", "$20")
        sql = sql.replace("%(lane_width)s", "$21")
        conn.execute(
            "PREPARE acq(text, text, text, interval, int, int, bool, interval, int, interval,"
            " int, text, xid8, int[], timestamptz[], uuid[], timestamptz, uuid[], xid8, text[],"
            " int[])"
            f" AS {sql}"
        )
        generic = "\n".join(
            row["QUERY PLAN"]
            for row in conn.execute(
                "EXPLAIN EXECUTE acq('t', 'q', 'w', '30 seconds', 50, 0, false, '900 seconds', 1,"
                " '30 seconds', 1000, '0123456789abcdef', pg_current_xact_id(), '{0}',"
                " ARRAY[now()], ARRAY[gen_random_uuid()], now(), ARRAY[gen_random_uuid()],"
                f" '{cursors.XID8_MAX}', '{{NULL}}', '{{1}}')"
            ).fetchall()
        )
        terms = {
            "tenant": "t",
            "queue": "q",
            "worker": "w",
            "key_id": "0123456789abcdef",
            "max_approved": 1000,
            "ttl": timedelta(seconds=30),
            "max_ttl": timedelta(seconds=30),
            "deadline": timedelta(seconds=900),
            "base_limit": 1,
            "max_items": 50,
            "shard": 0,
            "shared": False,
        }
        # With no cursor, and with one as a connection keeps it after its first acquire.
        warm = _warm_cursor(conn)
        custom, resumed = (
            "\n".join(
                r["QUERY PLAN"]
                for r in conn.execute(
                    "EXPLAIN " + transitions._SQL["acquire"], {**terms, **cursor.params()}
                ).fetchall()
            )
            for cursor in (Cursor(), warm)
        )
        # The indexes of rows placed since a snapshot serve only a range of `placed_xid`:
        # under an old snapshot they hold every row taken since it began, so a scan of one
        # whole (as for expired leases, when statistics saw few) reads all of that. Even
        # without the ready and leased indexes, no plan may read them otherwise.
        with conn.transaction(force_rollback=True):
            conn.execute("DROP INDEX ix_work_items_ready, ix_work_items_leased")
            row = conn.execute(
                "EXPLAIN (FORMAT JSON) " + transitions._SQL["acquire"],
                {**terms, **warm.params()},
            ).fetchone()
            assert row is not None
            placed = [
                n
                for n in _plan_nodes(row["QUERY PLAN"][0]["Plan"])
                if str(n.get("Index Name", "")).endswith("_placed")
            ]
            assert placed
            for node in placed:
                assert "placed_xid >=" in node.get("Index Cond", ""), node
            # Nor the item list's indexes, whose ready range holds every dead version too.
            used = {n.get("Index Name") for n in _plan_nodes(row["QUERY PLAN"][0]["Plan"])}
            assert not {str(n) for n in used if str(n).startswith("ix_work_items_list")}, used
    # Rows made ready since a cursor are found by the transaction that made them ready.
    assert "ix_work_items_ready_placed" in generic, generic
    assert "ix_work_items_leased_placed" in generic, generic
    for plan in (generic, custom, resumed):
        assert "ix_work_items_ready " in plan
        # Expired leases are a range of the leased index: no other index holds them in order.
        assert "using ix_work_items_leased on" in plan, plan
        # Neither the candidate scan nor the update of the picked rows may read the table.
        assert "Seq Scan on work_items" not in plan
        assert "Index Scan using pk_work_items on work_items w" in plan


def _warm_cursor(conn: psycopg.Connection[Any]) -> Cursor:
    """A cursor as a connection keeps it after its first acquire on tenant t's queue q: its
    lane at the first ready row, no lease expired before now, none active."""
    row = conn.execute(
        "SELECT pg_current_xact_id()::text AS xmin, now() AS now,"
        " (SELECT min(available_at) FROM work_items WHERE state = 'ready') AS at"
    ).fetchone()
    assert row is not None
    return Cursor(
        xmin=row["xmin"], lanes={(0, None): (row["at"], cursors.NO_ITEM)}, expired_from=row["now"]
    )


def _completed_history(conn: psycopg.Connection[Any], n: int) -> None:
    """`n` completed items of tenant t's queue q: history a scan from the left would walk."""
    conn.execute(
        "INSERT INTO work_items (tenant_id, queue, payload, state, fence, acquisition_count,"
        " max_acquisitions) SELECT 't', 'q', '{}', 'completed', 1, 1, 5"
        " FROM generate_series(1, %s)",
        (n,),
    )


def _plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes.extend(_plan_nodes(child))
    return nodes


def _explain_generic(
    conn: psycopg.Connection[dict[str, Any]], sql: str, params: dict[str, Any]
) -> list[dict[str, Any]]:
    """The nodes of the executed generic plan of a registered statement (named parameters)."""
    names: list[str] = []
    for name in re.findall(r"%\((\w+)\)s", sql):
        if name not in names:
            names.append(name)
    positional = re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m.group(1)) + 1}", sql)
    conn.execute("DEALLOCATE ALL")
    conn.execute(f"PREPARE page AS {positional}")
    args = ", ".join(pgsql.Literal(params[n]).as_string(conn) for n in names)
    call = f"page({args})" if names else "page"
    row = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {call}").fetchone()
    assert row is not None
    return _plan_nodes(row["QUERY PLAN"][0]["Plan"])


def test_item_pages_read_their_state_from_an_index_not_the_finished_history(
    database_url: str,
) -> None:
    """A page of ready items (of one queue or of all) reads a page's worth of index entries,
    however many completed items the tenant has: generic plans, as the API runs them."""
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as conn:
        conn.execute("INSERT INTO tenants VALUES ('t', 10, 5, '30 seconds', now(), now())")
        for queue in ("a", "b", "c"):
            conn.execute(
                "INSERT INTO work_items (tenant_id, queue, payload, state, fence,"
                " acquisition_count, max_acquisitions, created_at)"
                " SELECT 't', %s, jsonb_build_object('n', i), 'completed', 1, 1, 5,"
                "        now() - interval '1 day' + i * interval '1 ms'"
                " FROM generate_series(1, 20000) AS i",
                (queue,),
            )
            conn.execute(
                "INSERT INTO work_items (tenant_id, queue, payload, max_acquisitions, created_at)"
                " SELECT 't', %s, jsonb_build_object('n', i), 5, now() + i * interval '1 ms'"
                " FROM generate_series(1, 300) AS i",
                (queue,),
            )
        conn.execute("ANALYZE work_items")
        conn.execute("SET plan_cache_mode = force_generic_plan")
        base = {
            "tenant": "t",
            "created_after": "-infinity",
            "created_before": "infinity",
            "after_at": "-infinity",
            "after_id": reads.FIRST_ITEM,
            "payload": None,
            "limit": 21,
        }
        sql = reads._LIST_ITEMS["created"]
        ready = {"states": ["ready"], "leased": False}
        open_ = {"states": list(reads.OPEN), "leased": True}
        pages: dict[str, dict[str, Any]] = {
            "one queue": {**ready, "queue": "b"},
            "every queue": {**ready, "queue": None},
            "open, one queue": {**open_, "queue": "b"},
            "open, every queue": {**open_, "queue": None},
        }
        for name, params in pages.items():
            nodes = _explain_generic(conn, sql, {**base, **params})
            items = [n for n in nodes if n.get("Relation Name") == "work_items"]
            assert items, name
            assert not [n for n in items if n["Node Type"] == "Seq Scan"], name
            assert "ix_work_items_list" in {n.get("Index Name") for n in items}, name
            # A page's worth per (state, queue) branch, and one probe per queue: not 60,000.
            read = sum(
                n["Actual Rows"] * n["Actual Loops"] + n.get("Rows Removed by Filter", 0)
                for n in items
            )
            assert read <= 200, f"{name}: {read} rows read for a page of 21"


def test_batch_holder_operations_find_their_leases_by_key_in_a_generic_plan(
    database_url: str,
) -> None:
    """complete, heartbeat and release of a batch read each lease by its key, not the
    leased index: every lease not yet expired is in that range, and while an old snapshot
    is held, every lease that ended within a TTL too (the issue's complete_many went from
    1,100 to 6,300 buffers in a minute)."""
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as conn:
        conn.execute("INSERT INTO tenants VALUES ('t', 10, 5, '30 seconds', now(), now())")
        # As in a flowing queue: the statistics see few leases among much history, so the
        # leased index looks cheaper than sixteen probes by key.
        _completed_history(conn, 20000)
        conn.execute(
            "INSERT INTO work_items (tenant_id, queue, payload, state, fence, acquisition_count,"
            " max_acquisitions, lease_holder, lease_expires_at, lease_deadline_at)"
            " SELECT 't', 'q', '{}', 'leased', 1, 1, 5, 'other',"
            "        now() + interval '30 seconds', now() + interval '1 hour'"
            " FROM generate_series(1, 16)"
        )
        conn.execute("ANALYZE work_items")
        conn.execute("SET plan_cache_mode = force_generic_plan")
        ids = [
            str(r["item_id"])
            for r in conn.execute(
                "SELECT item_id FROM work_items WHERE state = 'leased'"
            ).fetchall()
        ]
        leases = json.dumps([{"item_id": i, "fence": 1, "result": None} for i in ids])
        params = {
            "tenant": "t",
            "ids": ids,
            "leases": leases,
            "items": leases,
            "worker": "other",
            "key_id": "k",
            "ttl": timedelta(seconds=30),
            "max_ttl": timedelta(seconds=30),
        }
        for name in ("complete_many", "heartbeat_many", "release_unsent"):
            conn.execute("BEGIN")
            nodes = _explain_generic(conn, transitions._SQL[name], params)
            conn.execute("ROLLBACK")
            scans = {
                n.get("Index Name")
                for n in nodes
                if n.get("Relation Name") == "work_items" and "Scan" in n["Node Type"]
            }
            assert scans == {"pk_work_items"}, (name, scans)
            updated = [n for n in nodes if n["Node Type"] == "ModifyTable"]
            assert updated, name
            assert updated[0]["Actual Rows"] == 16, name


def test_the_figures_of_a_scrape_read_no_finished_history(database_url: str) -> None:
    """Items by state at every scrape: the unfinished ones through their partial indexes
    (a queue's first read, with no cursor yet), finished ones from counters, however many
    completed rows there are."""
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as conn:
        conn.execute("INSERT INTO tenants VALUES ('t', 10, 5, '30 seconds', now(), now())")
        conn.execute(
            "INSERT INTO work_items (tenant_id, queue, payload, state, fence, acquisition_count,"
            " max_acquisitions) SELECT 't', 'q', '{}', 'completed', 1, 1, 5"
            " FROM generate_series(1, 30000)"
        )
        conn.execute(
            "INSERT INTO work_items (tenant_id, queue, payload, max_acquisitions)"
            " SELECT 't', 'q', '{}', 5 FROM generate_series(1, 200)"
        )
        conn.execute("ANALYZE work_items")
        conn.execute("SET plan_cache_mode = force_generic_plan")
        for sql, params in (
            (queue_store._SQL["open_figures"], {"tenant": "t", "queue": "q", **Cursor().params()}),
            (reads._SQL["state_counts"], {"tenant": "t"}),
        ):
            nodes = _explain_generic(conn, sql, params)
            items = [n for n in nodes if n.get("Relation Name") == "work_items"]
            assert not [n for n in items if n["Node Type"] == "Seq Scan"], sql
            read = sum(
                n["Actual Rows"] * n["Actual Loops"] + n.get("Rows Removed by Filter", 0)
                for n in items
            )
            assert read <= 200, f"{read} rows read to count 200 unfinished items"


def test_no_scan_of_ready_rows_but_the_item_list_reads_the_list_indexes(
    database_url: str,
) -> None:
    """The list indexes hold every ready row too, from the queue's first: under an old
    snapshot, every dead version since it. The cursor's lane scan and the queue figures
    read ready rows from the ready index; even with no ready index and no sequential scan
    to choose, their generic plans never take a list index (their predicate says
    `fence >= 0`, which only the item list's statements say)."""
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as conn:
        conn.execute("INSERT INTO tenants VALUES ('t', 10, 5, '30 seconds', now(), now())")
        conn.execute(
            "INSERT INTO work_items (tenant_id, queue, payload, max_acquisitions)"
            " SELECT 't', 'q', '{}', 5 FROM generate_series(1, 5000)"
        )
        conn.execute("ANALYZE work_items")
        conn.execute("SET plan_cache_mode = force_generic_plan")
        warm = _warm_cursor(conn)
        statements = {
            "advance_cursor": (cursors.ADVANCE, warm.params()),
            "open_figures": (queue_store._SQL["open_figures"], warm.params()),
            "state_counts": (reads._SQL["state_counts"], {}),
        }
        with conn.transaction(force_rollback=True):
            conn.execute("DROP INDEX ix_work_items_ready")
            conn.execute("SET enable_seqscan = off")
            for name, (sql, params) in statements.items():
                nodes = _explain_generic(conn, sql, {"tenant": "t", "queue": "q", **params})
                used = {str(n.get("Index Name")) for n in nodes}
                assert not {n for n in used if n.startswith("ix_work_items_list")}, (name, used)
        # The pages themselves still read them (test_item_pages_read_... above).


def test_rows_placed_since_a_cursor_are_read_from_their_index_whatever_other_queues_hold(
    database_url: str,
) -> None:
    """A backlog in other queues (here 100,000 ready items of another tenant) must not turn
    the scan of rows placed since the cursor (or since the watch's last look) into a read
    of the whole table: in a generic
    plan its range is `[since_xid, until_xid)`, both unknown, which the planner takes for a
    narrow one; with its lower bound alone it took a third of the ready rows, and chose a
    sequential scan (1.1 s a call on 3 million rows)."""
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as conn:
        for tenant in ("t", "other"):
            conn.execute(
                "INSERT INTO tenants VALUES (%s, 10, 5, '30 seconds', now(), now())", (tenant,)
            )
        conn.execute(
            "INSERT INTO work_items (tenant_id, queue, payload, max_acquisitions)"
            " SELECT 'other', 'q', '{}', 5 FROM generate_series(1, 100000)"
        )
        conn.execute(
            "INSERT INTO work_items (tenant_id, queue, payload, max_acquisitions)"
            " SELECT 't', 'q', '{}', 5 FROM generate_series(1, 2000)"
        )
        conn.execute("VACUUM ANALYZE work_items")
        conn.execute("SET plan_cache_mode = force_generic_plan")
        warm = _warm_cursor(conn)
        for name, sql in (
            ("advance_cursor", cursors.ADVANCE),
            ("open_figures", queue_store._SQL["open_figures"]),
            # The notifier's watch, from a look's snapshot (its xmax, and one in progress).
            ("placed_since", channels.PLACED_SINCE),
        ):
            params = {"tenant": "t", "queue": "q", "since": "5:9:7", **warm.params()}
            nodes = _explain_generic(conn, sql, params)
            items = [n for n in nodes if n.get("Relation Name") == "work_items"]
            assert not [n for n in items if "Seq Scan" in n["Node Type"]], name
            placed = [n for n in items if n.get("Index Name") == "ix_work_items_ready_placed"]
            assert placed, (name, {n.get("Index Name") for n in items})
            # What the planner expects the range to hold: a few rows, not a third of them
            # (the estimate behind the sequential scan on a bigger table).
            # (A probe by one transaction's id, the watch's, is not a range.)
            for node in placed:
                if ">=" in node.get("Index Cond", ""):
                    assert node["Plan Rows"] <= 1000, (name, node["Plan Rows"])


def test_the_watch_reads_the_placed_index_in_a_plan_made_on_an_empty_table(
    database_url: str,
) -> None:
    """A server prepares the watch's statement at its first look, often on an empty table,
    and keeps that plan. Made there, a plan that only filtered the range read the ready
    index whole: with a backlog in another tenant every look walked it (10 to 70 ms, and
    wake-ups 60 ms late). In the index's order, it reads ix_work_items_ready_placed."""
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute("PREPARE look(text) AS " + channels.PLACED_SINCE.replace("%(since)s", "$1"))
        since = conn.execute("SELECT pg_current_snapshot()::text AS s").fetchone()
        assert since is not None
        [first] = conn.execute("EXECUTE look(NULL)").fetchall()  # the plan made, and kept
        assert (first["tenants"], first["more"]) == ([], False)
        conn.execute("INSERT INTO tenants VALUES ('t', 10, 5, '30 seconds', now(), now())")
        conn.execute(
            "INSERT INTO work_items (tenant_id, queue, payload, max_acquisitions)"
            " SELECT 't', 'q', '{}', 5 FROM generate_series(1, 20000)"
        )
        call = f"look({pgsql.Literal(since['s']).as_string(conn)})"
        row = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {call}").fetchone()
        assert row is not None
        items = [
            n
            for n in _plan_nodes(row["QUERY PLAN"][0]["Plan"])
            if n.get("Relation Name") == "work_items"
        ]
        assert {n.get("Index Name") for n in items} == {"ix_work_items_ready_placed"}
        # At most a thousand rows a look; past them every waiter looks.
        assert max(n["Actual Rows"] for n in items) <= 1000
        [seen] = conn.execute(f"EXECUTE {call}").fetchall()
        assert seen["more"] is True


# The outbox's item as the transitions wrote it out before item_json (0012): the function
# must give the same JSON, byte for byte, for every state and every null.
_ITEM_BEFORE_0012 = """jsonb_build_object(
    'item_id', s.item_id::text, 'tenant', s.tenant_id, 'queue', s.queue,
    'state', s.state::text, 'payload', s.payload, 'priority', s.priority,
    'available_at', to_char(s.available_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
    'fence', s.fence,
    'acquisition_count', s.acquisition_count, 'max_acquisitions', s.max_acquisitions,
    'lease_holder', s.lease_holder,
    'lease_expires_at', to_char(s.lease_expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
    'lease_deadline_at', CASE WHEN s.state = 'leased'
        THEN to_char(s.lease_deadline_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"') END,
    'result', s.result, 'last_failure', s.last_failure,
    'created_at', to_char(s.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
    'updated_at', to_char(s.updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))"""


def test_item_json_is_the_item_the_outbox_wrote_before_it(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as conn:
        # Whatever the session's time zone: the item's times are UTC.
        conn.execute("SET TIME ZONE 'America/St_Johns'")
        conn.execute("INSERT INTO tenants VALUES ('t', 10, 5, '30 seconds', now(), now())")
        conn.execute(
            "INSERT INTO work_items (tenant_id, queue, payload, max_acquisitions, available_at)"
            " VALUES ('t', 'q', '{\"a\": [1, \"é\"]}', 5, '2026-12-01 13:58:08.000001+00'),"
            " ('t', 'q', 'null', 3, '2026-01-01 00:00:00+05')"
        )
        conn.execute(
            "INSERT INTO work_items (tenant_id, queue, payload, state, fence, acquisition_count,"
            " max_acquisitions, lease_holder, lease_expires_at, lease_deadline_at, leased_at)"
            " VALUES ('t', 'q', '1', 'leased', 2, 1, 5, 'w', now() + interval '30 s',"
            " now() + interval '900 s', now())"
        )
        conn.execute(
            "INSERT INTO work_items (tenant_id, queue, payload, state, fence, acquisition_count,"
            " max_acquisitions, result, last_failure, lease_deadline_at)"
            " VALUES ('t', 'q', '{}', 'completed', 1, 1, 5, '{\"ok\": true}', '{\"e\": 1}',"
            " now() - interval '1 day')"
        )
        rows = conn.execute(
            f"SELECT (item_json(s) - 'unique_key' - 'ordering_key' - 'partition_key')::text"
            f" AS now, ({_ITEM_BEFORE_0012})::text AS before,"
            " item_json(s) ?& array['unique_key', 'ordering_key', 'partition_key'] AS has_key,"
            " coalesce(item_json(s)->>'unique_key', item_json(s)->>'ordering_key',"
            " item_json(s)->>'partition_key') AS key"
            " FROM work_items s ORDER BY s.state, s.created_at"
        ).fetchall()
        stamp = conn.execute("SELECT api_timestamp('2026-12-01 13:58:08+00') AS t").fetchone()
    assert len(rows) == 4
    for row in rows:
        assert row["now"] == row["before"]
        # Since 0030 the item also shows its unique key, since 0031 its ordering key, since
        # 0032 its partition key (none here).
        assert (row["has_key"], row["key"]) == (True, None)
    assert stamp == {"t": "2026-12-01T13:58:08.000000Z"}


def test_item_json_is_inlined_into_the_transitions_that_write_the_outbox(
    database_url: str,
) -> None:
    """The plan is the one of the expression written out: the planner inlines both
    functions, so a transition calls neither per row."""
    params: dict[str, dict[str, Any]] = {
        "complete": {
            "tenant": "t",
            "item_id": "00000000-0000-0000-0000-000000000000",
            "worker": "w",
            "key_id": "0123456789abcdef",
            "fence": 1,
            "shard": 0,
            "result": None,
        },
        "cancel": {
            "tenant": "t",
            "item_ids": ["00000000-0000-0000-0000-000000000000"],
            "state": None,
            "reason": "r",
            "actor": "a",
            "shard": 0,
        },
    }
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as conn:
        for name, values in params.items():
            plan = "\n".join(
                row["QUERY PLAN"]
                for row in conn.execute(
                    "EXPLAIN (VERBOSE) " + transitions._SQL[name], values
                ).fetchall()
            )
            assert "jsonb_build_object('item_id'" in plan, name
            assert "to_char(" in plan, name
            assert "item_json" not in plan, name
            assert "api_timestamp" not in plan, name


def test_the_heads_read_from_the_revision_files_are_alembics(tmp_path: Path) -> None:
    """The server reads its head revisions without alembic; alembic's graph is the truth,
    here and in a tree that a merge revision joins and a second branch leaves open."""
    assert migrate.head_revisions() == set(_alembic_heads(migrate.MIGRATIONS_DIR))
    assert migrate.head_revisions()  # at least the last revision

    tree = tmp_path / "migrations"
    shutil.copytree(migrate.MIGRATIONS_DIR, tree, ignore=shutil.ignore_patterns("__pycache__"))
    versions = tree / "versions"
    (head,) = migrate.head_revisions()
    for name, down in (("b1", head), ("b2", head), ("m1", ("b1", "b2")), ("x1", head)):
        (versions / f"9_{name}.py").write_text(
            f"revision: str = {name!r}\ndown_revision: object = {down!r}\n"
            "def upgrade() -> None: ...\ndef downgrade() -> None: ...\n"
        )
    expected = set(_alembic_heads(tree))
    assert expected == {"m1", "x1"}
    assert migrate.heads_of(versions) == expected


def _alembic_heads(tree: Path) -> list[str]:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(tree))
    return list(ScriptDirectory.from_config(config).get_heads())


def test_a_server_process_imports_neither_alembic_nor_sqlalchemy() -> None:
    """About 30 MB in every server process: only migrating needs them."""
    code = (
        "import sys, queue_server.app, queue_server.infra.serve;"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'alembic', 'sqlalchemy'}))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == "[]"


def test_a_cursor_with_no_active_lease_probes_no_index_whole_in_a_custom_plan(
    database_url: str,
) -> None:
    """With no active lease, `item_id = ANY('{}')` would be a contradiction, and a custom
    plan (the sweeper's) may then read any partial index whole: the index of leases placed
    since a snapshot did, 87,000 buffers 15 minutes into a held snapshot. The cursor sends
    an id that is no item's instead."""
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as conn:
        conn.execute("INSERT INTO tenants VALUES ('t', 10, 5, '30 seconds', now(), now())")
        _completed_history(conn, 20000)
        conn.execute(
            "INSERT INTO work_items (tenant_id, queue, payload, max_acquisitions)"
            " SELECT 't', 'q', '{}', 5 FROM generate_series(1, 50)"
        )
        conn.execute("ANALYZE work_items")
        conn.execute("SET plan_cache_mode = force_custom_plan")
        cursor = _warm_cursor(conn)
        for sql in (cursors.ADVANCE, queue_store._SQL["open_figures"]):
            nodes = _explain_generic(conn, sql, {"tenant": "t", "queue": "q", **cursor.params()})
            probes = [n for n in nodes if "item_id = ANY" in n.get("Index Cond", "")]
            assert probes, sql[:80]
            assert {n["Index Name"] for n in probes} == {"pk_work_items"}
