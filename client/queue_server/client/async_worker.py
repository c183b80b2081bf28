"""The worker helper for asyncio: `Worker`'s twin on `AsyncQueueClient`, with async handlers.

Both are faces of one implementation, `queue_server.client.worker_core`, so the
behaviour is the thread worker's: freed slots take the next waiting lease at
once, acquires ask for every free slot plus a pace-sized prefetch in one call,
outcomes of concurrent handlers go out together within `linger` seconds (each
entry fenced, under its own key), one request extends every held lease, and a
refused heartbeat stops the handler (`job.stop`) and drops its result. Here each
loop is a task and its steps are awaited.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import signal
import threading
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar, Unpack

from queue_server.client.async_client import AsyncQueueClient
from queue_server.client.core import Call
from queue_server.client.models import Lease
from queue_server.client.tracing import current
from queue_server.client.worker_core import HeldJob, Run, Steps, Wait, WorkerCore, WorkerOptions
from queue_server.client.working import Result

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(eq=False)
class AsyncJob(HeldJob):
    """One leased item as an async handler sees it; `await job.stop.wait()` works."""

    stop: asyncio.Event = field(default_factory=asyncio.Event)
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def should_stop(self) -> bool:
        """True once the lease is lost or the worker is shutting down: stop and return."""
        return self.stop.is_set()


AsyncHandler = Callable[[AsyncJob], Awaitable[Any] | Any]


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class _Signal:
    """`threading.Condition`'s notify for tasks of one loop: each waiter is a future."""

    def __init__(self) -> None:
        self._waiters: deque[asyncio.Future[None]] = deque()

    def wait(self) -> asyncio.Future[None]:
        while self._waiters and self._waiters[0].done():
            self._waiters.popleft()  # timed out
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        return waiter

    async def wait_at_most(self, timeout: float) -> None:
        """Until notified or `timeout` seconds: a timer on the waiter's future, not a task
        (`asyncio.wait_for` makes one per wait: the outbox and the acquirer wait often)."""
        waiter = self.wait()
        timer = asyncio.get_running_loop().call_later(timeout, _expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()

    def notify(self, n: int = 1) -> None:
        while n > 0 and self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                n -= 1

    def notify_all(self) -> None:
        self.notify(len(self._waiters))


class AsyncWorker(WorkerCore[AsyncJob]):
    """Runs `handler` (a coroutine function) for each leased item, up to `concurrency` at once.

    The options mean what they mean for `Worker`.

    Example::

        async def handler(job: AsyncJob) -> dict:
            return {"sent": job.payload["to"]}

        await AsyncWorker(client, "emails", handler, concurrency=8).run()
    """

    _job = AsyncJob
    _log = log

    def __init__(
        self,
        client: AsyncQueueClient,
        queue: str,
        handler: AsyncHandler,
        **options: Unpack[WorkerOptions],
    ) -> None:
        self.client = client
        self.stopping = asyncio.Event()
        super().__init__(client, queue, handler, **options)
        self._tasks: list[asyncio.Task[None]] = []

    def _new_lock(self) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()  # a step runs to its next yield uninterrupted

    def _new_signal(self, lock: Any) -> _Signal:
        return _Signal()

    async def _drive(self, steps: Steps[T]) -> T:
        """Perform each step of a loop, awaited; a step's failure is thrown into the loop."""
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
                    answer = await send(step)
                elif type(step) is Wait:
                    if step.timeout is None:
                        await step.on.wait()
                    elif type(step.on) is _Signal:
                        await step.on.wait_at_most(step.timeout)
                    else:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(step.on.wait(), step.timeout)
                else:
                    assert isinstance(step, Run)
                    if step.span is None:  # no span to make current: most items
                        answer = handler(step.job)
                        if inspect.isawaitable(answer):
                            answer = await answer
                    else:
                        with current(self.spans, step.span):
                            answer = handler(step.job)
                            if inspect.isawaitable(answer):
                                answer = await answer
            except BaseException as exc:  # the loop decides what survives
                failure = exc

    # -- one item ------------------------------------------------------------

    async def process(self, lease: Lease) -> Result:
        """Run the handler for one lease with heartbeats; submit its outcome unless lost."""
        async with self._services():
            return await self._drive(self._process(lease))

    # -- the loop ------------------------------------------------------------

    async def limit(self) -> int:
        """How many items may run at once: ours, capped by the queue's concurrency limit.

        The queue's own limit (`queue_limit`) also caps the leases held, prefetched ones included.
        """
        return await self._drive(self._read_limit())

    async def run(
        self,
        *,
        max_items: int | None = None,
        drain: bool = False,
        grace: float | None = None,
        handle_signals: bool = True,
    ) -> int:
        """Work until `stop()` (or `max_items` handled, or, with `drain`, nothing is due).

        As `Worker.run`: on stop, waiting leases are given back and running
        handlers get `grace` seconds; SIGINT/SIGTERM stop gracefully when
        `handle_signals` (main thread only), a second signal at once.
        """
        async with self._signals(handle_signals), self._services():
            self._start()
            slots = [
                asyncio.create_task(self._drive(self._slot())) for _ in range(self.concurrency)
            ]
            try:
                await self._drive(self._acquire_loop(max_items, drain))
            finally:
                await self._shutdown(slots, grace)
        return self._started

    async def _shutdown(self, slots: list[asyncio.Task[None]], grace: float | None) -> None:
        self._close_intake()
        _, pending = await asyncio.wait(slots, timeout=grace)
        if pending:
            self._past_grace()
            await asyncio.wait(pending)

    @contextlib.asynccontextmanager
    async def _services(self) -> AsyncIterator[None]:
        """The outbox and heartbeat tasks, while anyone needs them."""
        if self._open_services():
            self._tasks = [
                asyncio.create_task(self._drive(self._outbox())),
                asyncio.create_task(self._drive(self._heartbeats())),
            ]
        try:
            yield
        finally:
            if self._close_services():
                for task in self._tasks:
                    await task

    @contextlib.asynccontextmanager
    async def _signals(self, enabled: bool) -> AsyncIterator[None]:
        if not enabled or threading.current_thread() is not threading.main_thread():
            yield
            return
        loop = asyncio.get_running_loop()
        count = [0]

        def on_signal(signum: int) -> None:
            count[0] += 1
            self._signalled(count[0], signum)

        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        for signum in previous:
            loop.add_signal_handler(signum, on_signal, signum)
        try:
            yield
        finally:
            for signum, handler in previous.items():
                loop.remove_signal_handler(signum)
                if handler is not None:
                    signal.signal(signum, handler)
