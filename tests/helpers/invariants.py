"""Invariants the races and the operators check at the end: counters and ledgers agree with rows."""

from __future__ import annotations

import psycopg

from queue_server.services.ledgers import mismatches

Db = psycopg.Connection[dict[str, object]]


def assert_ledgers_fold_to_rows(db: Db) -> None:
    rows = db.execute("SELECT * FROM work_items").fetchall()
    for row in rows:
        events = db.execute(
            "SELECT seq, kind, fence, actor, data FROM item_events"
            " WHERE tenant_id = %s AND item_id = %s ORDER BY seq",
            (row["tenant_id"], row["item_id"]),
        ).fetchall()
        for event in events:
            event["data"] = event["data"]
        assert mismatches(dict(row), [dict(e) for e in events]) == [], row["item_id"]


def assert_backlog_counter_matches(db: Db) -> None:
    """The admission counters agree with the rows: admitted - released = ready + leased."""
    rows = db.execute(
        "SELECT t.tenant_id,"
        " (SELECT coalesce(sum(admitted - released), 0) FROM counter_totals c"
        "  WHERE c.tenant_id = t.tenant_id) AS counted,"
        " (SELECT count(*) FROM work_items w WHERE w.tenant_id = t.tenant_id"
        "  AND w.state IN ('ready', 'leased')) AS actual FROM tenants t"
    ).fetchall()
    for row in rows:
        assert row["counted"] == row["actual"], row
    # And per admission shard: each release gave its room back to the shard that admitted
    # the item (migration 0028).
    shards = db.execute(
        "SELECT coalesce(b.tenant_id, w.tenant_id) AS tenant_id,"
        " coalesce(b.shard, w.shard) AS shard, coalesce(b.backlog, 0) AS counted,"
        " coalesce(w.n, 0) AS actual"
        " FROM admission_backlogs b FULL JOIN"
        " (SELECT tenant_id, admission_shard AS shard, count(*) AS n FROM work_items"
        "  WHERE state IN ('ready', 'leased') GROUP BY tenant_id, admission_shard) w"
        " ON w.tenant_id = b.tenant_id AND w.shard = b.shard"
    ).fetchall()
    for row in shards:
        assert row["counted"] == row["actual"], row
