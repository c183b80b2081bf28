"""The held-snapshot phase's load and its reading of the database.

A steady flow on one queue: the SDK `Worker` (threads, 16 slots, a no-op handler)
drains it while a producer keeps about READY_TARGET items ready with batch
enqueues. Meanwhile the orchestrator opens a second session that runs `BEGIN
ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM work_items;` and holds it, as
a pg_dump, a report or a forgotten `BEGIN` does. Each load generator counts per
window of the phase; the orchestrator samples the hot tables at every window's end.

Acquire latency is the SDK worker's own: each acquire round trip (request sent to
answer read, in the worker's process) timed around the client's send, with the
worker's usual long poll (wait=1). Only acquires that carried leases count: one
answered empty may have waited out its long poll. pg_stat_statements is not
loaded in the embedded PostgreSQL, so the server's side is not split out.
"""

from __future__ import annotations

import asyncio
import resource
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
import psycopg
import uvloop

from bench.http import HttpConnection, KeyMaker
from queue_server.client import Job, Outcome, QueueClient, Result, Worker

# The tables every lease cycle, enqueue or figure touches (issue 40's list).
HOT_TABLES = (
    "work_items",
    "counter_deltas",
    "counter_bases",
    "tenants",
    "item_events",
    "outbox_deliveries",
)
READY_TARGET = 4000
ENQUEUE_BATCH = 500
SLOTS = 16
HOLDER_APP = "bench-held-snapshot"
ACQUIRE_MEASURE = (
    "the SDK worker's acquire round trips (request sent to answer read, timed in the"
    " worker's process around the client's send); only acquires that carried leases"
    " (an empty answer may have waited out its 1 s long poll); pg_stat_statements is"
    " not loaded in the embedded PostgreSQL"
)

# Each hot table with its partitions, if it is partitioned: live and dead tuples, bytes.
TABLES_SQL = """
SELECT t.name,
       to_regclass(t.name) IS NOT NULL AS present,
       coalesce(sum(s.n_live_tup), 0)::bigint AS live,
       coalesce(sum(s.n_dead_tup), 0)::bigint AS dead,
       coalesce(sum(pg_total_relation_size(p.relid)), 0)::bigint AS bytes
FROM unnest(%(tables)s::text[]) AS t(name)
LEFT JOIN LATERAL (
    SELECT to_regclass(t.name) AS relid
    UNION
    SELECT relid FROM pg_partition_tree(to_regclass(t.name))
) AS p ON true
LEFT JOIN pg_stat_user_tables AS s ON s.relid = p.relid
GROUP BY t.name
"""

# Tables outside the list (partitions aside) with the most dead tuples: a new design's hot tables.
OTHERS_SQL = """
SELECT s.relname, s.n_live_tup, s.n_dead_tup, pg_total_relation_size(s.relid)
FROM pg_stat_user_tables AS s JOIN pg_class AS c ON c.oid = s.relid
WHERE NOT s.relname = ANY(%(tables)s::text[]) AND NOT c.relispartition AND s.n_dead_tup > 0
ORDER BY n_dead_tup DESC
LIMIT 5
"""

# The holding session, as pg_stat_activity sees it: is its snapshot still the horizon?
HOLDER_SQL = """
SELECT state, age(backend_xmin) AS xmin_age,
       extract(epoch FROM now() - xact_start)::float8 AS open_s
FROM pg_stat_activity WHERE pid = %(pid)s
"""


@dataclass(frozen=True)
class FlowSpec:
    host: str
    port: int
    key: str
    tenant: str
    queue: str
    start_at: float  # the load starts
    origin: float  # window 0 starts (after a warm-up)
    end_at: float
    window: float
    slots: int = SLOTS
    ready_target: int = READY_TARGET
    batch: int = ENQUEUE_BATCH

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def index(self, at: float) -> int:
        """The window of wall-clock instant `at` (-1 during the warm-up)."""
        return -1 if at < self.origin else int((at - self.origin) // self.window)


@dataclass
class FlowResult:
    """Per window: items (completed by the worker, enqueued by the producer), acquire
    latencies of acquires that carried leases, acquires answered empty, and the fewest
    ready items the producer saw (-1: no reading)."""

    items: list[int] = field(default_factory=list)
    acquire_s: list[list[float]] = field(default_factory=list)
    empty: list[int] = field(default_factory=list)
    low_ready: list[int] = field(default_factory=list)
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)
    cpu: float = 0.0

    def _grow(self, i: int) -> None:
        while len(self.items) <= i:
            self.items.append(0)
            self.acquire_s.append([])
            self.empty.append(0)
            self.low_ready.append(-1)

    def count(self, i: int, n: int = 1) -> None:
        if i >= 0:
            self._grow(i)
            self.items[i] += n

    def acquired(self, i: int, seconds: float, leases: bool) -> None:
        if i >= 0:
            self._grow(i)
            if leases:
                self.acquire_s[i].append(seconds)
            else:
                self.empty[i] += 1

    def ready(self, i: int, ready: int) -> None:
        if i >= 0:
            self._grow(i)
            low = self.low_ready[i]
            self.low_ready[i] = ready if low < 0 else min(low, ready)

    def error(self, what: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(what[:300])


def _cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_flow_worker(spec: FlowSpec) -> FlowResult:
    """The SDK Worker (threads) on the queue from `start_at` to `end_at`, timing its acquires."""
    result = FlowResult()
    lock = threading.Lock()
    time.sleep(max(0.0, spec.start_at - time.time()))
    cpu0 = _cpu_self()

    def noop(job: Job) -> None:
        return None

    def on_result(r: Result) -> None:
        with lock:
            if r.outcome is Outcome.COMPLETED:
                result.count(spec.index(time.time()))
            else:
                result.error(f"{r.outcome}: {r.detail}")

    try:
        with QueueClient(spec.base_url, spec.key) as qs:
            send = qs._send

            def timed(call: Any) -> Any:
                if call.method != "POST" or not call.path.endswith("/leases"):
                    return send(call)
                began = time.perf_counter()
                response = send(call)
                took = time.perf_counter() - began
                with lock:
                    result.acquired(spec.index(time.time()), took, b'"item_id"' in response.content)
                return response

            # The worker drives every request through the client's send: the acquires are timed
            # exactly as the worker makes them, with nothing else in the measured span.
            qs._send = timed  # type: ignore[method-assign]
            worker = Worker(
                qs, spec.queue, noop, concurrency=spec.slots, wait=1.0, on_result=on_result
            )
            timer = threading.Timer(max(0.0, spec.end_at - time.time()), worker.stop)
            timer.start()
            try:
                worker.run(handle_signals=False)
            finally:
                timer.cancel()
    except Exception as exc:
        result.error(f"{type(exc).__name__}: {exc}")
    result.cpu = _cpu_self() - cpu0
    return result


async def _produce(spec: FlowSpec, result: FlowResult) -> None:
    """Read the queue's ready count; top it up to `ready_target` in batches; repeat."""
    conn = HttpConnection(spec.host, spec.port, spec.key)
    keys = KeyMaker()
    queue_path = f"/v1/tenants/{spec.tenant}/queues/{spec.queue}"
    batch_path = f"{queue_path}/items:batch"
    body = {"items": [{"payload": {"n": i}} for i in range(spec.batch)]}
    try:
        while time.time() < spec.end_at:
            status, content = await conn.request("GET", queue_path)
            if status != 200:
                result.error(f"GET queue {status}: {content[:200]!r}")
                await asyncio.sleep(0.2)
                continue
            ready = int(orjson.loads(content)["ready"])
            result.ready(spec.index(time.time()), ready)
            batches = (spec.ready_target - ready) // spec.batch
            if batches <= 0:
                await asyncio.sleep(0.05)
                continue
            for _ in range(batches):
                status, content = await conn.request(
                    "POST", batch_path, body, idempotency_key=keys()
                )
                if status != 201:
                    result.error(f"enqueue batch {status}: {content[:200]!r}")
                    await asyncio.sleep(0.05)
                    break
                result.count(spec.index(time.time()), spec.batch)
    finally:
        await conn.close()


def run_producer(spec: FlowSpec) -> FlowResult:
    """Batch enqueues keeping about `ready_target` items ready, from `start_at` to `end_at`."""
    result = FlowResult()
    time.sleep(max(0.0, spec.start_at - time.time()))
    cpu0 = _cpu_self()
    try:
        uvloop.run(_produce(spec, result))
    except Exception as exc:
        result.error(f"{type(exc).__name__}: {exc}")
    result.cpu = _cpu_self() - cpu0
    return result


# -- the database side -----------------------------------------------------------


class Holder:
    """The second session: a REPEATABLE READ snapshot taken by a count over work_items."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True, application_name=HOLDER_APP)
        # A cluster-wide timeout must not end the hold early: it is the point of the phase.
        self.conn.execute("SET idle_in_transaction_session_timeout = 0")
        self.pid = int(self.conn.info.backend_pid)
        self.conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        row = self.conn.execute("SELECT count(*) FROM work_items").fetchone()
        self.counted = int(row[0]) if row else 0

    def release(self) -> None:
        try:
            self.conn.execute("ROLLBACK")
        finally:
            self.conn.close()


def sample(url: str, holder_pid: int | None) -> dict[str, Any]:
    """The hot tables' live and dead tuples and sizes, and the holder's snapshot age."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(TABLES_SQL, {"tables": list(HOT_TABLES)}).fetchall()
        holder = (
            conn.execute(HOLDER_SQL, {"pid": holder_pid}).fetchone()
            if holder_pid is not None
            else None
        )
    tables = {
        str(name): {"live": int(live), "dead": int(dead), "mb": round(int(size) / 2**20, 1)}
        for name, present, live, dead, size in rows
        if present
    }
    out: dict[str, Any] = {"tables": {t: tables[t] for t in HOT_TABLES if t in tables}}
    if holder_pid is not None:
        out["holder"] = (
            {"state": holder[0], "xmin_age_xids": holder[1], "open_s": round(holder[2], 1)}
            if holder
            else {"state": "gone"}
        )
    return out


def others(url: str) -> list[dict[str, Any]]:
    """The other tables with the most dead tuples."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(OTHERS_SQL, {"tables": list(HOT_TABLES)}).fetchall()
    return [{"table": r[0], "live": r[1], "dead": r[2], "mb": round(r[3] / 2**20, 1)} for r in rows]


def tail_seconds(hold: float) -> float:
    """The end of the hold compared with the baseline: the last 10 minutes of a hold of
    half an hour or more, else the last 30 s (at most half the hold)."""
    return min(600.0 if hold >= 1800 else 30.0, hold / 2)


def describe(seconds: float) -> str:
    """`30 s`, `2 min`, `60 min`."""
    return f"{seconds / 60:g} min" if seconds >= 120 and seconds % 60 == 0 else f"{seconds:g} s"
