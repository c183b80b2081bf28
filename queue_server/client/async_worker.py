"""The worker helper for asyncio: `Worker`'s twin on `AsyncQueueClient`, with async handlers.

Same behaviour as the thread worker (`queue_server.client.worker`): freed slots
take the next waiting lease at once, acquires ask for every free slot plus a
pace-sized prefetch in one call, outcomes of concurrent handlers go out together
within `linger` seconds (each entry fenced, under its own key), one request
extends every held lease, and a refused heartbeat stops the handler
(`job.stop`) and drops its result.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import signal
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from queue_server.client import errors
from queue_server.client.async_client import AsyncQueueClient
from queue_server.client.models import Lease
from queue_server.client.working import (
    MAX_ACQUIRE,
    LeaseFacts,
    Pace,
    Result,
    Stage,
    Submission,
    batches,
    default_worker_name,
    give_back,
    is_lease_lost,
    lost,
    refuses_whole_batch,
    settled,
    verdict,
    want,
)
from queue_server.policy import ReliabilityPolicy, at_most, runtime_policy

log = logging.getLogger(__name__)


@dataclass(eq=False)
class AsyncJob(LeaseFacts):
    """One leased item as an async handler sees it; `await job.stop.wait()` works."""

    stop: asyncio.Event = field(default_factory=asyncio.Event)
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def should_stop(self) -> bool:
        """True once the lease is lost or the worker is shutting down: stop and return."""
        return self.stop.is_set()


AsyncHandler = Callable[[AsyncJob], Awaitable[Any] | Any]


class AsyncWorker:
    """Runs `handler` (a coroutine function) for each leased item, up to `concurrency` at once.

    The options mean what they mean for `Worker`.

    Example::

        async def handler(job: AsyncJob) -> dict:
            return {"sent": job.payload["to"]}

        await AsyncWorker(client, "emails", handler, concurrency=8).run()
    """

    def __init__(
        self,
        client: AsyncQueueClient,
        queue: str,
        handler: AsyncHandler,
        *,
        name: str | None = None,
        lease_ttl: float | None = None,
        heartbeat_fraction: float = 1 / 3,
        wait: float = 5.0,
        concurrency: int = 1,
        prefetch: int | None = None,
        linger: float = 0.002,
        max_batch: int = 100,
        limit_refresh: float = 10.0,
        on_result: Callable[[Result], None] | None = None,
        policy: ReliabilityPolicy | None = None,
    ) -> None:
        if not 0 < heartbeat_fraction < 1:
            raise ValueError("heartbeat_fraction must be between 0 and 1")
        if prefetch is not None and not 0 <= prefetch <= MAX_ACQUIRE:
            raise ValueError(f"prefetch must be between 0 and {MAX_ACQUIRE}")
        self.client = client
        self.queue = queue
        self.handler = handler
        self.name = name or default_worker_name()
        # Leased work runs under the loaded policy: the lease TTL is at most the class's
        # attempt timeout (the policy's when not given); above it is a PolicyError here.
        self.policy = policy or runtime_policy()
        leased = self.policy.leased_work
        self.lease_ttl: float = at_most(
            lease_ttl,
            leased.attempt_timeout,
            setting="lease_ttl",
            cell=leased.cell("attempt_timeout"),
        )
        self.heartbeat_interval = self.lease_ttl * heartbeat_fraction
        self.wait = wait
        self.concurrency = max(1, concurrency)
        self.linger = linger
        self.max_batch = max(1, min(max_batch, 500))
        self.limit_refresh = limit_refresh
        self.on_result = on_result
        self.pace = Pace(prefetch)
        self.stopping = asyncio.Event()
        self._room = asyncio.Event()  # the acquirer waits for room
        self._idle: deque[asyncio.Future[None]] = deque()  # slots waiting for a lease
        self._held: dict[str, AsyncJob] = {}
        self._waiting: deque[AsyncJob] = deque()
        self._running = 0
        self._slots = 1
        self._closing = False
        self._settled = 0
        self._started = 0
        self._limit = 1
        self._limit_read_at = float("-inf")
        self._pending: list[tuple[AsyncJob, Submission, bool]] = []
        self._outbox_wake = asyncio.Event()
        self._services_users = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._services_closing = False

    # -- bookkeeping ---------------------------------------------------------

    def _hold(self, lease: Lease, stage: Stage) -> AsyncJob:
        now = time.monotonic()
        job = AsyncJob(lease=lease, worker=self.name, stage=stage)
        job.beat_at = now
        job.expires_at = now + self.lease_ttl
        self._held[job.item_id] = job
        if stage is Stage.WAITING:
            self._waiting.append(job)
            self._wake()
        return job

    def _settle(self, job: AsyncJob, result: Result, *, report: bool = True) -> None:
        if job.stage is Stage.SETTLED:
            return
        if job.stage is Stage.WAITING:
            with contextlib.suppress(ValueError):
                self._waiting.remove(job)
        job.stage = Stage.SETTLED
        job.result = result
        self._held.pop(job.item_id, None)
        self._settled += 1
        self._room.set()
        job.done.set()
        if report and self.on_result is not None:
            try:
                self.on_result(result)
            except Exception:
                log.exception("on_result failed for %s", result.item_id)

    def _lose(self, job: AsyncJob) -> None:
        job.lost.set()
        job.stop.set()
        if job.stage is Stage.WAITING:
            self._settle(job, lost(job))

    @property
    def queue_limit(self) -> int:
        """The queue's concurrency limit as last read: no more leases than this are held."""
        return max(1, self._limit)

    def _wake(self, n: int = 1) -> None:
        """Wake up to `n` idle slots: one per lease that arrived, not all of them."""
        while n > 0 and self._idle:
            idle = self._idle.popleft()
            if not idle.done():
                idle.set_result(None)
                n -= 1

    def running(self) -> list[AsyncJob]:
        """The jobs whose handler is running now."""
        return [j for j in self._held.values() if j.stage is Stage.RUNNING]

    def in_flight(self) -> int:
        """Leases held now: waiting for a slot, running, or with their outcome on its way."""
        return len(self._held)

    # -- one item ------------------------------------------------------------

    async def process(self, lease: Lease) -> Result:
        """Run the handler for one lease with heartbeats; submit its outcome unless lost."""
        async with self._services():
            job = self._hold(lease, Stage.RUNNING)
            await self._execute(job)
            await job.done.wait()
        assert job.result is not None
        return job.result

    async def _execute(self, job: AsyncJob) -> None:
        if job.lost.is_set():
            self._settle(job, lost(job))
            return
        started = time.monotonic()
        try:
            value = self.handler(job)
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:
            failure: BaseException | None = exc
            value = None
        else:
            failure = None
        self.pace.handled(time.monotonic() - started)
        if job.lost.is_set():
            self._settle(job, lost(job))
            return
        job.stage = Stage.SETTLING
        self._put(job, verdict(value, failure))

    # -- the loop ------------------------------------------------------------

    async def limit(self) -> int:
        """How many items may run at once: ours, capped by the queue's concurrency limit.

        The queue's own limit (`queue_limit`) also caps the leases held, prefetched ones included.
        """
        now = time.monotonic()
        if now - self._limit_read_at >= self.limit_refresh:
            try:
                self._limit = (await self.client.concurrency(self.queue)).limit
                self._limit_read_at = now
            except errors.QueueClientError as exc:
                log.warning("could not read the queue's concurrency limit: %s", exc)
        return max(1, min(self.concurrency, self._limit))

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
        log.info("worker %s on %s under policy %s", self.name, self.queue, self.policy.describe())
        async with self._signals(handle_signals), self._services():
            self._closing = False
            self._started = 0
            slots = [asyncio.create_task(self._slot()) for _ in range(self.concurrency)]
            try:
                await self._acquire_loop(max_items, drain)
            finally:
                await self._shutdown(slots, grace)
        return self._started

    async def _slot(self) -> None:
        while True:
            while not (self._waiting and self._running < self._slots):
                if self._closing or self.stopping.is_set():
                    return
                idle = asyncio.get_running_loop().create_future()
                self._idle.append(idle)
                await idle
            if self.stopping.is_set():
                return  # a stopping worker starts nothing new; waiting leases go back
            job = self._waiting.popleft()
            job.stage = Stage.RUNNING
            self._running += 1
            self._started += 1
            try:
                await self._execute(job)
            except Exception:
                log.exception("the worker failed on %s", job.item_id)
                self._settle(job, lost(job))
            finally:
                self._running -= 1
                self._room.set()
                if self._waiting:
                    self._wake()

    async def _acquire_loop(self, max_items: int | None, drain: bool) -> None:
        taken = 0
        while not self.stopping.is_set():
            limit = await self.limit()
            cap = self.queue_limit
            if limit != self._slots:
                self._slots = limit
                self._wake(len(self._idle))
            remaining = None if max_items is None else max_items - taken
            if remaining == 0:
                break
            self._room.clear()
            asked = want(
                slots=limit,
                running=self._running,
                waiting=len(self._waiting),
                held=len(self._held),
                limit=cap,
                prefetch=self.pace.prefetch(limit),
                remaining=remaining,
            )
            if asked <= 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._room.wait(), self.limit_refresh)
                continue
            sent = time.monotonic()
            try:
                leases = await self.client.acquire(
                    self.queue,
                    worker=self.name,
                    lease_ttl=self.lease_ttl,
                    max_items=asked,
                    wait=0 if drain else self.wait,
                )
            except (errors.ConnectionFailedError, errors.ServiceUnavailableError) as exc:
                log.warning("acquire failed, retrying: %s", exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), 1.0)
                continue
            if leases:
                self.pace.acquired(time.monotonic() - sent)
            if self.stopping.is_set():
                for lease in leases:
                    self._put(self._hold(lease, Stage.SETTLING), give_back(), report=False)
                break
            for lease in leases:
                self._hold(lease, Stage.WAITING)
            taken += len(leases)
            if drain and not leases:
                if not self._held:
                    break
                seen = self._settled
                while self._settled == seen and not self.stopping.is_set():
                    self._room.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._room.wait(), 1.0)
        while self._held and not self.stopping.is_set():
            self._room.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), 0.5)

    async def _shutdown(self, slots: list[asyncio.Task[None]], grace: float | None) -> None:
        self.stopping.set()
        unstarted = list(self._waiting)
        self._waiting.clear()
        for job in unstarted:
            job.stage = Stage.SETTLING
            self._put(job, give_back(), report=False)
        self._closing = True
        self._wake(len(self._idle))
        _, pending = await asyncio.wait(slots, timeout=grace)
        if pending:
            for job in self.running():
                job.stop.set()
            await asyncio.wait(pending)

    @contextlib.asynccontextmanager
    async def _services(self) -> AsyncIterator[None]:
        """The outbox and heartbeat tasks, while anyone needs them."""
        self._services_users += 1
        if self._services_users == 1:
            self._services_closing = False
            self._tasks = [
                asyncio.create_task(self._outbox()),
                asyncio.create_task(self._heartbeats()),
            ]
        try:
            yield
        finally:
            self._services_users -= 1
            if self._services_users == 0:
                self._services_closing = True
                self._outbox_wake.set()
                outbox, beats = self._tasks
                await outbox
                beats.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beats

    @contextlib.asynccontextmanager
    async def _signals(self, enabled: bool) -> AsyncIterator[None]:
        if not enabled or threading.current_thread() is not threading.main_thread():
            yield
            return
        loop = asyncio.get_running_loop()
        count = [0]

        def on_signal(signum: int) -> None:
            count[0] += 1
            if count[0] == 1:
                log.warning("signal %d: stopping; running items may finish", signum)
                self.stop()
            else:
                log.warning("signal %d again: telling running items to stop now", signum)
                self.abort()

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

    def stop(self) -> None:
        """Take no new work; `run` then lets running handlers finish within its grace."""
        self.stopping.set()
        self._room.set()
        self._wake(len(self._idle))

    def abort(self) -> None:
        """Tell every running handler to stop now."""
        self.stop()
        for job in self.running():
            job.stop.set()

    # -- outcomes ------------------------------------------------------------

    def _put(self, job: AsyncJob, sub: Submission, *, report: bool = True) -> None:
        self._pending.append((job, sub, report))
        self._outbox_wake.set()

    async def _outbox(self) -> None:
        while True:
            while not self._pending:
                if self._services_closing:
                    return
                self._outbox_wake.clear()
                await self._outbox_wake.wait()
            if len(self._pending) < self.max_batch and self._running and not self._closing:
                # Other handlers are about to finish: let their outcomes join this request.
                await asyncio.sleep(self.linger)
            batch, self._pending = self._pending, []
            try:
                await self._send(batch)
            except Exception:
                log.exception("sending outcomes failed")
                for job, sub, report in batch:
                    self._settle(job, settled(job, sub, errors.QueueClientError()), report=report)

    async def _send(self, batch: list[tuple[AsyncJob, Submission, bool]]) -> None:
        reports = {id(job): report for job, _, report in batch}
        completions = [(job, sub) for job, sub, _ in batch if sub.kind == "complete"]
        for chunk in batches(completions, self.max_batch):
            entries = [sub.completion(job.item_id, job.fence) for job, sub in chunk]
            try:
                answers = await self.client.complete_many(entries, worker=self.name)
            except errors.QueueClientError as exc:
                if refuses_whole_batch(exc) and len(chunk) > 1:
                    for job, sub in chunk:
                        await self._single(job, sub, reports[id(job)])
                    continue
                for job, sub in chunk:
                    self._settle(job, settled(job, sub, exc), report=reports[id(job)])
                continue
            for (job, sub), answer in zip(chunk, answers, strict=True):
                error = None if answer.ok else answer.error()
                self._settle(job, settled(job, sub, error), report=reports[id(job)])
        for job, sub, report in batch:
            if sub.kind != "complete":
                await self._single(job, sub, report)

    async def _single(self, job: AsyncJob, sub: Submission, report: bool) -> None:
        client, name = self.client, self.name
        try:
            if sub.kind == "complete":
                await client.complete(
                    job.item_id,
                    result=sub.result,
                    worker=name,
                    fence=job.fence,
                    idempotency_key=sub.key,
                )
            elif sub.kind == "requeue":
                await client.requeue(
                    job.item_id,
                    reason=sub.reason,
                    worker=name,
                    fence=job.fence,
                    delay=sub.delay,
                    idempotency_key=sub.key,
                )
            else:
                await client.triage(
                    job.item_id,
                    failure_class=sub.failure_class,
                    message=sub.message,
                    transient=sub.transient,
                    decision="quarantine" if sub.quarantine else "requeue",
                    worker=name,
                    fence=job.fence,
                    delay=sub.delay,
                    idempotency_key=sub.key,
                )
        except errors.QueueClientError as exc:
            if sub.kind == "requeue" and not report:
                log.warning("could not give %s back: %s", job.item_id, exc)
            self._settle(job, settled(job, sub, exc), report=report)
        else:
            self._settle(job, settled(job, sub, None), report=report)

    # -- heartbeats ----------------------------------------------------------

    async def _heartbeats(self) -> None:
        interval = self.heartbeat_interval
        pause = interval
        while True:
            await asyncio.sleep(pause)
            now = time.monotonic()
            jobs = [
                j
                for j in self._held.values()
                if j.stage in (Stage.WAITING, Stage.RUNNING) and not j.lost.is_set()
            ]
            if not any(now - j.beat_at >= interval for j in jobs):
                pause = min((j.beat_at + interval - now for j in jobs), default=interval)
                continue
            # Whoever is at least half-way to its next beat goes along: beats stay in step.
            pause = await self._beat([j for j in jobs if now - j.beat_at >= interval / 2])

    async def _beat(self, jobs: list[AsyncJob]) -> float:
        sent = time.monotonic()
        try:
            answers = await self.client.heartbeat_many(
                [(j.item_id, j.fence) for j in jobs], worker=self.name, lease_ttl=self.lease_ttl
            )
        except errors.QueueClientError as exc:
            log.warning("heartbeat failed: %s", exc)
            for job in jobs:
                if time.monotonic() >= job.expires_at:
                    self._lose(job)
            return min(self.heartbeat_interval, 1.0)
        pause = 0.0
        for job, answer in zip(jobs, answers, strict=True):
            if answer.ok:
                job.beat_at = sent
                job.expires_at = sent + self.lease_ttl
                continue
            if job.stage in (Stage.SETTLING, Stage.SETTLED):
                continue
            error = answer.error()
            if is_lease_lost(error):
                log.warning("lease on %s lost: %s", job.item_id, error)
                job.lost_reason = error.code
                self._lose(job)
            elif time.monotonic() >= job.expires_at:
                self._lose(job)
            else:
                pause = min(self.heartbeat_interval, 1.0)
        return pause
