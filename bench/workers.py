"""What users run, timed from a separate process: the SDK workers (threads and asyncio),
`queue-server work -- true`, a bare loop around `true`, the spawn floor (threads running
`true` with no queue) and procrastinate's worker.

Each runs in a load-generator process over a prefilled queue until its deadline or
until the queue is empty, and reports its first and last finished item (steady
state) as well as its wall time from the agreed start.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import resource
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import uvloop

from queue_server.client import (
    AsyncJob,
    AsyncQueueClient,
    AsyncWorker,
    Job,
    Outcome,
    QueueClient,
    Result,
    Worker,
)

TRUE = "/bin/true" if os.path.exists("/bin/true") else "true"
PROCRASTINATE_DATABASE = "procrastinate_peer"
PROCRASTINATE_QUEUE = "bench"


def _cpu() -> float:
    """CPU of this process and of every child it has waited for (commands, the CLI)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@dataclass(frozen=True)
class WorkerSpec:
    kind: str  # thread | async | cli | loop | spawn | procrastinate
    slots: int
    start_at: float
    end_at: float
    base_url: str = ""
    key: str = ""
    queue: str = "q"
    cli: str = "queue-server"
    database_url: str = ""


@dataclass
class WorkerResult:
    items: int = 0
    first: float = 0.0
    last: float = 0.0
    finished: float = 0.0
    cpu: float = 0.0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)

    def done(self, at: float) -> None:
        self.items += 1
        self.first = self.first or at
        self.last = at

    def error(self, text: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(text[:300])

    def steady(self) -> float:
        """Items per second from the first finished item to the last."""
        span = self.last - self.first
        return (self.items - 1) / span if self.items > 1 and span > 0 else 0.0

    def wall(self, start_at: float) -> float:
        """Items per second from the agreed start to the end (drained, or the deadline)."""
        span = self.finished - start_at
        return self.items / span if span > 0 else 0.0


def _sleep_until(at: float) -> None:
    time.sleep(max(0.0, at - time.time()))


def _record(result: WorkerResult) -> Any:
    def on_result(r: Result) -> None:
        if r.outcome is Outcome.COMPLETED:
            result.done(time.time())
        else:
            result.error(f"{r.outcome}: {r.detail}")

    return on_result


def _thread(spec: WorkerSpec, result: WorkerResult) -> None:
    def noop(job: Job) -> None:
        return None

    with QueueClient(spec.base_url, spec.key) as qs:
        worker = Worker(
            qs, spec.queue, noop, concurrency=spec.slots, wait=0, on_result=_record(result)
        )
        timer = threading.Timer(max(0.0, spec.end_at - time.time()), worker.stop)
        timer.start()
        try:
            worker.run(drain=True, handle_signals=False)
        finally:
            timer.cancel()


def _async(spec: WorkerSpec, result: WorkerResult) -> None:
    async def noop(job: AsyncJob) -> None:
        return None

    async def main() -> None:
        async with AsyncQueueClient(spec.base_url, spec.key) as qs:
            worker = AsyncWorker(
                qs, spec.queue, noop, concurrency=spec.slots, wait=0, on_result=_record(result)
            )
            loop = asyncio.get_running_loop()
            timer = loop.call_later(max(0.0, spec.end_at - time.time()), worker.stop)
            try:
                await worker.run(drain=True, handle_signals=False)
            finally:
                timer.cancel()

    uvloop.run(main())


def _cli(spec: WorkerSpec, result: WorkerResult) -> None:
    env = {**os.environ, "QUEUE_SERVER_URL": spec.base_url, "QUEUE_SERVER_KEY": spec.key}
    command = [spec.cli, "work", spec.queue, "--concurrency", str(spec.slots)]
    command += ["--drain", "--wait", "0", "--json", "--", TRUE]
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    stopped = threading.Event()

    def stop() -> None:
        stopped.set()
        proc.terminate()

    timer = threading.Timer(max(0.0, spec.end_at - time.time()), stop)
    timer.start()
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            outcome = json.loads(line)["outcome"]
            if outcome == "completed":
                result.done(time.time())
            else:
                result.error(line.decode()[:300])
    finally:
        timer.cancel()
        _, stderr = proc.communicate()
    # Stopped at the deadline before the queue ran dry: not a failure of the worker.
    if proc.returncode != 0 and not stopped.is_set():
        result.error(f"exit {proc.returncode}: {stderr.decode()[-300:]}")


def _loop(spec: WorkerSpec, result: WorkerResult) -> None:
    """The simplest worker one could write: one acquire, one `true`, one complete per item."""
    with QueueClient(spec.base_url, spec.key) as qs:
        while time.time() < spec.end_at:
            leases = qs.acquire(spec.queue, worker="bare-loop", lease_ttl=30)
            if not leases:
                break
            (lease,) = leases
            subprocess.run([TRUE], input=json.dumps(lease.payload).encode(), check=True)
            qs.complete(lease.item_id, worker="bare-loop", fence=lease.fence, result=None)
            result.done(time.time())


def _spawn(spec: WorkerSpec, result: WorkerResult) -> None:
    """The physical limit of `work -- true`: `slots` threads each running `true` in a loop,
    no queue at all, the command's stdin, stdout and stderr piped as `work` pipes them."""
    payload = b'{"n": 1}'
    lock = threading.Lock()

    def spawner() -> None:
        while time.time() < spec.end_at:
            subprocess.run([TRUE], input=payload, capture_output=True, check=True)
            with lock:
                result.done(time.time())

    threads = [threading.Thread(target=spawner, daemon=True) for _ in range(spec.slots)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


# -- procrastinate -------------------------------------------------------------


def _procrastinate_app(url: str) -> Any:
    import procrastinate

    return procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))


async def _procrastinate_reset(url: str, jobs: int) -> None:
    import psycopg

    app = _procrastinate_app(url)
    async with app.open_async():
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            exists = await (
                await conn.execute("SELECT to_regclass('procrastinate_jobs') IS NOT NULL")
            ).fetchone()
            if not (exists and exists[0]):
                await app.schema_manager.apply_schema_async()
            await conn.execute("TRUNCATE procrastinate_jobs CASCADE")

        @app.task(name="noop", queue=PROCRASTINATE_QUEUE)
        async def noop() -> None:
            return None

        for start in range(0, jobs, 1000):
            await noop.batch_defer_async(*([{}] * min(1000, jobs - start)))
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute("VACUUM ANALYZE procrastinate_jobs")


def procrastinate_reset(url: str, jobs: int) -> None:
    """Install procrastinate's schema if needed, empty it, then defer `jobs` no-op jobs."""
    uvloop.run(_procrastinate_reset(url, jobs))


def _procrastinate(spec: WorkerSpec, result: WorkerResult) -> None:
    logging.getLogger("procrastinate").setLevel(logging.WARNING)
    app = _procrastinate_app(spec.database_url)

    @app.task(name="noop", queue=PROCRASTINATE_QUEUE)
    async def noop() -> None:
        result.done(time.time())

    async def main() -> None:
        async with app.open_async():
            worker = asyncio.create_task(
                app.run_worker_async(
                    queues=[PROCRASTINATE_QUEUE],
                    concurrency=spec.slots,
                    wait=False,
                    install_signal_handlers=False,
                )
            )
            done, _ = await asyncio.wait([worker], timeout=max(0.0, spec.end_at - time.time()))
            if not done:
                worker.cancel()
                await asyncio.gather(worker, return_exceptions=True)

    uvloop.run(main())


KINDS = {
    "thread": _thread,
    "async": _async,
    "cli": _cli,
    "loop": _loop,
    "spawn": _spawn,
    "procrastinate": _procrastinate,
}


def run_worker(spec: WorkerSpec) -> WorkerResult:
    """One worker of `spec.kind` from the agreed start until its deadline or an empty queue."""
    result = WorkerResult()
    _sleep_until(spec.start_at)
    cpu0 = _cpu()
    try:
        KINDS[spec.kind](spec, result)
    except Exception as exc:
        result.error(f"{type(exc).__name__}: {exc}")
    result.finished = min(time.time(), spec.end_at)
    result.cpu = _cpu() - cpu0
    return result
