"""The peer: pgqueuer (a Python library talking to PostgreSQL directly, no HTTP).

Runs in load-generator processes against its own database on the same server.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg
import uvloop
from pgqueuer.db import PsycopgDriver
from pgqueuer.models import Job
from pgqueuer.qm import QueueManager
from pgqueuer.queries import Queries
from pgqueuer.types import QueueExecutionMode

DATABASE = "pgqueuer_peer"
ENTRYPOINT = "bench"


def _cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _connect(url: str) -> psycopg.AsyncConnection[tuple[Any, ...]]:
    return await psycopg.AsyncConnection.connect(url, autocommit=True)


async def _install(url: str) -> None:
    async with await _connect(url) as conn:
        await Queries(PsycopgDriver(conn)).install()


def install(url: str) -> None:
    uvloop.run(_install(url))


async def _reset(url: str, jobs: int) -> None:
    async with await _connect(url) as conn:
        queries = Queries(PsycopgDriver(conn))
        await queries.clear_queue()
        await queries.clear_queue_log()
        await conn.execute("VACUUM ANALYZE pgqueuer")
        for start in range(0, jobs, 5000):
            n = min(5000, jobs - start)
            await queries.enqueue([ENTRYPOINT] * n, [b"{}"] * n, [0] * n)
        await conn.execute("ANALYZE pgqueuer")


def reset(url: str, jobs: int) -> None:
    """Empty the queue, then fill it with `jobs` ready jobs."""
    uvloop.run(_reset(url, jobs))


@dataclass(frozen=True)
class PeerSpec:
    url: str
    start_at: float
    end_at: float
    batch_size: int = 10
    managers: int = 1
    producers: int = 4
    enqueue_batch: int = 500


@dataclass
class PeerResult:
    jobs: int
    elapsed: float
    cpu: float
    wall: float = 0.0  # from the agreed start until every consumer returned (or the deadline)


async def _dequeue(spec: PeerSpec) -> PeerResult:
    """`managers` QueueManagers, each on its own connection, in drain mode, in one process."""
    logging.getLogger("pgqueuer").setLevel(logging.WARNING)
    done = 0
    first = 0.0
    last = 0.0
    conns = [await _connect(spec.url) for _ in range(spec.managers)]
    managers = [QueueManager(Queries(PsycopgDriver(conn))) for conn in conns]
    for qm in managers:

        @qm.entrypoint(ENTRYPOINT)
        async def handle(job: Job) -> None:
            nonlocal done, first, last
            done += 1
            last = time.time()
            if not first:
                first = last

    async def stop() -> None:
        await asyncio.sleep(max(0.0, spec.end_at - time.time()))
        for qm in managers:
            qm.shutdown.set()

    delay = spec.start_at - time.time()
    if delay > 0:
        await asyncio.sleep(delay)
    cpu0 = _cpu_self()
    stopper = asyncio.create_task(stop())
    await asyncio.gather(
        # With the queue empty, drain mode re-checks it after the dequeue timeout (30 s by
        # default); while work is ready it polls at once, so this only shortens the exit.
        *(
            qm.run(
                batch_size=spec.batch_size,
                mode=QueueExecutionMode.drain,
                dequeue_timeout=timedelta(seconds=1),
            )
            for qm in managers
        )
    )
    finished = min(time.time(), spec.end_at)
    stopper.cancel()
    for conn in conns:
        await conn.close()
    # Steady state: from the first job to the last; QueueManager's own start-up (schema
    # checks) and its drain-mode exit are not dequeue time. Wall time includes both.
    elapsed = last - first if first else 0.0
    return PeerResult(
        jobs=max(0, done - 1),
        elapsed=elapsed,
        cpu=_cpu_self() - cpu0,
        wall=done / (finished - spec.start_at) if finished > spec.start_at else 0.0,
    )


def run_dequeue(spec: PeerSpec) -> PeerResult:
    """QueueManager consumers (dequeue + ack), no-op job, until the queue is empty or the deadline."""
    return uvloop.run(_dequeue(spec))


async def _enqueue(spec: PeerSpec) -> PeerResult:
    done = 0

    async def producer() -> None:
        nonlocal done
        async with await _connect(spec.url) as conn:
            queries = Queries(PsycopgDriver(conn))
            n = spec.enqueue_batch
            entrypoints = [ENTRYPOINT] * n
            payloads: list[bytes | None] = [b"{}"] * n
            priorities = [0] * n
            delay = spec.start_at - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            while time.time() < spec.end_at:
                await queries.enqueue(entrypoints, payloads, priorities)
                done += n

    cpu0 = _cpu_self()
    await asyncio.gather(*(producer() for _ in range(spec.producers)))
    elapsed = time.time() - spec.start_at
    return PeerResult(jobs=done, elapsed=elapsed, cpu=_cpu_self() - cpu0)


def run_enqueue(spec: PeerSpec) -> PeerResult:
    """`producers` connections each enqueueing batches of `enqueue_batch` until the deadline."""
    return uvloop.run(_enqueue(spec))
