"""The worker helper (threads): acquire, run a handler per item, heartbeat, then complete on
success or triage on failure; the asyncio twin is `queue_server.client.aio.AsyncWorker`.

Nothing waits on a timer. A handler that returns frees its slot at once and the
slot takes the next waiting lease; the acquirer asks for every free slot (plus a
prefetch sized to the pace, within the queue's concurrency limit) in one call;
outcomes of concurrent handlers are sent together within `linger` seconds, each
entry fenced and under its own idempotency key; one request extends every held
lease.

Leased work is never retried here: a failed item goes back through the queue
(triage with decision `requeue`), and the server quarantines it once its
acquisition budget is spent. When a heartbeat is refused the lease is lost:
the handler is told to stop (`job.stop`) and its result is not submitted.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from queue_server.client import errors
from queue_server.client.client import QueueClient
from queue_server.client.models import Lease
from queue_server.client.working import (
    MAX_ACQUIRE,
    LeaseFacts,
    Outcome,
    Pace,
    Quarantine,
    Requeue,
    Result,
    Stage,
    Submission,
    TransientError,
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


@dataclass(eq=False)
class Job(LeaseFacts):
    """One leased item as a handler sees it."""

    stop: threading.Event = field(default_factory=threading.Event)
    lost: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event, repr=False)

    def should_stop(self) -> bool:
        """True once the lease is lost or the worker is shutting down: stop and return."""
        return self.stop.is_set()


Handler = Callable[[Job], Any]


class Worker:
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

    def __init__(
        self,
        client: QueueClient,
        queue: str,
        handler: Handler,
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
        self.stopping = threading.Event()
        # One lock; the conditions say who is waiting for what.
        self._lock = threading.RLock()
        self._work = threading.Condition(self._lock)  # slots wait for a waiting lease
        self._room = threading.Condition(self._lock)  # the acquirer waits for room
        self._held: dict[str, Job] = {}
        self._waiting: deque[Job] = deque()
        self._running = 0
        self._slots = 1
        self._closing = False
        self._settled = 0
        self._started = 0
        self._limit = 1
        self._limit_read_at = float("-inf")
        self._outbox = _Outbox(self)
        self._beats = _Heartbeats(self)
        self._services_users = 0

    # -- bookkeeping ---------------------------------------------------------

    def _hold(self, lease: Lease, stage: Stage) -> Job:
        now = time.monotonic()
        job = Job(lease=lease, worker=self.name, stage=stage)
        job.beat_at = now
        job.expires_at = now + self.lease_ttl
        with self._lock:
            self._held[job.item_id] = job
            if stage is Stage.WAITING:
                self._waiting.append(job)
                self._work.notify()
        return job

    def _settle(self, job: Job, result: Result, *, report: bool = True) -> None:
        with self._lock:
            if job.stage is Stage.SETTLED:
                return
            if job.stage is Stage.WAITING:
                with contextlib.suppress(ValueError):
                    self._waiting.remove(job)
            job.stage = Stage.SETTLED
            job.result = result
            self._held.pop(job.item_id, None)
            self._settled += 1
            self._room.notify_all()
        job.done.set()
        if report and self.on_result is not None:
            try:
                self.on_result(result)
            except Exception:
                log.exception("on_result failed for %s", result.item_id)

    def _lose(self, job: Job) -> None:
        job.lost.set()
        job.stop.set()
        with self._lock:
            unstarted = job.stage is Stage.WAITING
            if unstarted:
                self._waiting.remove(job)
                job.stage = Stage.SETTLING
        if unstarted:
            self._settle(job, lost(job))

    @property
    def queue_limit(self) -> int:
        """The queue's concurrency limit as last read: no more leases than this are held."""
        return max(1, self._limit)

    def running(self) -> list[Job]:
        """The jobs whose handler is running now."""
        with self._lock:
            return [j for j in self._held.values() if j.stage is Stage.RUNNING]

    def in_flight(self) -> int:
        """Leases held now: waiting for a slot, running, or with their outcome on its way."""
        with self._lock:
            return len(self._held)

    # -- one item ------------------------------------------------------------

    def process(self, lease: Lease) -> Result:
        """Run the handler for one lease with heartbeats; submit its outcome unless lost."""
        with self._services():
            job = self._hold(lease, Stage.RUNNING)
            self._execute(job)
            job.done.wait()
        assert job.result is not None
        return job.result

    def _execute(self, job: Job) -> None:
        if job.lost.is_set():
            self._settle(job, lost(job))
            return
        started = time.monotonic()
        try:
            value = self.handler(job)
        except Exception as exc:
            failure: BaseException | None = exc
            value = None
        else:
            failure = None
        self.pace.handled(time.monotonic() - started)
        if job.lost.is_set():
            self._settle(job, lost(job))
            return
        with self._lock:
            job.stage = Stage.SETTLING
        self._outbox.put(job, verdict(value, failure))

    # -- the loop ------------------------------------------------------------

    def limit(self) -> int:
        """How many items may run at once: ours, capped by the queue's concurrency limit.

        The queue's own limit (`queue_limit`) also caps the leases held, prefetched ones included.
        """
        now = time.monotonic()
        if now - self._limit_read_at >= self.limit_refresh:
            try:
                self._limit = self.client.concurrency(self.queue).limit
                self._limit_read_at = now
            except errors.QueueClientError as exc:
                log.warning("could not read the queue's concurrency limit: %s", exc)
        return max(1, min(self.concurrency, self._limit))

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
        slots = [
            threading.Thread(target=self._slot, name=f"job-{n}", daemon=True)
            for n in range(self.concurrency)
        ]
        log.info("worker %s on %s under policy %s", self.name, self.queue, self.policy.describe())
        with self._signals(handle_signals), self._services():
            self._closing = False
            self._started = 0
            for thread in slots:
                thread.start()
            try:
                self._acquire_loop(max_items, drain)
            finally:
                self._shutdown(slots, grace)
        return self._started

    def _slot(self) -> None:
        while True:
            with self._lock:
                while not (self._waiting and self._running < self._slots):
                    if self._closing or self.stopping.is_set():
                        return
                    self._work.wait()
                if self.stopping.is_set():
                    return  # a stopping worker starts nothing new; waiting leases go back
                job = self._waiting.popleft()
                job.stage = Stage.RUNNING
                self._running += 1
                self._started += 1
            try:
                self._execute(job)
            except BaseException:
                log.exception("the worker failed on %s", job.item_id)
                self._settle(job, lost(job))
            finally:
                with self._lock:
                    self._running -= 1
                    self._room.notify_all()

    def _acquire_loop(self, max_items: int | None, drain: bool) -> None:
        taken = 0
        while not self.stopping.is_set():
            limit = self.limit()
            cap = self.queue_limit
            with self._lock:
                if limit != self._slots:
                    self._slots = limit
                    self._work.notify_all()
                remaining = None if max_items is None else max_items - taken
                if remaining == 0:
                    break
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
                    self._room.wait(self.limit_refresh)
                    continue
            sent = time.monotonic()
            try:
                leases = self.client.acquire(
                    self.queue,
                    worker=self.name,
                    lease_ttl=self.lease_ttl,
                    max_items=asked,
                    wait=0 if drain else self.wait,
                )
            except (errors.ConnectionFailedError, errors.ServiceUnavailableError) as exc:
                # The client already retried; a long-running worker keeps waiting.
                log.warning("acquire failed, retrying: %s", exc)
                self.stopping.wait(1.0)
                continue
            if leases:
                self.pace.acquired(time.monotonic() - sent)
            if self.stopping.is_set():
                for lease in leases:
                    self._outbox.put(self._hold(lease, Stage.SETTLING), give_back(), report=False)
                break
            for lease in leases:
                self._hold(lease, Stage.WAITING)
            taken += len(leases)
            if drain and not leases:
                with self._lock:
                    if not self._held:
                        break
                    # Our own running items may come back (requeue): look again once one settles.
                    seen = self._settled
                    while self._settled == seen and not self.stopping.is_set():
                        self._room.wait(1.0)
        # Finished taking work: let what was taken run to its end, unless stopped meanwhile.
        with self._lock:
            while self._held and not self.stopping.is_set():
                self._room.wait(0.5)

    def _shutdown(self, slots: list[threading.Thread], grace: float | None) -> None:
        self.stopping.set()
        with self._lock:
            unstarted = list(self._waiting)
            self._waiting.clear()
            for job in unstarted:
                job.stage = Stage.SETTLING
            self._closing = True
            self._work.notify_all()
        for job in unstarted:
            self._outbox.put(job, give_back(), report=False)
        deadline = None if grace is None else time.monotonic() + grace
        for thread in slots:
            while thread.is_alive():
                if deadline is not None and time.monotonic() >= deadline:
                    for job in self.running():
                        job.stop.set()
                    deadline = None
                thread.join(0.05 if deadline is not None else 0.5)

    @contextlib.contextmanager
    def _services(self) -> Iterator[None]:
        """The outbox and the heartbeat threads, while anyone needs them."""
        with self._lock:
            self._services_users += 1
            if self._services_users == 1:
                self._outbox.start()
                self._beats.start()
        try:
            yield
        finally:
            with self._lock:
                self._services_users -= 1
                last = self._services_users == 0
            if last:
                self._outbox.close()
                self._beats.close()

    @contextlib.contextmanager
    def _signals(self, enabled: bool) -> Iterator[None]:
        if not enabled or threading.current_thread() is not threading.main_thread():
            yield
            return
        count = [0]

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            count[0] += 1
            if count[0] == 1:
                log.warning("signal %d: stopping; running items may finish", signum)
                self.stop()
            else:
                log.warning("signal %d again: telling running items to stop now", signum)
                self.abort()

        previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def stop(self) -> None:
        """Take no new work; `run` then lets running handlers finish within its grace."""
        self.stopping.set()
        with self._lock:
            self._room.notify_all()
            self._work.notify_all()

    def abort(self) -> None:
        """Tell every running handler to stop now."""
        self.stop()
        for job in self.running():
            job.stop.set()


class _Outbox:
    """Sends outcomes: completions of concurrent handlers together, requeues and triages."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self._cond = threading.Condition()
        self._pending: list[tuple[Job, Submission, bool]] = []
        self._closed = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="outbox", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Send what is pending, then stop."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()

    def put(self, job: Job, sub: Submission, *, report: bool = True) -> None:
        with self._cond:
            self._pending.append((job, sub, report))
            if len(self._pending) == 1 or len(self._pending) >= self.worker.max_batch:
                self._cond.notify()

    def _run(self) -> None:
        worker = self.worker
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return
                # Other handlers are about to finish: let their outcomes join this request.
                deadline = time.monotonic() + worker.linger
                while (
                    len(self._pending) < worker.max_batch and not self._closed and worker._running
                ):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                batch, self._pending = self._pending, []
            try:
                self._send(batch)
            except BaseException:
                log.exception("sending outcomes failed")
                for job, sub, report in batch:
                    self.worker._settle(
                        job, settled(job, sub, errors.QueueClientError()), report=report
                    )

    def _send(self, batch: list[tuple[Job, Submission, bool]]) -> None:
        worker = self.worker
        reports = {id(job): report for job, _, report in batch}
        completions = [(job, sub) for job, sub, _ in batch if sub.kind == "complete"]
        for chunk in batches(completions, worker.max_batch):
            entries = [sub.completion(job.item_id, job.fence) for job, sub in chunk]
            try:
                answers = worker.client.complete_many(entries, worker=worker.name)
            except errors.QueueClientError as exc:
                if refuses_whole_batch(exc) and len(chunk) > 1:
                    for job, sub in chunk:
                        self._single(job, sub, reports[id(job)])
                    continue
                for job, sub in chunk:
                    worker._settle(job, settled(job, sub, exc), report=reports[id(job)])
                continue
            for (job, sub), answer in zip(chunk, answers, strict=True):
                error = None if answer.ok else answer.error()
                worker._settle(job, settled(job, sub, error), report=reports[id(job)])
        for job, sub, report in batch:
            if sub.kind != "complete":
                self._single(job, sub, report)

    def _single(self, job: Job, sub: Submission, report: bool) -> None:
        client, name = self.worker.client, self.worker.name
        try:
            if sub.kind == "complete":
                client.complete(
                    job.item_id,
                    result=sub.result,
                    worker=name,
                    fence=job.fence,
                    idempotency_key=sub.key,
                )
            elif sub.kind == "requeue":
                client.requeue(
                    job.item_id,
                    reason=sub.reason,
                    worker=name,
                    fence=job.fence,
                    delay=sub.delay,
                    idempotency_key=sub.key,
                )
            else:
                client.triage(
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
            self.worker._settle(job, settled(job, sub, exc), report=report)
        else:
            self.worker._settle(job, settled(job, sub, None), report=report)


class _Heartbeats:
    """One thread extends every held lease, all due leases in one request."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="heartbeats", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        worker = self.worker
        interval = worker.heartbeat_interval
        pause = interval
        while not self._stop.wait(pause):
            now = time.monotonic()
            with worker._lock:
                jobs = [
                    j
                    for j in worker._held.values()
                    if j.stage in (Stage.WAITING, Stage.RUNNING) and not j.lost.is_set()
                ]
            if not any(now - j.beat_at >= interval for j in jobs):
                pause = min((j.beat_at + interval - now for j in jobs), default=interval)
                continue
            # Whoever is at least half-way to its next beat goes along: beats stay in step.
            due = [j for j in jobs if now - j.beat_at >= interval / 2]
            pause = self._beat(due)

    def _beat(self, jobs: list[Job]) -> float:
        worker = self.worker
        sent = time.monotonic()
        try:
            answers = worker.client.heartbeat_many(
                [(j.item_id, j.fence) for j in jobs], worker=worker.name, lease_ttl=worker.lease_ttl
            )
        except errors.QueueClientError as exc:
            # Unreachable for now; each lease is ours until it expires.
            log.warning("heartbeat failed: %s", exc)
            for job in jobs:
                if time.monotonic() >= job.expires_at:
                    worker._lose(job)
            return min(worker.heartbeat_interval, 1.0)
        pause = 0.0
        for job, answer in zip(jobs, answers, strict=True):
            if answer.ok:
                job.beat_at = sent
                job.expires_at = sent + worker.lease_ttl
                continue
            error = answer.error()
            with worker._lock:
                settling = job.stage in (Stage.SETTLING, Stage.SETTLED)
            if settling:
                continue  # its outcome went out meanwhile; the refusal says nothing new
            if is_lease_lost(error):
                log.warning("lease on %s lost: %s", job.item_id, error)
                job.lost_reason = error.code
                worker._lose(job)
            elif time.monotonic() >= job.expires_at:
                worker._lose(job)
            else:
                pause = min(worker.heartbeat_interval, 1.0)  # try again soon
        return pause
