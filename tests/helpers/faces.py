"""Both worker faces behind one interface, so each behaviour test runs against `Worker` and
`AsyncWorker` alike: a bug planted in either face, or in their shared core, fails it.

The asyncio face runs its worker on an event loop of its own thread; a test's handler
is written once, blocking, and the asyncio face runs it with `asyncio.to_thread` (its
event loop stays free for heartbeats and the outbox, as with a real async handler).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

from queue_server.client import (
    AsyncJob,
    AsyncQueueClient,
    AsyncWorker,
    Job,
    QueueClient,
    Result,
    Worker,
)
from queue_server.client.models import Lease
from tests.helpers.api import Api

T = TypeVar("T")

AnyJob = Job | AsyncJob
Handler = Callable[[Any], Any]


class FaceWorker(Protocol):
    def run(
        self,
        *,
        max_items: int | None = None,
        drain: bool = False,
        grace: float | None = None,
        handle_signals: bool = True,
    ) -> int: ...

    def process(self, lease: Lease) -> Result: ...

    def stop(self) -> None: ...

    def in_flight(self) -> int: ...


class Face(Protocol):
    name: str

    def worker(self, api: Api, queue: str, handler: Handler, **options: Any) -> FaceWorker: ...


def wait_for_stop(job: AnyJob, timeout: float) -> bool:
    """A handler's wait for `job.stop`, the same on either face (from the handler's thread)."""
    deadline = time.monotonic() + timeout
    while not job.should_stop():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


class ThreadFace:
    name = "thread"

    def __init__(self) -> None:
        self.clients: list[QueueClient] = []

    def worker(self, api: Api, queue: str, handler: Handler, **options: Any) -> Worker:
        qs = QueueClient(api.url, api.keys["worker"], tenant=api.tenant)
        self.clients.append(qs)
        return Worker(qs, queue, handler, **options)

    def close(self) -> None:
        for qs in self.clients:
            qs.close()


class _OnLoop:
    """An `AsyncWorker` driven from other threads: each call runs on the face's loop."""

    def __init__(self, face: AsyncioFace, worker: AsyncWorker) -> None:
        self.face = face
        self.inner = worker

    def run(
        self,
        *,
        max_items: int | None = None,
        drain: bool = False,
        grace: float | None = None,
        handle_signals: bool = True,
    ) -> int:
        run = self.inner.run(
            max_items=max_items, drain=drain, grace=grace, handle_signals=handle_signals
        )
        return self.face.call(run)

    def process(self, lease: Lease) -> Result:
        return self.face.call(self.inner.process(lease))

    def stop(self) -> None:
        self.face.loop.call_soon_threadsafe(self.inner.stop)

    def in_flight(self) -> int:
        return self.inner.in_flight()


class AsyncioFace:
    name = "asyncio"

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.clients: list[AsyncQueueClient] = []

    def call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def worker(self, api: Api, queue: str, handler: Handler, **options: Any) -> _OnLoop:
        async def in_a_thread(job: AsyncJob) -> Any:
            return await asyncio.to_thread(handler, job)

        async def build() -> AsyncWorker:
            qs = AsyncQueueClient(api.url, api.keys["worker"], tenant=api.tenant)
            self.clients.append(qs)
            return AsyncWorker(qs, queue, in_a_thread, **options)

        return _OnLoop(self, self.call(build()))

    def close(self) -> None:
        for qs in self.clients:
            self.call(qs.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
