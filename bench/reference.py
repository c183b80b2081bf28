"""The hardware reference: pgbench running a raw-SQL lease cycle on the same PostgreSQL.

One cycle is two transactions, as in the server: acquire one ready row with
SKIP LOCKED through a partial index in acquire order, raising its fence; then
complete it guarded by state, holder, fence and lease expiry.
"""

from __future__ import annotations

import os
import re
import resource
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psycopg

from queue_server.infra.embedded import EmbeddedPostgres

DATABASE = "pgbench_ref"

SCHEMA = """
CREATE TABLE lease_items (
    id bigserial PRIMARY KEY,
    queue text NOT NULL DEFAULT 'q',
    priority int NOT NULL DEFAULT 0,
    state text NOT NULL DEFAULT 'ready',
    available_at timestamptz NOT NULL DEFAULT now(),
    fence bigint NOT NULL DEFAULT 0,
    lease_holder text,
    lease_expires_at timestamptz,
    payload jsonb NOT NULL DEFAULT '{}',
    result jsonb
);
CREATE INDEX lease_items_ready ON lease_items (queue, priority DESC, available_at, id)
    WHERE state = 'ready';
ALTER TABLE lease_items SET (autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 0);
"""

SCRIPT = r"""
UPDATE lease_items SET state = 'leased', fence = fence + 1,
    lease_holder = 'w' || :client_id, lease_expires_at = now() + interval '60 seconds'
WHERE id = (SELECT id FROM lease_items
            WHERE queue = 'q' AND state = 'ready' AND available_at <= now()
            ORDER BY priority DESC, available_at, id
            LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id, fence \gset
UPDATE lease_items SET state = 'completed', result = '{"ok": true}',
    lease_holder = NULL, lease_expires_at = NULL
WHERE id = :id AND state = 'leased' AND fence = :fence
  AND lease_holder = 'w' || :client_id AND lease_expires_at > now();
"""


@dataclass
class PgbenchResult:
    clients: int
    cycles_per_s: float
    transactions: int
    failed: int
    cpu: float


def prepare(pg: EmbeddedPostgres) -> None:
    with psycopg.connect(pg.url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {DATABASE}")
    with psycopg.connect(pg.url(DATABASE), autocommit=True) as conn:
        conn.execute(SCHEMA)


def refill(pg: EmbeddedPostgres, rows: int) -> None:
    """A fresh table of `rows` ready rows (no history), analysed."""
    with psycopg.connect(pg.url(DATABASE), autocommit=True) as conn:
        conn.execute("TRUNCATE lease_items")
        conn.execute(
            "INSERT INTO lease_items (payload) SELECT jsonb_build_object('n', g)"
            " FROM generate_series(1, %s) AS g",
            (rows,),
        )
        conn.execute("VACUUM ANALYZE lease_items")


def run(pg: EmbeddedPostgres, *, clients: int, seconds: int, workdir: Path) -> PgbenchResult:
    script = workdir / "lease_cycle.sql"
    script.write_text(SCRIPT)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    completed = subprocess.run(
        [
            str(pg.bin_dir / "pgbench"),
            "-h",
            str(pg.socket_dir),
            "-p",
            str(pg.port),
            "-U",
            "postgres",
            "-n",
            "-M",
            "prepared",
            "-c",
            str(clients),
            "-j",
            str(min(clients, 2)),
            "-T",
            str(seconds),
            "-f",
            str(script),
            DATABASE,
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=seconds + 60,
        env={**os.environ, "PGPASSFILE": str(pg.password_file)},
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    output = completed.stdout + completed.stderr
    tps = re.search(r"tps = ([0-9.]+) \(without initial connection time\)", output)
    if completed.returncode != 0 or tps is None:
        raise RuntimeError(f"pgbench failed ({completed.returncode}):\n{output[-2000:]}")
    processed = re.search(r"number of transactions actually processed: (\d+)", output)
    failed = re.search(r"number of failed transactions: (\d+)", output)
    return PgbenchResult(
        clients=clients,
        cycles_per_s=float(tps.group(1)),
        transactions=int(processed.group(1)) if processed else 0,
        failed=int(failed.group(1)) if failed else 0,
        cpu=(after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
    )
