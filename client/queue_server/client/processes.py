"""Worker processes: one `Worker` per process, for handlers whose Python work would
otherwise share one process's interpreter lock.

    from functools import partial

    def make_worker(url: str, key: str) -> Worker:  # at module level: each process imports it
        return Worker(QueueClient(url, key), "thumbnails", resize, concurrency=8)

    run_in_processes(partial(make_worker, url, key), processes=4)

Each process is started fresh (spawn, never a fork of this one's threads and connections)
and builds its own client and worker with `make_worker`, so `make_worker` must be a
module-level function (or a `functools.partial` of one). The processes form a process group
of their own: SIGINT (Ctrl-C) and SIGTERM reach this process, which passes each on to every
worker once, and each worker stops as `Worker.run` does on a signal (no new lease, waiting
ones given back, running handlers finish; a second signal stops them at once).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from queue_server.client.worker import Worker

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def run_in_processes(
    make_worker: Callable[[], Worker],
    processes: int | None = None,
    *,
    drain: bool = False,
    grace: float | None = None,
) -> list[int]:
    """`make_worker().run(drain=drain, grace=grace)` in `processes` processes (None: one per
    CPU) until each returns; the number of items each one's handlers ran. Raises
    RuntimeError naming the processes that failed (the others still run to their end)."""
    count = processes if processes is not None else os.cpu_count() or 1
    if count < 1:
        raise ValueError("processes must be at least 1")
    context = multiprocessing.get_context("spawn")
    results: Any = context.SimpleQueue()
    # A child signalled before its handlers are in place would die of it: until it says it
    # is ready, it learns of a stop from `asked` instead.
    asked = context.Event()
    ready = [context.Event() for _ in range(count)]
    children = [
        context.Process(
            target=_work,
            args=(make_worker, drain, grace, results, n, asked, ready[n]),
            name=f"queue-server-worker-{n}",
        )
        for n in range(count)
    ]
    main = threading.current_thread() is threading.main_thread()

    def forward(signum: int, frame: FrameType | None) -> None:
        asked.set()
        for child, up in zip(children, ready, strict=True):
            if child.pid is not None and child.is_alive() and up.is_set():
                os.kill(child.pid, signum)

    previous = {s: signal.signal(s, forward) for s in _SIGNALS} if main else {}
    try:
        for child in children:
            child.start()
        for child in children:
            child.join()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    ran = dict(results.get() for _ in range(sum(c.exitcode == 0 for c in children)))
    failed = [c.name for c in children if c.exitcode != 0]
    if failed:
        raise RuntimeError(f"worker processes failed: {', '.join(failed)} (see their logs)")
    return [ran[n] for n in range(count)]


def _work(
    make_worker: Callable[[], Worker],
    drain: bool,
    grace: float | None,
    results: Any,
    n: int,
    asked: Any,
    ready: Any,
) -> None:
    """One process: out of the parent's process group (a terminal's Ctrl-C reaches the
    parent alone, which passes it on once), then its worker until it returns. A stop asked
    before the worker's own handlers are in place stops it as theirs would."""
    os.setpgid(0, 0)
    made: list[Worker] = []

    def early(signum: int, frame: FrameType | None) -> None:
        asked.set()
        for worker in made:
            worker.stop()

    for signum in _SIGNALS:
        signal.signal(signum, early)
    ready.set()
    made.append(make_worker())
    if asked.is_set():
        results.put((n, 0))
        return
    # `run` puts its own handlers in place, and starts nothing new once `stop()` was asked.
    results.put((n, made[0].run(drain=drain, grace=grace)))
