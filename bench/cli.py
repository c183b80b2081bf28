"""`python -m bench`: one run of every scenario, then bench/results/latest.{json,md}."""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import time
import uuid
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from multiprocessing import get_context
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psycopg

from bench import loadgen, peer, profile, reference, report, snapshot, txenqueue
from bench import workers as user_workers
from bench.env import (
    HOST,
    ORDERED_PREFILL,
    PREFILL,
    RETENTION_INTERVAL,
    WAITING_PREFILL,
    Environment,
    environment,
    venv_bin,
)
from bench.progress import say
from bench.stats import CpuSplit, Figure, PhaseLoad, percentile

RESULTS = Path(__file__).parent / "results"
CONCURRENCY = (1, 4, 16)
QUICK_CONCURRENCY = (1, 16)
BATCH = 50
ENQUEUE_BATCH = 500
HOUR_EQUIVALENT_ITEMS = 100 * 3600  # an hour of the wake-up scenario's steady 100 items/s
START_MARGIN = 0.3
# The two modes of the server: `--workers 1`, and `serve`'s own default (one process per core).
SINGLE, DEFAULT = "w1", "default"

T = TypeVar("T")


@dataclass
class Plan:
    """Durations and sizes of one run; `--quick` shrinks them."""

    reps: int
    pgbench_s: int
    cycle_s: float
    enqueue_s: float
    wake_s: float
    peer_s: float
    profile_s: int
    history: tuple[int, ...]
    cost_s: float
    churn_s: float
    churn_window: float
    churn_items: int
    worker_s: float
    worker_reps: int
    concurrency: tuple[int, ...] = CONCURRENCY
    managers: tuple[int, ...] = (1, 5)
    procrastinate: bool = False
    # The held-snapshot phase: warm-up, baseline, the hold, and the window of its figures.
    snap_warm_s: float = 3.0
    snap_baseline_s: float = 30.0
    snap_hold_s: float = 120.0
    snap_window_s: float = 10.0


def make_plan(args: argparse.Namespace) -> Plan:
    big = os.environ.get("BENCH_SCALE", "") == "big"
    if args.quick:
        plan = Plan(
            reps=1, pgbench_s=1, cycle_s=1.0, enqueue_s=1.0, wake_s=1.5, peer_s=0.75,
            profile_s=0, history=(10_000, 50_000), cost_s=1.0,
            churn_s=2.0, churn_window=1.0, churn_items=HOUR_EQUIVALENT_ITEMS // 40,
            worker_s=0.5, worker_reps=1, concurrency=QUICK_CONCURRENCY, managers=(5,),
            snap_warm_s=2.0, snap_baseline_s=10.0, snap_hold_s=20.0, snap_window_s=5.0,
        )  # fmt: skip
    else:
        plan = Plan(
            reps=2, pgbench_s=2, cycle_s=1.5, enqueue_s=2.0, wake_s=2.0, peer_s=1.5,
            profile_s=3, history=(10_000, 1_000_000), cost_s=2.0,
            churn_s=12.0, churn_window=4.0, churn_items=HOUR_EQUIVALENT_ITEMS,
            worker_s=1.0, worker_reps=2,
        )  # fmt: skip
    if big:
        plan.history = (*plan.history, 10_000_000)
        plan.churn_s = max(plan.churn_s, 240.0)
    if args.reps is not None:
        plan.reps = plan.worker_reps = args.reps
    if args.no_profile:
        plan.profile_s = 0
    if args.hold_minutes is not None:
        plan.snap_hold_s = args.hold_minutes * 60
    plan.procrastinate = "procrastinate" in args.only.split(",")
    return plan


@dataclass
class Run:
    """Everything a run measures, filled in phase by phase."""

    env: Environment
    plan: Plan
    pool: ProcessPoolExecutor
    client_procs: int
    figures: dict[str, Figure] = field(default_factory=dict)
    cpu: dict[str, CpuSplit] = field(default_factory=dict)
    errors: dict[str, list[str]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    tenants: int = 0
    rates: dict[str, float] = field(default_factory=dict)
    # The server's mode while a phase that runs in both modes is measured ("" otherwise).
    mode: str = ""
    last_load: PhaseLoad | None = None

    def keyed(self, key: str) -> str:
        """A figure key (or rate family) of the current mode: `rest_batched_c16@w1`."""
        return f"{key}@{self.mode}" if self.mode else key

    def labelled(self, label: str) -> str:
        return f"{label} [{self.env.mode}]" if self.mode else label

    def figure(
        self,
        key: str,
        label: str,
        unit: str,
        value: float,
        note: str = "",
        load: PhaseLoad | None = None,
    ) -> None:
        """One repetition's value, with what else ran during its phase (the last measured)."""
        fig = self.figures.setdefault(key, Figure(key, label, unit, note=note))
        fig.runs.append(value)
        fig.loads.append(load or self.last_load)

    def account(self, family: str, load: PhaseLoad, loadgen_cpu: float) -> None:
        self.last_load = load
        self.cpu.setdefault(family, CpuSplit()).add(load, loadgen_cpu)
        if not load.quiet:
            say(f"  ~~ not quiet: {load.describe()}")

    def error(self, phase: str, samples: list[str], count: int) -> None:
        if count:
            self.errors.setdefault(phase, []).append(f"{count} errors: {samples[:3]}")
            say(f"  !! {phase}: {count} errors, e.g. {samples[:1]}")

    def new_tenant(self, prefix: str) -> Any:
        self.tenants += 1
        return self.env.tenant(f"{prefix}-{self.tenants}")

    def measure(self, family: str, submit: list[Future[T]], wall_from: float) -> list[T]:
        """Wait for load-generator futures, charging CPU of every party to `family`."""
        # The phase starts at wall_from; CPU before it (spawn, connect) is not the phase's.
        time.sleep(max(0.0, wall_from - time.time()))
        start = self.env.snapshot()
        results = [f.result() for f in submit]
        loadgen_cpu = sum(float(getattr(r, "cpu", 0.0)) for r in results)
        self.account(family, self.env.load_since(start), loadgen_cpu)
        return results


def _split(total: int, parts: int) -> list[int]:
    parts = max(1, min(parts, total))
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


# -- prefill -------------------------------------------------------------------

_HISTORY = """
INSERT INTO work_items (tenant_id, item_id, queue, payload, priority, state, available_at, fence,
                        acquisition_count, max_acquisitions, result, event_seq,
                        created_at, updated_at)
SELECT %(tenant)s, gen_random_uuid(), %(queue)s, '{}'::jsonb, 0, 'completed',
       statement_timestamp(), 1, 1, 5, '{"ok": true}'::jsonb, 3,
       statement_timestamp(), statement_timestamp()
FROM generate_series(1, %(n)s)
"""


def prefill(run: Run, tenant: Any, queue: str, n: int) -> None:
    """`n` ready items, exactly as an enqueue makes them (row + `enqueued` ledger event).

    SQL, because enqueueing them over REST would take longer than the phase
    that consumes them; falls back to REST batches if the schema moved on.
    """
    try:
        with psycopg.connect(run.env.url, autocommit=True) as conn:
            for start in range(0, n, 200_000):
                conn.execute(
                    PREFILL, {"tenant": tenant.name, "queue": queue, "n": min(200_000, n - start)}
                )
            conn.execute("ANALYZE work_items")
        return
    except psycopg.Error as exc:
        say(f"  SQL prefill failed ({exc.__class__.__name__}); enqueueing over REST instead")
    now = time.time()
    spec = loadgen.EnqueueSpec(
        HOST, run.env.port, tenant.worker_key, tenant.name, queue, producers=2,
        batch=ENQUEUE_BATCH, start_at=now, end_at=now + 600, limit_items=n,
    )  # fmt: skip
    loadgen.run_enqueue(spec)


# -- phases --------------------------------------------------------------------


def phase_pgbench(run: Run) -> None:
    reference.prepare(run.env.pg)
    for rep in range(run.plan.reps):
        for clients in run.plan.concurrency:
            rate = run.rates.get(f"pgbench{clients}", 8000.0)
            reference.refill(run.env.pg, int(max(50_000, rate * run.plan.pgbench_s * 1.6)))
            say(f"pgbench lease cycle, {clients} clients, rep {rep + 1}/{run.plan.reps}")
            start = run.env.snapshot()
            result = reference.run(
                run.env.pg, clients=clients, seconds=run.plan.pgbench_s, workdir=run.env.root
            )
            run.account(f"pgbench c{clients}", run.env.load_since(start), result.cpu)
            run.rates[f"pgbench{clients}"] = result.cycles_per_s
            run.figure(
                f"pgbench_c{clients}",
                f"pgbench lease cycle, {clients} clients",
                "cycles/s",
                result.cycles_per_s,
            )
            say(f"  {result.cycles_per_s:,.0f} cycles/s")


def prefill_size(run: Run, family: str, batch: int, seconds: float) -> int:
    """Enough items for `seconds` at the best rate seen so far in this mode, with a margin."""
    mode = "unbatched" if batch == 1 else "batched"
    seen = [v for k, v in run.rates.items() if k == family or k.startswith(f"rest {mode}")]
    rate = max(seen) * 1.5 if seen else (2000.0 if batch == 1 else 5000.0)
    return int(max(2000, rate * seconds * 1.5))


def cycles_once(
    run: Run,
    *,
    workers: int,
    batch: int,
    seconds: float,
    family: str,
    record_latency: bool = False,
    window: float = 0.0,
    tenant: Any = None,
    items: int | None = None,
    prefilled: bool = False,
) -> tuple[float, list[loadgen.CycleResult], float]:
    """One timed lease-cycle phase on a fresh, prefilled queue. Returns (items/s, results, elapsed)."""
    if tenant is None:
        tenant = run.new_tenant("cyc")
    if not prefilled:
        prefill(run, tenant, "q", items or prefill_size(run, family, batch, seconds))
    procs = 1 if workers < 4 else run.client_procs
    start_at = time.time() + START_MARGIN
    end_at = start_at + seconds
    futures = []
    offset = 0
    for n in _split(workers, procs):
        spec = loadgen.CycleSpec(
            HOST, run.env.port, tenant.worker_key, tenant.name, "q", workers=n,
            worker_offset=offset, batch=batch, batch_route=run.env.batch_completion_route,
            start_at=start_at, end_at=end_at, record_latency=record_latency, window=window,
        )  # fmt: skip
        offset += n
        futures.append(run.pool.submit(loadgen.run_cycles, spec))
    time.sleep(max(0.0, start_at - time.time()))
    results = run.measure(family, futures, start_at)
    total = sum(r.items for r in results)
    dry = max((r.ran_dry_at for r in results), default=0.0)
    elapsed = (min(dry, end_at) if dry else end_at) - start_at
    for r in results:
        run.error(family, r.error_samples, r.errors)
    rate_now = total / elapsed if elapsed > 0 else 0.0
    run.rates[family] = max(rate_now, run.rates.get(family, 0.0))
    return rate_now, results, elapsed


def phase_rest_cycles(run: Run) -> None:
    route = (
        "batch completion route"
        if run.env.batch_completion_route
        else "one complete call per item, concurrently"
    )
    run.extra["batched_completion"] = route
    for rep in range(run.plan.reps):
        for batch, mode in ((1, "unbatched"), (BATCH, "batched")):
            for workers in run.plan.concurrency:
                family = run.keyed(f"rest {mode} c{workers}")
                say(
                    f"REST lease cycles, {mode}, {workers} workers [{run.env.mode}],"
                    f" rep {rep + 1}/{run.plan.reps}"
                )
                # One unbatched worker on a fresh queue: the single-call latencies.
                latency = batch == 1 and workers == 1
                rate, res, elapsed = cycles_once(
                    run, workers=workers, batch=batch, seconds=run.plan.cycle_s, family=family,
                    record_latency=latency,
                )  # fmt: skip
                short = " (queue ran dry early)" if elapsed < run.plan.cycle_s - 0.05 else ""
                run.figure(
                    run.keyed(f"rest_{mode}_c{workers}"),
                    run.labelled(
                        f"REST lease cycles, {mode}"
                        + (f" ({BATCH}/call)" if batch > 1 else "")
                        + f", {workers} workers"
                    ),
                    "items/s",
                    rate,
                )
                say(f"  {rate:,.0f} items/s over {elapsed:.1f}s{short}")
                if latency:
                    for op in ("acquire", "complete"):
                        ms = [v * 1000 for r in res for v in getattr(r, f"{op}_latency")]
                        run.figure(
                            run.keyed(f"{op}_p50_ms_c1"),
                            run.labelled(f"{op} p50, 1 unbatched worker, fresh queue"),
                            "ms",
                            percentile(ms, 50),
                        )
                        say(f"  {op} p50 {percentile(ms, 50):.2f} ms over {len(ms):,} calls")


def phase_enqueue(run: Run) -> None:
    for rep in range(run.plan.reps):
        for batch, producers, name in ((1, 16, "single"), (ENQUEUE_BATCH, 4, "batch")):
            tenant = run.new_tenant("enq")
            say(
                f"REST enqueue, {name} ({batch}/call, {producers} producers), rep {rep + 1}/{run.plan.reps}"
            )
            start_at = time.time() + START_MARGIN
            end_at = start_at + run.plan.enqueue_s
            futures = []
            for n in _split(producers, run.client_procs if producers > 4 else 1):
                spec = loadgen.EnqueueSpec(
                    HOST, run.env.port, tenant.worker_key, tenant.name, "q", producers=n,
                    batch=batch, start_at=start_at, end_at=end_at,
                )  # fmt: skip
                futures.append(run.pool.submit(loadgen.run_enqueue, spec))
            time.sleep(max(0.0, start_at - time.time()))
            results = run.measure(f"rest enqueue {name}", futures, start_at)
            items = sum(r.items for r in results)
            elapsed = max(r.finished_at for r in results) - start_at
            for r in results:
                run.error(f"enqueue {name}", r.error_samples, r.errors)
            rate = items / elapsed
            run.figure(
                f"rest_enqueue_{name}",
                f"REST enqueue, {name} ({batch}/call, {producers} producers)",
                "items/s",
                rate,
            )
            say(f"  {rate:,.0f} items/s")


# The transactional-enqueue phase's variants (items per commit, application connections):
# one item and an application's batch, on one connection and on 16 at once.
TX_VARIANTS = ((1, 1), (100, 1), (1, 16), (100, 16))


def phase_tx_enqueue(run: Run) -> None:
    """`queue_server.enqueue` inside an application's transaction (an order row and its item
    per commit, or 100 of each), against a bare INSERT of the same order rows."""
    txenqueue.prepare(run.env.url)
    for rep in range(run.plan.reps):
        for per_commit, connections in TX_VARIANTS:
            for enqueue in (False, True):
                tenant = run.new_tenant("txq")
                what = "INSERT + queue_server.enqueue" if enqueue else "bare INSERT"
                on = f"{connections} connection{'s' if connections > 1 else ''}"
                say(f"{what}, {per_commit} per commit, {on}, rep {rep + 1}/{run.plan.reps}")
                start_at = time.time() + START_MARGIN
                spec = txenqueue.TxSpec(
                    url=run.env.url, tenant=tenant.name, queue="q", per_commit=per_commit,
                    enqueue=enqueue, start_at=start_at, end_at=start_at + run.plan.enqueue_s,
                    connections=connections,
                )  # fmt: skip
                future = run.pool.submit(txenqueue.run, spec)
                family = f"tx {'enqueue' if enqueue else 'insert'} {per_commit}/commit"
                family += f" x{connections}" if connections > 1 else ""
                (result,) = run.measure(family, [future], start_at)
                run.error(family, result.error_samples, result.errors)
                rate = result.items / max(1e-9, result.finished_at - start_at)
                key = f"tx_{'enqueue' if enqueue else 'insert'}_{per_commit}"
                key += f"_c{connections}" if connections > 1 else ""
                label = (
                    f"enqueue in an application transaction, {per_commit} per commit"
                    if enqueue
                    else f"bare INSERT into the application's table, {per_commit} per commit"
                )
                label += f", {on}" if connections > 1 else ""
                run.figure(key, label, "items/s", rate)
                say(f"  {rate:,.0f} items/s")


def phase_wake(run: Run) -> None:
    for rep in range(run.plan.reps):
        tenant = run.new_tenant("wake")
        say(f"wake-up latency at 100 items/s, long poll wait=30, rep {rep + 1}/{run.plan.reps}")
        start_at = time.time() + 1.0
        spec = loadgen.WakeSpec(
            HOST, run.env.port, tenant.worker_key, tenant.name, "q", rate=100.0,
            start_at=start_at, end_at=start_at + run.plan.wake_s,
        )  # fmt: skip
        future = run.pool.submit(loadgen.run_wake, spec)
        time.sleep(max(0.0, start_at - time.time()))
        (result,) = run.measure("wake-up (100 items/s)", [future], start_at)
        run.error("wake-up", result.error_samples, result.errors)
        ms = [v * 1000 for v in result.latencies]
        run.figure("wake_p50_ms", "wake-up enqueue-to-lease p50", "ms", percentile(ms, 50))
        run.figure("wake_p99_ms", "wake-up enqueue-to-lease p99", "ms", percentile(ms, 99))
        say(
            f"  {len(ms)} items: p50 {percentile(ms, 50):.1f} ms, p99 {percentile(ms, 99):.1f} ms,"
            f" max {max(ms, default=0):.1f} ms"
        )


def phase_peer(run: Run) -> None:
    """pgqueuer: its consumer with 1 and 5 queue managers (drain mode), and batch enqueue."""
    with psycopg.connect(run.env.pg.url(), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {peer.DATABASE}")
    url = run.env.pg.url(peer.DATABASE)
    peer.install(url)
    for rep in range(run.plan.reps):
        for managers in run.plan.managers:
            family = f"pgqueuer dequeue+ack m{managers}"
            rate = run.rates.get(family, 3000.0 * managers**0.5)
            peer.reset(url, int(max(2_000, rate * run.plan.peer_s * 1.3)))
            say(f"pgqueuer dequeue+ack, {managers} queue manager(s), rep {rep + 1}/{run.plan.reps}")
            start_at = time.time() + START_MARGIN
            spec = peer.PeerSpec(
                url=url, start_at=start_at, end_at=start_at + run.plan.peer_s + 2.0,
                managers=managers,
            )  # fmt: skip
            (result,) = run.measure(family, [run.pool.submit(peer.run_dequeue, spec)], start_at)
            jobs_s = result.jobs / result.elapsed if result.elapsed > 0 else 0.0
            run.rates[family] = jobs_s
            suffix = "" if managers == 1 else f"_m{managers}"
            label = f"pgqueuer dequeue+ack, {managers} queue manager{'s' if managers > 1 else ''}"
            run.figure(f"peer_dequeue_ack{suffix}", f"{label}, steady (first to last job)",
                       "jobs/s", jobs_s)  # fmt: skip
            run.figure(f"peer_dequeue_ack{suffix}_wall", f"{label}, wall (start to drained exit)",
                       "jobs/s", result.wall)  # fmt: skip
            say(f"  steady {jobs_s:,.0f} jobs/s, wall {result.wall:,.0f} jobs/s")
        say(
            f"pgqueuer batch enqueue ({ENQUEUE_BATCH}/call, 4 producers), rep {rep + 1}/{run.plan.reps}"
        )
        peer.reset(url, 0)
        start_at = time.time() + START_MARGIN
        spec = peer.PeerSpec(url=url, start_at=start_at, end_at=start_at + run.plan.enqueue_s)
        (result,) = run.measure(
            "pgqueuer batch enqueue", [run.pool.submit(peer.run_enqueue, spec)], start_at
        )
        jobs_s = result.jobs / result.elapsed
        run.figure(
            "peer_enqueue_batch",
            f"pgqueuer batch enqueue ({ENQUEUE_BATCH}/call, 4 producers)",
            "jobs/s",
            jobs_s,
        )
        say(f"  {jobs_s:,.0f} jobs/s")
    peer.reset(url, 0)


# (figure key, label, kind, slots, first guess of items/s for the prefill)
SDK_ROWS = (
    ("sdk_thread_c1", "SDK Worker (threads), no-op, 1 slot", "thread", 1, 4000.0),
    ("sdk_thread_c16", "SDK Worker (threads), no-op, 16 slots", "thread", 16, 5000.0),
    ("sdk_async_c1", "SDK AsyncWorker, no-op, 1 slot", "async", 1, 4000.0),
    ("sdk_async_c16", "SDK AsyncWorker, no-op, 16 slots", "async", 16, 5000.0),
)
# Measured in one mode only (the CLI spends its time spawning commands, not in the server).
# The spawn floor first: `work` at 16 slots cannot outrun it, so its rate sizes that queue.
COMMAND_ROWS = (
    ("spawn_floor_c16", "spawn floor: 16 threads spawning true, no queue", "spawn", 16, 0.0),
    ("work_c1", "queue-server work -- true, 1 slot", "cli", 1, 250.0),
    ("work_c16", "queue-server work -- true, 16 slots", "cli", 16, 1500.0),
    ("bare_loop_c1", "bare loop: acquire, spawn true, complete", "loop", 1, 80.0),
)
# A listed figure, not a target, with `--only ...,procrastinate`; the first repetition only.
PEER_ROWS = (
    ("procrastinate_c1", "procrastinate worker, concurrency 1", "procrastinate", 1, 500.0),
    ("procrastinate_c10", "procrastinate worker, concurrency 10", "procrastinate", 10, 1000.0),
)


def _ceiling(run: Run, kind: str, slots: int) -> float:
    """A rate this row cannot much exceed, seen earlier in the run (0.0 if none): the
    server's best batched lease cycles for an SDK worker, the spawn floor for `work`."""
    if kind in ("thread", "async"):
        mode = [run.rates.get(run.keyed(f"rest batched c{c}"), 0.0) for c in CONCURRENCY]
        return 1.2 * max(mode)
    if kind == "cli" and slots > 1:
        return run.rates.get("spawn_floor_c16", 0.0)
    return 0.0


def phase_sdk_workers(run: Run) -> None:
    """The SDK workers, in the server's current mode."""
    _workers(run, SDK_ROWS, peers=False)


def phase_workers(run: Run) -> None:
    """The SDK workers, `queue-server work`, the bare loop, the spawn floor, procrastinate."""
    _workers(run, SDK_ROWS + COMMAND_ROWS, peers=True)


def _workers(run: Run, rows: tuple[tuple[str, str, str, int, float], ...], *, peers: bool) -> None:
    """What users run, each from its own process over a prefilled queue: steady and wall."""
    procrastinate_url = run.env.pg.url(user_workers.PROCRASTINATE_DATABASE)
    if peers and run.plan.procrastinate:
        with psycopg.connect(run.env.pg.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {user_workers.PROCRASTINATE_DATABASE}")
    seconds = run.plan.worker_s
    for rep in range(run.plan.worker_reps):
        for row_key, row_label, kind, slots, guess in rows + (
            PEER_ROWS if peers and rep == 0 and run.plan.procrastinate else ()
        ):
            server_bound = kind in ("thread", "async")
            key = run.keyed(row_key) if server_bound else row_key
            label = run.labelled(row_label) if server_bound else row_label
            rate = run.rates.get(key) or min(guess, _ceiling(run, kind, slots) or guess)
            items = int(max(200, rate * seconds * 1.5))
            if kind == "procrastinate":
                user_workers.procrastinate_reset(procrastinate_url, items)
                tenant = None
            elif kind == "spawn":
                tenant = None
            else:
                tenant = run.new_tenant("wk")
                prefill(run, tenant, "q", items)
            say(f"{label}, rep {rep + 1}/{run.plan.worker_reps}")
            start_at = time.time() + START_MARGIN
            spec = user_workers.WorkerSpec(
                kind=kind, slots=slots, start_at=start_at,
                # A queue runs dry on its own; the spawn floor has none, so its deadline is the end.
                end_at=start_at + seconds + (0.0 if kind == "spawn" else 2.0),
                base_url=run.env.base_url, key=tenant.worker_key if tenant else "",
                cli=venv_bin("queue-server"), database_url=procrastinate_url,
            )  # fmt: skip
            (result,) = run.measure(key, [run.pool.submit(user_workers.run_worker, spec)], start_at)
            run.error(key, result.error_samples, result.errors)
            steady, wall = result.steady(), result.wall(start_at)
            run.rates[key] = max(steady, run.rates.get(key, 0.0))
            run.figure(key, f"{label}, steady", "items/s", steady)
            run.figure(f"{key}_wall", f"{label}, wall", "items/s", wall)
            say(f"  {result.items:,} items: steady {steady:,.0f}/s, wall {wall:,.0f}/s")


def phase_profile(run: Run) -> None:
    if run.plan.profile_s <= 0:
        return
    summaries: dict[str, Any] = {}
    for stale in RESULTS.glob("profile-*.collapsed"):
        stale.unlink()
    for batch, mode in ((1, "unbatched"), (BATCH, "batched")):
        say(
            f"profiling the server (py-spy, {run.plan.profile_s}s) during {mode} cycles, 16 workers"
        )
        family = f"profiled {mode} c16"
        tenant = run.new_tenant("prof")
        prefill(run, tenant, "q", prefill_size(run, family, batch, run.plan.profile_s))
        pids = run.env.server_pids()
        spies = profile.start(pids, RESULTS, mode, run.plan.profile_s)
        time.sleep(0.3)
        cycles_once(
            run, workers=16, batch=batch, seconds=run.plan.profile_s - 0.5, family=family,
            tenant=tenant, prefilled=True,
        )  # fmt: skip
        files = profile.finish(spies)
        summary = profile.summarise(files)
        summaries[mode] = summary.as_json()
        top = ", ".join(f"{n.split(' (')[0]} {p:.0f}%" for n, p in summary.by_area_self[:5])
        say(f"  {summary.samples} samples; self time by package: {top}")
    run.extra["profile"] = summaries


def phase_cost_growth(run: Run) -> None:
    tenant = run.new_tenant("hist")
    have = 0
    results: list[dict[str, Any]] = []
    for target in run.plan.history:
        say(f"cost growth: inserting history up to {target:,} completed rows")
        with psycopg.connect(run.env.url, autocommit=True) as conn:
            while have < target:
                n = min(1_000_000, target - have)
                conn.execute(_HISTORY, {"tenant": tenant.name, "queue": "q", "n": n})
                have += n
                if target >= 1_000_000:
                    say(f"  {have:,} rows")
            conn.execute("VACUUM ANALYZE work_items")
        acq: list[float] = []
        comp: list[float] = []
        for rep in range(run.plan.reps):
            say(
                f"cost growth: {target:,} history rows, 1 worker unbatched, rep {rep + 1}/{run.plan.reps}"
            )
            _, res, _ = cycles_once(
                run, workers=1, batch=1, seconds=run.plan.cost_s, family=f"cost growth {target:,}",
                record_latency=True, tenant=tenant,
            )  # fmt: skip
            a = [v * 1000 for r in res for v in r.acquire_latency]
            c = [v * 1000 for r in res for v in r.complete_latency]
            acq += a
            comp += c
            run.figure(
                f"acquire_p50_ms_h{target}",
                f"acquire p50, {target:,} history rows",
                "ms",
                percentile(a, 50),
            )
            run.figure(
                f"complete_p50_ms_h{target}",
                f"complete p50, {target:,} history rows",
                "ms",
                percentile(c, 50),
            )
            say(
                f"  acquire p50 {percentile(a, 50):.2f} ms, complete p50 {percentile(c, 50):.2f} ms"
            )
        size = run.env.sql("SELECT pg_total_relation_size('work_items')")[0][0]
        results.append(
            {
                "history_rows": target,
                "acquire_p99_ms": round(percentile(acq, 99), 2),
                "complete_p99_ms": round(percentile(comp, 99), 2),
                "work_items_total_mb": round(size / 2**20, 1),
            }
        )
    run.extra["cost_growth"] = results


# The ordering keys and partition keys of the flow-control phase's queues; the dependents
# waiting in the queue of its `waiting` variant.
ORDERING_KEYS = 1000
PARTITION_KEYS = 1000
WAITING_ITEMS = 100_000
# Dependents released one at a time, each timed from its dependency's completion to its lease.
RELEASES = 200

# A rate limit that every acquire reads and writes but none reaches (the bench measures its
# cost, not its waits): over the queue, or per partition key.
RATE_LIMIT = """
INSERT INTO queues (tenant_id, queue, rate_limit, rate_interval, rate_partitioned)
VALUES (%(tenant)s, 'q', 1000000, interval '60 seconds', %(partitioned)s)
ON CONFLICT (tenant_id, queue) DO UPDATE
SET rate_limit = excluded.rate_limit, rate_interval = excluded.rate_interval,
    rate_partitioned = excluded.rate_partitioned
"""
# A queue that hands out its items round-robin between their partition keys (migration 0040).
FAIR = """
INSERT INTO queues (tenant_id, queue, fairness) VALUES (%(tenant)s, 'q', 'partition_key')
ON CONFLICT (tenant_id, queue) DO UPDATE SET fairness = excluded.fairness
"""
PARTITIONED = "UPDATE work_items SET partition_key = 'key-' || (hashtext(item_id::text) & 1023) WHERE tenant_id = %(tenant)s"


def phase_flow(run: Run) -> None:
    """The acquire and the complete, one worker unbatched, on a plain queue; under a rate
    limit over the queue; under one per partition key with 1,000 keys; and on a queue whose
    items have 1,000 ordering keys (one ready per key, the rest of each key's line waiting
    behind it: each complete makes the next of its key ready); and on a queue that also
    holds 100,000 items waiting for a dependency (the acquire never reads them); and on a
    queue fair between 1,000 partition keys (round-robin between them). Then the
    time from a dependency's completion to its dependent's lease (`release_latency`)."""
    seconds = run.plan.cost_s * 2
    n = prefill_size(run, "flow", 1, seconds)
    variants = (
        ("plain", "plain queue"),
        ("rate", "a rate limit"),
        ("partitioned", f"a rate limit per partition key, {PARTITION_KEYS:,} keys"),
        ("ordered", f"{ORDERING_KEYS:,} ordering keys"),
        ("waiting", f"{WAITING_ITEMS:,} items waiting for a dependency"),
        ("fair", f"fairness between {PARTITION_KEYS:,} partition keys"),
    )
    for name, label in variants:
        tenant = run.new_tenant(f"flow{name}")
        with psycopg.connect(run.env.url, autocommit=True) as conn:
            if name == "ordered":
                conn.execute(
                    ORDERED_PREFILL,
                    {"tenant": tenant.name, "queue": "q", "n": n, "keys": ORDERING_KEYS},
                )
            else:
                prefill(run, tenant, "q", n)
            if name in ("rate", "partitioned"):
                conn.execute(RATE_LIMIT, {"tenant": tenant.name, "partitioned": name != "rate"})
            if name in ("partitioned", "fair"):
                conn.execute(PARTITIONED, {"tenant": tenant.name})
            if name == "fair":
                conn.execute(FAIR, {"tenant": tenant.name})
            if name == "waiting":
                conn.execute(
                    WAITING_PREFILL, {"tenant": tenant.name, "queue": "q", "n": WAITING_ITEMS}
                )
            conn.execute("ANALYZE work_items")
        for rep in range(run.plan.reps):
            say(f"flow control: {label}, 1 worker unbatched, rep {rep + 1}/{run.plan.reps}")
            _, res, _ = cycles_once(
                run, workers=1, batch=1, seconds=seconds, family=f"flow {name}",
                record_latency=True, tenant=tenant, prefilled=True,
            )  # fmt: skip
            a = [v * 1000 for r in res for v in r.acquire_latency]
            c = [v * 1000 for r in res for v in r.complete_latency]
            run.figure(f"acquire_p50_ms_{name}", f"acquire p50, {label}", "ms", percentile(a, 50))
            run.figure(f"complete_p50_ms_{name}", f"complete p50, {label}", "ms", percentile(c, 50))
            say(
                f"  acquire p50 {percentile(a, 50):.2f} ms, complete p50 {percentile(c, 50):.2f} ms"
            )
    release_latency(run)


def release_latency(run: Run) -> None:
    """A worker long-polls the dependents' queue while the dependency of each, one at a
    time, is completed: the time from sending that completion to the dependent's lease
    answered (the completion's round trip included), p50 and p99."""
    run.tenants += 1
    tenant = run.env.tenant(f"released-{run.tenants}", queues=("deps", "after"))
    say(f"flow control: {RELEASES} dependents, each timed from its dependency's completion")
    headers = {"Authorization": f"Bearer {tenant.worker_key}"}
    base = f"http://{HOST}:{run.env.port}/v1/tenants/{tenant.name}"
    timings: list[float] = []
    with (
        httpx.Client(base_url=base, headers=headers, timeout=30) as producer,
        httpx.Client(base_url=base, headers=headers, timeout=30) as waiter,
        ThreadPoolExecutor(1) as pool,
    ):

        def enqueue(queue: str, body: dict[str, Any]) -> str:
            made = producer.post(
                f"/queues/{queue}/items", json=body, headers={"Idempotency-Key": uuid.uuid4().hex}
            )
            made.raise_for_status()
            return str(made.json()["item_id"])

        def parked_acquire() -> httpx.Response:
            return waiter.post(
                "/queues/after/leases", json={"worker": "bench", "lease_ttl": 30, "wait": 5}
            )

        for _ in range(RELEASES):
            dep = enqueue("deps", {"payload": None})
            after = enqueue("after", {"payload": None, "depends_on": [dep]})
            (lease,) = producer.post(
                "/queues/deps/leases", json={"worker": "bench", "lease_ttl": 30}
            ).json()["leases"]
            parked = pool.submit(parked_acquire)
            time.sleep(0.01)  # the long poll is parked before the completion
            sent = time.perf_counter()
            producer.post(
                f"/items/{dep}/complete",
                json={"worker": "bench", "fence": lease["fence"]},
                headers={"Idempotency-Key": uuid.uuid4().hex},
            ).raise_for_status()
            answer = parked.result()
            leased = time.perf_counter()
            (got,) = answer.json()["leases"]
            assert got["item_id"] == after, got
            timings.append((leased - sent) * 1000)
            producer.post(
                f"/items/{after}/complete",
                json={"worker": "bench", "fence": got["fence"]},
                headers={"Idempotency-Key": uuid.uuid4().hex},
            ).raise_for_status()
    for q in (50, 99):
        run.figure(
            f"release_p{q}_ms",
            f"a dependency's completion to its dependent's lease, p{q}",
            "ms",
            percentile(timings, q),
        )
    say(f"  p50 {percentile(timings, 50):.2f} ms, p99 {percentile(timings, 99):.2f} ms")


_DEAD = """
SELECT relname, n_live_tup, n_dead_tup, autovacuum_count, autoanalyze_count,
       extract(epoch FROM now() - last_autovacuum) AS since_autovacuum_s,
       pg_total_relation_size(relid) AS bytes
FROM pg_stat_user_tables
WHERE relname IN ('work_items', 'item_events', 'idempotency_receipts')
ORDER BY relname
"""


# The churn tenant keeps finished items this long: the retention sweeper deletes them
# (with their ledgers) while the churn runs, so table sizes should level off.
CHURN_RETENTION_S = 5.0


def phase_churn(run: Run) -> None:
    """Batched cycles (16 workers) over an hour-equivalent of items, in windows, with a
    short retention: table sizes are sampled with the tuple counts."""
    plan = run.plan
    run.tenants += 1
    tenant = run.env.tenant(f"churn-{run.tenants}", retention=CHURN_RETENTION_S)
    say(f"churn: prefilling {plan.churn_items:,} items (an hour at 100 items/s)")
    prefill(run, tenant, "q", plan.churn_items)
    say(
        f"churn: batched cycles, 16 workers, up to {plan.churn_s:.0f}s, windows of {plan.churn_window:.0f}s"
    )
    samples: list[dict[str, Any]] = []
    start_at = time.time() + START_MARGIN
    end_at = start_at + plan.churn_s
    futures = []
    offset = 0
    for n in _split(16, run.client_procs):
        spec = loadgen.CycleSpec(
            HOST, run.env.port, tenant.worker_key, tenant.name, "q", workers=n,
            worker_offset=offset, batch=BATCH, batch_route=run.env.batch_completion_route,
            start_at=start_at, end_at=end_at, window=plan.churn_window,
        )  # fmt: skip
        offset += n
        futures.append(run.pool.submit(loadgen.run_cycles, spec))
    time.sleep(max(0.0, start_at - time.time()))
    start = run.env.snapshot()
    while not all(f.done() for f in futures):
        rows = run.env.sql(_DEAD)
        samples.append(
            {
                "t": round(time.time() - start_at, 1),
                "tables": {
                    r[0]: {
                        "live": r[1],
                        "dead": r[2],
                        "autovacuums": r[3],
                        "autoanalyzes": r[4],
                        "mb": round(r[6] / 2**20, 1),
                    }
                    for r in rows
                },
            }
        )
        wo = samples[-1]["tables"].get("work_items", {})
        ev = samples[-1]["tables"].get("item_events", {})
        say(
            f"  t={samples[-1]['t']:5.1f}s work_items live {wo.get('live', 0):,} dead {wo.get('dead', 0):,}"
            f" {wo.get('mb', 0)} MB, item_events {ev.get('mb', 0)} MB, autovacuums {wo.get('autovacuums', 0)}"
        )
        time.sleep(min(plan.churn_window, 5.0))
    results = [f.result() for f in futures]
    run.account("churn (batched c16)", run.env.load_since(start), sum(r.cpu for r in results))
    for r in results:
        run.error("churn", r.error_samples, r.errors)
    windows = [0] * max((len(r.windows) for r in results), default=0)
    for r in results:
        for i, v in enumerate(r.windows):
            windows[i] += v
    total = sum(r.items for r in results)
    full = [w for w in windows[: int(plan.churn_s / plan.churn_window)]]
    rates = [w / plan.churn_window for w in full if w > 0]
    final = run.env.sql(_DEAD)
    work = next((r for r in final if r[0] == "work_items"), None)
    first = rates[0] if rates else 0.0
    last = rates[-1] if rates else 0.0
    peak_dead = max((s["tables"].get("work_items", {}).get("dead", 0) for s in samples), default=0)
    run.extra["churn"] = {
        "items": total,
        "hour_equivalent_items": HOUR_EQUIVALENT_ITEMS,
        "fraction_of_hour_equivalent": round(total / HOUR_EQUIVALENT_ITEMS, 2),
        "window_s": plan.churn_window,
        "window_rates_items_s": [round(r) for r in rates],
        "first_window_items_s": round(first),
        "last_window_items_s": round(last),
        "last_over_first": round(last / first, 2) if first else 0.0,
        "peak_dead_tuples_work_items": peak_dead,
        "final": [
            {
                "table": r[0],
                "live": r[1],
                "dead": r[2],
                "autovacuums": r[3],
                "autoanalyzes": r[4],
                "since_last_autovacuum_s": None if r[5] is None else round(float(r[5]), 1),
                "mb": round(r[6] / 2**20, 1),
            }
            for r in final
        ],
        "retention_s": CHURN_RETENTION_S,
        # Sizes once the first finished items are past the retention (plus one sweep),
        # and at the end: under retention they level off instead of growing with history.
        "table_mb": _sizes(samples, final, after=CHURN_RETENTION_S + 2 * RETENTION_INTERVAL),
        "samples": samples,
        "autovacuum_kept_up": bool(
            work is not None
            and (last >= 0.8 * first if first else False)
            and work[2] <= max(0.2 * max(work[1], 1), 50_000)
        ),
        "autovacuum_kept_up_rule": (
            "last window >= 0.8x first window and final dead tuples of work_items"
            " <= max(20% of live, 50,000)"
        ),
    }
    run.figure("churn_first_window", "churn: batched c16, first window", "items/s", first)
    run.figure("churn_last_window", "churn: batched c16, last window", "items/s", last)
    say(
        f"  {total:,} items; first window {first:,.0f}/s, last {last:,.0f}/s; peak dead tuples {peak_dead:,}"
    )


def _sizes(
    samples: list[dict[str, Any]], final: list[Any], *, after: float
) -> dict[str, dict[str, float]]:
    """Each table's size (MB) at the first sample taken `after` seconds in, and at the end."""
    settled = next((s for s in samples if s["t"] >= after), samples[-1] if samples else None)
    sizes = {}
    for r in final:
        table = settled["tables"].get(r[0], {}) if settled else {}
        sizes[r[0]] = {
            "at_s": settled["t"] if settled else 0.0,
            "mb": table.get("mb", 0.0),
            "live": table.get("live", 0),
            "end_mb": round(r[6] / 2**20, 1),
            "end_live": r[1],
        }
    return sizes


def phase_held_snapshot(run: Run) -> None:
    """A steady flow through the SDK worker while another session holds a REPEATABLE READ
    snapshot: per window, items/s, acquire p50 and p99, and the hot tables' dead tuples."""
    plan = run.plan
    window, baseline, hold = plan.snap_window_s, plan.snap_baseline_s, plan.snap_hold_s
    tail = snapshot.tail_seconds(hold)
    n_base, n_all = round(baseline / window), round((baseline + hold) / window)
    n_tail = max(1, round(tail / window))
    tenant = run.new_tenant("snap")
    prefill(run, tenant, "q", snapshot.READY_TARGET)
    start_at = time.time() + START_MARGIN
    origin = start_at + plan.snap_warm_s
    spec = snapshot.FlowSpec(
        HOST, run.env.port, tenant.worker_key, tenant.name, "q", start_at=start_at,
        origin=origin, end_at=origin + baseline + hold, window=window,
    )  # fmt: skip
    say(
        f"held snapshot: SDK Worker ({snapshot.SLOTS} slots), a producer keeping"
        f" {snapshot.READY_TARGET:,} ready; {snapshot.describe(baseline)} baseline, then a"
        f" REPEATABLE READ snapshot held {snapshot.describe(hold)}; windows of {window:g} s"
    )
    futures = [
        run.pool.submit(snapshot.run_flow_worker, spec),
        run.pool.submit(snapshot.run_producer, spec),
    ]
    samples: list[dict[str, Any]] = []
    marks: dict[str, Any] = {}
    holder: snapshot.Holder | None = None
    try:
        time.sleep(max(0.0, origin - time.time()))
        marks["baseline"] = run.env.snapshot()
        for k in range(1, n_all + 1):
            time.sleep(max(0.0, origin + k * window - time.time()))
            if k == n_base:
                marks["baseline_end"] = run.env.snapshot()
            if k == n_all - n_tail:
                marks["tail"] = run.env.snapshot()
            if k == n_all:
                marks["end"] = run.env.snapshot()
            taken = snapshot.sample(run.env.url, holder.pid if holder else None)
            taken.update(t=round(k * window, 1), held=holder is not None)
            samples.append(taken)
            dead = ", ".join(f"{t} {v['dead']:,}" for t, v in taken["tables"].items())
            say(f"  t={k * window:5.0f}s {'held' if holder else 'base'}: dead tuples {dead}")
            if k == n_base:
                holder = snapshot.Holder(run.env.url)
                say(f"  snapshot taken (it counted {holder.counted:,} work items); held")
        at_release = snapshot.others(run.env.url)
    finally:
        if holder is not None:
            holder.release()
    worker, producer = (f.result() for f in futures)
    run.error("held snapshot: worker", worker.error_samples, worker.errors)
    run.error("held snapshot: producer", producer.error_samples, producer.errors)
    if samples[-1].get("holder", {}).get("state") == "gone":
        run.error("held snapshot", ["the holding session ended before the release"], 1)

    def per(values: list[Any], i: int, empty: Any) -> Any:
        return values[i] if i < len(values) else empty

    rows = []
    for i, taken in enumerate(samples):
        ms = [v * 1000 for v in per(worker.acquire_s, i, [])]
        rows.append(
            {
                "t": taken["t"],
                "held": taken["held"],
                "items_s": round(per(worker.items, i, 0) / window),
                "enqueued_s": round(per(producer.items, i, 0) / window),
                "fewest_ready": per(producer.low_ready, i, -1),
                "acquires": len(ms),
                "empty_acquires": per(worker.empty, i, 0),
                "acquire_p50_ms": round(percentile(ms, 50), 2),
                "acquire_p99_ms": round(percentile(ms, 99), 2),
                "dead": {t: v["dead"] for t, v in taken["tables"].items()},
                "live": {t: v["live"] for t, v in taken["tables"].items()},
                "mb": {t: v["mb"] for t, v in taken["tables"].items()},
                **({"holder": taken["holder"]} if "holder" in taken else {}),
            }
        )
        say(
            f"  t={taken['t']:5.0f}s {'held' if taken['held'] else 'base'}:"
            f" {rows[-1]['items_s']:,} items/s, acquire p50 {rows[-1]['acquire_p50_ms']:.2f} ms"
            f" p99 {rows[-1]['acquire_p99_ms']:.2f} ms ({len(ms):,} acquires,"
            f" {rows[-1]['empty_acquires']} empty), fewest ready {rows[-1]['fewest_ready']:,}"
        )
    base_ms = [v * 1000 for w in worker.acquire_s[:n_base] for v in w]
    end_ms = [v * 1000 for w in worker.acquire_s[n_all - n_tail : n_all] for v in w]
    base_rate = sum(worker.items[:n_base]) / baseline
    end_rate = sum(worker.items[n_all - n_tail : n_all]) / tail
    base_load = marks["baseline"].until(marks["baseline_end"], cores=run.env.cores)
    end_load = marks["tail"].until(marks["end"], cores=run.env.cores)
    run.account("held snapshot: baseline", base_load, base_load.bench)
    run.account("held snapshot: end of the hold", end_load, end_load.bench)
    before = f"the {snapshot.describe(baseline)} before the hold"
    last = f"the last {snapshot.describe(tail)} of a {snapshot.describe(hold)} hold"
    for key, label, unit, value, load in (
        ("items_s_base", f"SDK Worker items/s, {before}", "items/s", base_rate, base_load),
        ("items_s_end", f"SDK Worker items/s, {last}", "items/s", end_rate, end_load),
        ("acquire_p50_ms_base", f"acquire p50, {before}", "ms", percentile(base_ms, 50), base_load),
        ("acquire_p50_ms_end", f"acquire p50, {last}", "ms", percentile(end_ms, 50), end_load),
        ("acquire_p99_ms_base", f"acquire p99, {before}", "ms", percentile(base_ms, 99), base_load),
        ("acquire_p99_ms_end", f"acquire p99, {last}", "ms", percentile(end_ms, 99), end_load),
    ):
        run.figure(f"held_snapshot_{key}", f"held snapshot: {label}", unit, value, load=load)

    def ratio(a: float, b: float) -> float | None:
        return round(a / b, 3) if b else None

    run.extra["held_snapshot"] = {
        "snapshot": "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM work_items;",
        "work_items_counted": holder.counted if holder else None,
        "flow": f"SDK Worker (threads), {snapshot.SLOTS} slots, no-op handler; a producer"
        f" keeping about {snapshot.READY_TARGET:,} items ready with batches of"
        f" {snapshot.ENQUEUE_BATCH}; server {run.env.mode}",
        "acquire_latency": snapshot.ACQUIRE_MEASURE,
        "window_s": window,
        "baseline_s": baseline,
        "hold_s": hold,
        "end_s": tail,
        "items_s": {
            "baseline": round(base_rate),
            "end": round(end_rate),
            "ratio": ratio(end_rate, base_rate),
            "target": ">= 0.9",
        },
        "acquire_p99_ms": {
            "baseline": round(percentile(base_ms, 99), 2),
            "end": round(percentile(end_ms, 99), 2),
            "ratio": ratio(percentile(end_ms, 99), percentile(base_ms, 99)),
            "target": "<= 2",
        },
        "acquire_p50_ms": {
            "baseline": round(percentile(base_ms, 50), 2),
            "end": round(percentile(end_ms, 50), 2),
        },
        "windows": rows,
        "at_release": {
            "tables": samples[-1]["tables"],
            "other_tables_most_dead": at_release,
            "holder": samples[-1].get("holder"),
        },
    }
    items, p99 = run.extra["held_snapshot"]["items_s"], run.extra["held_snapshot"]["acquire_p99_ms"]
    say(
        f"  items/s {items['baseline']:,} before, {items['end']:,} in {last}: {items['ratio']}x"
        f" (target >= 0.9x); acquire p99 {p99['baseline']} -> {p99['end']} ms: {p99['ratio']}x"
        " (target <= 2x)"
    )


def _machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "memory_gb": round(mem / 2**30, 1),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def _warm(seconds: float) -> float:
    time.sleep(seconds)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(Path(__file__).parent), "describe", "--always", "--dirty"],
            capture_output=True, text=True, check=True, timeout=10,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a smoke run, under a minute")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default 2, quick 1)")
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="server worker processes for the single-mode phases (default 1); with `modes`,"
        " the lease cycles and the SDK workers also run under serve's default (one per core)",
    )
    parser.add_argument(
        "--client-procs", type=int, default=2, help="load-generator processes for 4+ workers"
    )
    parser.add_argument("--no-profile", action="store_true", help="skip the py-spy phases")
    parser.add_argument(
        "--hold-minutes",
        type=float,
        default=None,
        help="how long the held-snapshot phase holds its snapshot (default 2; quick 1/3);"
        " from 30 minutes on, its end is the last 10 minutes instead of the last 30 s",
    )
    parser.add_argument(
        "--only",
        default="pgbench,peer,cycles,workers,modes,enqueue,txenqueue,wake,profile,cost,flow,churn,"
        "held-snapshot",
        help="comma-separated phases to run (`modes`: cycles and SDK workers in both modes;"
        " `procrastinate`: its worker beside `work`, not in the default)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "latest", help="results path stem")
    parser.add_argument("--keep", action="store_true", help="keep the temporary data directory")
    args = parser.parse_args(argv)
    plan = make_plan(args)
    phases = set(args.only.split(","))
    both = "modes" in phases and bool(phases & {"cycles", "workers"})
    single = f"w{args.workers}"
    RESULTS.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    machine = _machine()
    say(f"plan: {plan}")
    ctx = get_context("spawn")
    steps: dict[str, float] = {}
    peak: dict[str, int] = {}
    modes: dict[str, str] = {}

    def step(run: Run, name: str, fn: Any) -> None:
        if name in phases:
            began = time.time()
            fn(run)
            steps[f"{name} [{run.mode}]" if run.mode else name] = round(time.time() - began, 1)

    with ProcessPoolExecutor(max_workers=max(2, args.client_procs), mp_context=ctx) as pool:
        # The load generators start while PostgreSQL and the server do.
        warming = [pool.submit(_warm, 1.0) for _ in range(max(2, args.client_procs))]
        # The server's default mode first: its phases run before the history-heavy ones.
        with environment(server_workers=None if both else args.workers, keep=args.keep) as env:
            for f in warming:
                f.result()
            steps["start"] = round(time.time() - t0, 1)
            run = Run(env=env, plan=plan, pool=pool, client_procs=args.client_procs)
            say(f"batch completion route: {'present' if env.batch_completion_route else 'absent'}")
            step(run, "pgbench", phase_pgbench)
            step(run, "peer", phase_peer)
            if both:
                run.mode = DEFAULT
                modes[DEFAULT] = env.mode
                step(run, "cycles", phase_rest_cycles)
                step(run, "workers", phase_sdk_workers)
                peak[DEFAULT] = env.peak_rss()
                began = time.time()
                env.restart_server(args.workers)
                steps["restart"] = round(time.time() - began, 1)
            run.mode = single
            modes[single] = env.mode
            step(run, "cycles", phase_rest_cycles)
            step(run, "workers", phase_workers)
            run.mode = ""
            for name, fn in (
                ("enqueue", phase_enqueue),
                ("txenqueue", phase_tx_enqueue),
                ("wake", phase_wake),
                ("profile", phase_profile),
                ("cost", phase_cost_growth),
                ("flow", phase_flow),
                ("churn", phase_churn),
                # Last: the snapshot holds back vacuum everywhere, and the autovacuum after
                # its release would weigh on any phase that came next.
                ("held-snapshot", phase_held_snapshot),
            ):
                step(run, name, fn)
            peak[single] = env.peak_rss()
            doc = report.build(
                run_figures=run.figures,
                cpu=run.cpu,
                extra={**run.extra, "step_wall_s": steps},
                errors=run.errors,
                machine=machine,
                config={
                    "quick": args.quick,
                    "reps": plan.reps,
                    "server_workers": args.workers,
                    "modes": modes,
                    "single_mode": single,
                    "client_procs": args.client_procs,
                    "scale": os.environ.get("BENCH_SCALE", "default"),
                    "plan": plan.__dict__,
                    "batch_completion_route": env.batch_completion_route,
                    "postgres": env.sql("SHOW server_version")[0][0],
                    "commit": _commit(),
                    "started_at": datetime.fromtimestamp(t0, UTC).strftime("%Y-%m-%d %H:%M UTC"),
                },
                peak_rss=peak,
                wall=time.time() - t0,
            )
    json_path = args.out.with_suffix(".json")
    md_path = args.out.with_suffix(".md")
    json_path.write_text(json.dumps(doc, indent=2) + "\n")
    md_path.write_text(report.markdown(doc))
    say(f"done in {time.time() - t0:.0f}s: {json_path} and {md_path}")
    print(report.markdown(doc))
    return 0 if not run.errors else 1
