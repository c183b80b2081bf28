"""A page of items in any of the six orders is an index range read per (state, queue),
from the cursor on: its cost does not grow with the tenant's finished history, and no
plan sorts the tenant's items. Generic plans, as the API runs them."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.rows import dict_row

from queue_server.store import reads

INDEX = {
    "created": "ix_work_items_list",
    "priority": "ix_work_items_list_priority",
    "attempts": "ix_work_items_list_attempts",
}


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes.extend(_nodes(child))
    return nodes


def _explain(conn: psycopg.Connection[dict[str, Any]], text: str, params: dict[str, Any]) -> Any:
    names: list[str] = []
    for name in re.findall(r"%\((\w+)\)s", text):
        if name not in names:
            names.append(name)
    positional = re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m.group(1)) + 1}", text)
    # Never prepared by psycopg itself: DEALLOCATE ALL would drop its statements.
    conn.execute("DEALLOCATE ALL", prepare=False)
    conn.execute(f"PREPARE page AS {positional}", prepare=False)
    args = ", ".join(pgsql.Literal(params[n]).as_string(conn) for n in names)
    call = f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE page({args})"
    row = conn.execute(call, prepare=False).fetchone()
    assert row is not None
    return row["QUERY PLAN"][0]["Plan"]


@pytest.fixture
def history(database_url: str) -> Any:
    """Three queues of 8,000 completed items each and 200 ready ones, of mixed priority
    and attempts."""
    with psycopg.connect(database_url, autocommit=True, row_factory=dict_row) as conn:
        conn.execute("INSERT INTO tenants VALUES ('t', 10, 5, '30 seconds', now(), now())")
        for queue in ("a", "b", "c"):
            conn.execute(
                "INSERT INTO work_items (tenant_id, queue, payload, state, fence, priority,"
                " acquisition_count, max_acquisitions, created_at)"
                " SELECT 't', %s, jsonb_build_object('n', i), 'completed', 1, i %% 9 - 4,"
                "        1 + i %% 4, 5, timestamptz '2026-01-01Z' - interval '1 day' + i * interval '1 ms'"
                " FROM generate_series(1, 8000) AS i",
                (queue,),
            )
            conn.execute(
                "INSERT INTO work_items (tenant_id, queue, payload, priority, acquisition_count,"
                " max_acquisitions, created_at)"
                " SELECT 't', %s, jsonb_build_object('n', i), i %% 9 - 4, i %% 4, 5,"
                "        timestamptz '2026-01-01Z' + i * interval '1 ms'"
                " FROM generate_series(1, 200) AS i",
                (queue,),
            )
        conn.execute("ANALYZE work_items")
        conn.execute("SET plan_cache_mode = force_generic_plan")
        yield conn


def test_every_order_reads_a_pages_worth_of_its_index(history: Any) -> None:
    conn = history
    base = {
        "tenant": "t",
        "created_after": "-infinity",
        "created_before": "infinity",
        "payload": None,
        "limit": 21,
    }
    pages: dict[str, dict[str, Any]] = {
        "ready, one queue": {"states": ["ready"], "leased": False, "queue": "b"},
        "ready, every queue": {"states": ["ready"], "leased": False, "queue": None},
        "open, every queue": {"states": list(reads.OPEN), "leased": True, "queue": None},
        "every state, one queue": {"states": list(reads.LISTED), "leased": True, "queue": "a"},
    }
    middle = "2026-01-01T00:00:00.100Z"  # the hundredth ready item of each queue
    for sort in reads.SORTS:
        descending = sort.startswith("-")
        start = reads._START[descending]
        # From the start, and from a cursor in the middle of the ready items.
        positions = [start, (0, middle, "80000000-0000-0000-0000-000000000000")]
        for name, params in pages.items():
            for key, at, item_id in positions:
                after = {"after_key": key, "after_at": at, "after_id": item_id}
                plan = _explain(conn, reads._LIST_ITEMS[sort], {**base, **params, **after})
                nodes = _nodes(plan)
                scans = [n for n in nodes if n.get("Relation Name") == "work_items"]
                label = f"{sort}, {name}"
                assert not [n for n in scans if n["Node Type"] == "Seq Scan"], label
                assert INDEX[sort.lstrip("-")] in {n.get("Index Name") for n in scans}, label
                read = sum(
                    n["Actual Rows"] * n["Actual Loops"] + n.get("Rows Removed by Filter", 0)
                    for n in scans
                )
                # A page's worth per (state, queue) branch and a probe per pair: not 24,600.
                assert read <= 250, f"{label}: {read} rows read for a page of 21"
                # What is sorted is at most a page per branch, never the state's items.
                for node in nodes:
                    if node["Node Type"] == "Sort":
                        assert node["Actual Rows"] <= 21 * 8, f"{label}: sorts {node}"
                assert plan["Actual Rows"] == 21, (label, after)


def test_a_selection_is_read_by_primary_key(history: Any) -> None:
    conn = history
    ids = [
        r["item_id"]
        for r in conn.execute(
            "SELECT item_id::text FROM work_items WHERE state = 'ready' LIMIT 30", prepare=False
        ).fetchall()
    ]
    params = {
        "tenant": "t",
        "item_ids": ids,
        "state": "ready",
        "queue": None,
        "created_after": "-infinity",
        "created_before": "infinity",
        "after_at": "-infinity",
        "after_id": reads.FIRST_ITEM,
        "payload": None,
        "limit": 101,
    }
    plan = _explain(conn, reads._SQL["items_with_ids"], params)
    scans = [n for n in _nodes(plan) if n.get("Relation Name") == "work_items"]
    assert {n.get("Index Name") for n in scans} == {"pk_work_items"}
    assert sum(n["Actual Rows"] * n["Actual Loops"] for n in scans) == 30
    assert plan["Actual Rows"] == 30
