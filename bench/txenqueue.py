"""Enqueue inside an application's own transaction (`queue_server.enqueue`), against a bare
INSERT into the application's own table in the same run.

One load-generator process with `connections` connections (a thread each), each running one
transaction after another, each committed: an `orders` row per item, and with `enqueue` the
item too (1 per commit: one
`queue_server.enqueue`; 100 per commit: one `queue_server.enqueue_many` of 100 beside 100
order rows). The bare INSERT writes the same order rows and nothing else.
"""

from __future__ import annotations

import resource
import threading
import time
import uuid
from dataclasses import dataclass, field

import psycopg
from psycopg.types.json import Jsonb

# The application's own table, beside the queue's in the same database.
ORDERS = """
CREATE TABLE IF NOT EXISTS bench_orders (
    order_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer text NOT NULL,
    total numeric NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
)
"""
INSERT_ORDER = "INSERT INTO bench_orders (customer, total) VALUES (%s, %s) RETURNING order_id"
INSERT_ORDERS = (
    "INSERT INTO bench_orders (customer, total)"
    " SELECT 'c' || g, g FROM generate_series(1, %s) AS g RETURNING order_id"
)
ENQUEUE = "SELECT queue_server.enqueue(%s, %s, %s, %s)"
ENQUEUE_MANY = "SELECT queue_server.enqueue_many(%s, %s, %s, %s)"


@dataclass(frozen=True)
class TxSpec:
    url: str
    tenant: str
    queue: str
    per_commit: int
    enqueue: bool
    start_at: float
    end_at: float
    # Concurrent application connections, as an application's request handlers are.
    connections: int = 1


@dataclass
class TxResult:
    items: int = 0
    commits: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    finished_at: float = 0.0
    cpu: float = 0.0


def prepare(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(ORDERS)


def run(spec: TxSpec) -> TxResult:
    """Transactions on `spec.connections` connections until `end_at`; the items they
    committed, summed."""
    before = resource.getrusage(resource.RUSAGE_SELF)
    results = [TxResult() for _ in range(spec.connections)]
    threads = [threading.Thread(target=_connection, args=(spec, result)) for result in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    after = resource.getrusage(resource.RUSAGE_SELF)
    total = TxResult(
        items=sum(r.items for r in results),
        commits=sum(r.commits for r in results),
        errors=sum(r.errors for r in results),
        error_samples=[s for r in results for s in r.error_samples][:5],
        finished_at=max(r.finished_at for r in results),
    )
    total.cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return total


def _connection(spec: TxSpec, result: TxResult) -> None:
    """One connection's transactions until `end_at`, counted into `result`."""
    prefix = uuid.uuid4().hex[:8]
    with psycopg.connect(spec.url, prepare_threshold=0) as conn:
        while time.time() < spec.start_at:
            time.sleep(0.001)
        while time.time() < spec.end_at:
            try:
                with conn.transaction():
                    if spec.per_commit == 1:
                        row = conn.execute(INSERT_ORDER, ("c", 1)).fetchone()
                        assert row is not None
                        if spec.enqueue:
                            key = f"{prefix}-{row[0]}"
                            conn.execute(
                                ENQUEUE, (spec.tenant, spec.queue, Jsonb({"order": row[0]}), key)
                            )
                    else:
                        rows = conn.execute(INSERT_ORDERS, (spec.per_commit,)).fetchall()
                        if spec.enqueue:
                            items = [{"payload": {"order": r[0]}} for r in rows]
                            key = f"{prefix}-{rows[0][0]}"
                            conn.execute(ENQUEUE_MANY, (spec.tenant, spec.queue, Jsonb(items), key))
                result.items += spec.per_commit
                result.commits += 1
            except psycopg.Error as exc:
                result.errors += 1
                if len(result.error_samples) < 5:
                    result.error_samples.append(str(exc)[:300])
    result.finished_at = time.time()
