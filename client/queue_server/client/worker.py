"""The worker helper (threads): acquire, run a handler per item, heartbeat, then complete on
success or triage on failure; the asyncio twin is `queue_server.client.AsyncWorker`.

Both are faces of one implementation, `queue_server.client.worker_core`: its loops
decide everything (slots, the batched acquire, the outbox, heartbeats, lease loss,
shutdown). Here each loop runs on a thread and its steps are performed blocking:
a client call sent, a `threading.Condition` waited on, the handler called.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, TypeVar, Unpack

from queue_server.client.client import QueueClient
from queue_server.client.core import Call
from queue_server.client.models import Lease
from queue_server.client.tracing import current
from queue_server.client.worker_core import HeldJob, Run, Steps, Wait, WorkerCore, WorkerOptions
from queue_server.client.working import (
    Outcome,
    Quarantine,
    Requeue,
    Result,
    TransientError,
    default_worker_name,
)

__all__ = [
    "Handler",
    "Job",
    "Outcome",
    "Quarantine",
    "Requeue",
    "Result",
    "TransientError",
    "Worker",
    "default_worker_name",
]

log = logging.getLogger(__name__)

T = TypeVar("T")


# Guards every `Flag`'s flag and the making of its condition (held for a few bytecodes).
_FLAGS = threading.Lock()


class Flag(threading.Event):
    """A `threading.Event` whose condition is made when someone first waits on it.

    A job has three events and most are only set or read, never waited on; making three
    conditions (each with its lock) was a tenth of a no-op item's CPU in the thread worker.
    """

    def __init__(self) -> None:  # no condition yet: `threading.Event.__init__` makes one
        self._flag = False
        self._waitable: threading.Condition | None = None

    def _condition(self) -> threading.Condition:
        with _FLAGS:
            if self._waitable is None:
                self._waitable = threading.Condition(threading.Lock())
            return self._waitable

    def set(self) -> None:
        # The flag and the condition are read together: a waiter made its condition before
        # it looked at the flag, so it either sees the flag or is woken here.
        with _FLAGS:
            self._flag = True
            waitable = self._waitable
        if waitable is not None:
            with waitable:
                waitable.notify_all()

    def clear(self) -> None:
        with _FLAGS:
            self._flag = False

    def wait(self, timeout: float | None = None) -> bool:
        if self._flag:
            return True
        waitable = self._condition()
        with waitable:
            signaled: bool = self._flag
            if not signaled:
                signaled = waitable.wait(timeout)
            return signaled

    def _at_fork_reinit(self) -> None:
        self._waitable = None


@dataclass(eq=False)
class Job(HeldJob):
    """One leased item as a handler sees it."""

    stop: threading.Event = field(default_factory=Flag)
    lost: threading.Event = field(default_factory=Flag)
    done: threading.Event = field(default_factory=Flag, repr=False)

    def should_stop(self) -> bool:
        """True once the lease is lost or the worker is shutting down: stop and return."""
        return self.stop.is_set()


Handler = Callable[[Job], Any]


class Worker(WorkerCore[Job]):
    """Runs `handler` for each leased item of `queue`, up to `concurrency` at once.

    The number of leases held never exceeds the queue's concurrency limit (read
    from the server, refreshed every `limit_refresh` seconds). `prefetch` is how
    many leases may wait for a free slot: None sizes it to the pace (one acquire
    round trip's worth of items; none for a slow handler).

    Example::

        def handler(job: Job) -> dict:
            return {"sent": job.payload["to"]}

        Worker(client, "emails", handler, concurrency=8).run()
    """

    _job = Job
    _log = log
    # A slot thread outlives whatever its item raised: the item is given up as lost.
    _survives = (BaseException,)

    def __init__(
        self,
        client: QueueClient,
        queue: str,
        handler: Handler,
        **options: Unpack[WorkerOptions],
    ) -> None:
        self.client = client
        self.stopping = threading.Event()
        super().__init__(client, queue, handler, **options)
        self._threads: list[threading.Thread] = []

    def _new_lock(self) -> threading.RLock:
        return threading.RLock()

    def _new_signal(self, lock: Any) -> threading.Condition:
        return threading.Condition(lock)

    def _drive(self, steps: Steps[T]) -> T:
        """Perform each step of a loop, blocking; a step's failure is thrown into the loop."""
        send, handler = self.client._send, self.handler
        answer: Any = None
        failure: BaseException | None = None
        while True:
            try:
                step = steps.send(answer) if failure is None else steps.throw(failure)
            except StopIteration as done:
                result: T = done.value
                return result
            answer = failure = None
            try:
                if type(step) is Call:
                    answer = send(step)
                elif type(step) is Wait:
                    step.on.wait(step.timeout)
                else:
                    assert isinstance(step, Run)
                    if step.span is None:  # no span to make current: most items
                        answer = handler(step.job)
                    else:
                        with current(self.spans, step.span):
                            answer = handler(step.job)
            except BaseException as exc:  # the loop decides what survives
                failure = exc

    def _thread(self, steps: Steps[None], name: str) -> threading.Thread:
        thread = threading.Thread(target=self._drive, args=(steps,), name=name, daemon=True)
        thread.start()
        return thread

    # -- one item ------------------------------------------------------------

    def process(self, lease: Lease) -> Result:
        """Run the handler for one lease with heartbeats; submit its outcome unless lost."""
        with self._services():
            return self._drive(self._process(lease))

    # -- the loop ------------------------------------------------------------

    def limit(self) -> int:
        """How many items may run at once: ours, capped by the queue's concurrency limit.

        The queue's own limit (`queue_limit`) also caps the leases held, prefetched ones included.
        """
        return self._drive(self._read_limit())

    def run(
        self,
        *,
        max_items: int | None = None,
        drain: bool = False,
        grace: float | None = None,
        handle_signals: bool = True,
    ) -> int:
        """Work until `stop()` (or `max_items` handled, or, with `drain`, nothing is due).

        On stop, no new lease is taken and waiting ones are given back; running
        handlers get `grace` seconds (None: as long as they need), then are told
        to stop. With `handle_signals` (and on the main thread), SIGINT and SIGTERM
        stop gracefully and a second one stops the handlers at once. Returns the
        number of items whose handler ran.
        """
        with self._signals(handle_signals), self._services():
            self._start()
            slots = [self._thread(self._slot(), f"job-{n}") for n in range(self.concurrency)]
            try:
                self._drive(self._acquire_loop(max_items, drain))
            finally:
                self._shutdown(slots, grace)
        return self._started

    def _shutdown(self, slots: list[threading.Thread], grace: float | None) -> None:
        self._close_intake()
        deadline = None if grace is None else time.monotonic() + grace
        for thread in slots:
            while thread.is_alive():
                if deadline is not None and time.monotonic() >= deadline:
                    self._past_grace()
                    deadline = None
                thread.join(0.05 if deadline is not None else 0.5)

    @contextlib.contextmanager
    def _services(self) -> Iterator[None]:
        """The outbox and the heartbeat threads, while anyone needs them."""
        if self._open_services():
            self._threads = [
                self._thread(self._outbox(), "outbox"),
                self._thread(self._heartbeats(), "heartbeats"),
            ]
        try:
            yield
        finally:
            if self._close_services():
                for thread in self._threads:
                    thread.join()

    @contextlib.contextmanager
    def _signals(self, enabled: bool) -> Iterator[None]:
        if not enabled or threading.current_thread() is not threading.main_thread():
            yield
            return
        count = [0]

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            count[0] += 1
            self._signalled(count[0], signum)

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
