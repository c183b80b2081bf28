"""The worker's one implementation: slots, the acquirer, the outbox, heartbeats, lease loss
and shutdown, written once for `Worker` (threads) and `AsyncWorker` (asyncio).

Each loop is a generator of steps: a `Call` of the client (the client's own flows,
`queue_server.client.core`), a `Wait` on a signal or event, or a `Run` of the
handler. It decides everything; the face only performs the step (a blocking
send, `Condition.wait` and a plain call for the thread worker; the same
awaited, an asyncio future and an awaited handler for the asyncio one) and
sends back its answer, or throws its exception into the loop.

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

The state is guarded by one lock (a no-op on asyncio, where a step runs to its
next yield uninterrupted); a `Wait` on a signal is only yielded with that lock
held, as `threading.Condition` requires, and no `Call` or `Run` ever is.
"""

from __future__ import annotations

import abc
import logging
import time
from collections import deque
from collections.abc import Callable, Generator
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass, replace
from typing import Any, Generic, Protocol, TypedDict, TypeVar, Unpack

from queue_server.client import errors
from queue_server.client.core import Call, ClientFace, new_idempotency_key
from queue_server.client.models import Item, Lease
from queue_server.client.tracing import DEFAULT_PARENT_WITHIN, HandlerSpans
from queue_server.client.working import (
    MAX_ACQUIRE,
    LeaseFacts,
    Outcome,
    Pace,
    Result,
    Stage,
    Submission,
    batches,
    default_worker_name,
    envelope_limit,
    give_back,
    is_lease_lost,
    lost,
    refuses_whole_batch,
    settled,
    verdict,
    want,
)
from queue_server.policy import ReliabilityPolicy, at_most, runtime_policy

T = TypeVar("T")


class Signal(Protocol):
    """What the loops wake each other with: `threading.Condition`, or its asyncio twin."""

    def notify(self, n: int = 1) -> None: ...

    def notify_all(self) -> None: ...


class Flag(Protocol):
    """`threading.Event` or `asyncio.Event`: set once, read by anyone."""

    def set(self) -> None: ...

    def is_set(self) -> bool: ...


class HeldJob(LeaseFacts):
    """`Job` or `AsyncJob`: the lease facts plus the three flags a handler and the worker share."""

    stop: Flag
    lost: Flag
    done: Flag


J = TypeVar("J", bound=HeldJob)


# A comeback is looked for this long after its server-side instant.
COMEBACK_SLACK = 0.05


@dataclass(frozen=True, slots=True)
class Wait:
    """Wait on a signal (with the lock held) or an event, at most `timeout` seconds (None: until)."""

    on: Any
    timeout: float | None = None


@dataclass(frozen=True, slots=True)
class Run:
    """Run the handler on the job; the answer is its value, or its exception thrown back.
    `span`: the handler's span, current while it runs (None without tracing)."""

    job: Any
    span: Any = None


#: A loop of the worker: the steps it asks the face to perform, and what it returns.
Steps = Generator[Call | Wait | Run, Any, T]


class WorkerOptions(TypedDict, total=False):
    """A worker's options: the keyword arguments of `Worker` and `AsyncWorker`, listed once
    here and read by `WorkerCore` (an option left out takes the default said).

    - `name`: the worker in its leases and ledgers (default: `hostname-pid`).
    - `lease_ttl`: seconds a lease lasts between heartbeats (default and most: the policy's
      attempt timeout of durable leased work).
    - `heartbeat_fraction`: a heartbeat every this much of `lease_ttl` (1/3; 0 to 1).
    - `wait`: seconds an acquire long-polls an empty queue (5).
    - `concurrency`: handlers at once, within the queue's limit (1).
    - `prefetch`: leases that may wait for a free slot, 0 to 100 (None: sized to the
      pace, one acquire round trip's worth of items; none for a slow handler).
    - `linger`: seconds an outcome waits for others to share its request (0.002).
    - `max_batch`: outcomes in one request, 1 to 500 (100).
    - `limit_refresh`: seconds between reads of the queue's concurrency limit (10).
    - `on_result`: called with each item's `Result` (None).
    - `policy`: the reliability policy the worker runs under (the loaded one).
    - `tracer_provider`: OpenTelemetry's, for each handler's span (the global one).
    - `trace_parent_within`: a producer's trace context enqueued longer ago than this
      many seconds is linked to, not made the span's parent (3600).
    """

    name: str | None
    lease_ttl: float | None
    heartbeat_fraction: float
    wait: float
    concurrency: int
    prefetch: int | None
    linger: float
    max_batch: int
    limit_refresh: float
    on_result: Callable[[Result], None] | None
    policy: ReliabilityPolicy | None
    tracer_provider: Any
    trace_parent_within: float


class WorkerCore(abc.ABC, Generic[J]):
    """Runs `handler` for each leased item of `queue`, up to `concurrency` at once.

    The number of leases held never exceeds the queue's concurrency limit (read
    from the server, refreshed every `limit_refresh` seconds). The options are
    `WorkerOptions`.
    """

    #: What a slot or the outbox survives (logged, the item given up as lost).
    _survives: tuple[type[BaseException], ...] = (Exception,)
    _job: Callable[..., J]
    _log: logging.Logger
    stopping: Flag

    def __init__(
        self,
        client: ClientFace,
        queue: str,
        handler: Callable[[J], Any],
        **options: Unpack[WorkerOptions],
    ) -> None:
        heartbeat_fraction = options.get("heartbeat_fraction", 1 / 3)
        prefetch = options.get("prefetch")
        if not 0 < heartbeat_fraction < 1:
            raise ValueError("heartbeat_fraction must be between 0 and 1")
        if prefetch is not None and not 0 <= prefetch <= MAX_ACQUIRE:
            raise ValueError(f"prefetch must be between 0 and {MAX_ACQUIRE}")
        self._api = client._core
        self.queue = queue
        self.handler = handler
        self.name = options.get("name") or default_worker_name()
        # Leased work runs under the loaded policy: the lease TTL is at most the class's
        # attempt timeout (the policy's when not given); above it is a PolicyError here.
        self.policy = options.get("policy") or runtime_policy()
        leased = self.policy.leased_work
        self.lease_ttl: float = at_most(
            options.get("lease_ttl"),
            leased.attempt_timeout,
            setting="lease_ttl",
            cell=leased.cell("attempt_timeout"),
        )
        self.heartbeat_interval = self.lease_ttl * heartbeat_fraction
        self.wait = options.get("wait", 5.0)
        self.concurrency = max(1, options.get("concurrency", 1))
        self.linger = options.get("linger", 0.002)
        self.max_batch = max(1, min(options.get("max_batch", 100), 500))
        self.limit_refresh = options.get("limit_refresh", 10.0)
        self.on_result = options.get("on_result")
        self.pace = Pace(prefetch)
        # One lock for the state; the signals say who is waiting for what.
        self._lock = self._new_lock()
        self._work = self._new_signal(self._lock)  # slots wait for a waiting lease
        self._room = self._new_signal(self._lock)  # the acquirer waits for room
        self._beat_wake = self._new_signal(self._lock)  # the heartbeat loop sleeps on it
        self._held: dict[str, J] = {}
        self._waiting: deque[J] = deque()
        self._running = 0
        self._slots = 1
        self._closing = False
        self._settled = 0
        self._started = 0
        # When items this worker sent back with a delay are due again (monotonic seconds):
        # a drain waits for them.
        self._comebacks: list[float] = []
        self._limit = 1
        self._limit_read_at = float("-inf")
        self._limit_warned = False  # the start-up warning of a limit below `concurrency`
        self._expiry_warned: object = None  # the expiry of the approval last warned of
        # The outbox has its own lock: handlers hand it outcomes while the state is busy.
        self._outbox_lock = self._new_lock()
        self._outbox_wake = self._new_signal(self._outbox_lock)
        self._pending: list[tuple[J, Submission, bool]] = []
        self._outbox_closed = False
        self._beats_closed = False
        self._services_users = 0
        # Each handler's span (docs/observability.md); None without opentelemetry.
        self.spans = HandlerSpans.create(
            options.get("tracer_provider"),
            options.get("trace_parent_within", DEFAULT_PARENT_WITHIN),
        )

    # -- what each face provides -------------------------------------------------

    @abc.abstractmethod
    def _new_lock(self) -> AbstractContextManager[Any]:
        """A lock of the face's kind (a thread lock, or one for the event loop)."""

    @abc.abstractmethod
    def _new_signal(self, lock: Any) -> Signal:
        """A condition on `lock` that wakes the face's waiters."""

    # -- bookkeeping ---------------------------------------------------------

    def _hold(self, lease: Lease, stage: Stage) -> J:
        return self._hold_all([lease], stage)[0]

    def _hold_all(self, leases: list[Lease], stage: Stage) -> list[J]:
        """Hold the leases of one acquire: waiting ones wake as many slots, with one signal."""
        if self.spans is not None:
            self.spans.refresh()
        now = time.monotonic()
        jobs = [self._job(lease=lease, worker=self.name, stage=stage) for lease in leases]
        for job in jobs:
            job.beat_at = now
            job.expires_at = now + self.lease_ttl
        with self._lock:
            for job in jobs:
                self._held[job.item_id] = job
            if stage is Stage.WAITING and jobs:
                self._waiting.extend(jobs)
                self._work.notify(len(jobs))
        return jobs

    def _settle(self, job: J, result: Result, *, report: bool = True) -> None:
        self._settle_all([(job, result, report)])

    def _settle_all(self, outcomes: list[tuple[J, Result, bool]]) -> None:
        """Settle jobs (those of one batch together): their room is announced once."""
        settled: list[tuple[J, Result, bool]] = []
        with self._lock:
            for job, result, report in outcomes:
                if job.stage is Stage.SETTLED:
                    continue
                if job.stage is Stage.WAITING:
                    with suppress(ValueError):
                        self._waiting.remove(job)
                job.stage = Stage.SETTLED
                job.result = result
                self._held.pop(job.item_id, None)
                self._settled += 1
                settled.append((job, result, report))
            if settled:
                self._room.notify_all()
        for job, result, report in settled:
            job.done.set()
            if report and self.on_result is not None:
                try:
                    self.on_result(result)
                except Exception:
                    self._log.exception("on_result failed for %s", result.item_id)

    def _lose(self, job: J) -> None:
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

    def running(self) -> list[J]:
        """The jobs whose handler is running now."""
        with self._lock:
            return [j for j in self._held.values() if j.stage is Stage.RUNNING]

    def in_flight(self) -> int:
        """Leases held now: waiting for a slot, running, or with their outcome on its way."""
        with self._lock:
            return len(self._held)

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

    def _signalled(self, count: int, signum: int) -> None:
        """SIGINT or SIGTERM: the first stops taking work, the next stops the handlers."""
        if count == 1:
            self._log.warning("signal %d: stopping; running items may finish", signum)
            self.stop()
        else:
            self._log.warning("signal %d again: telling running items to stop now", signum)
            self.abort()

    # -- one item ------------------------------------------------------------

    def _process(self, lease: Lease) -> Steps[Result]:
        """Run the handler for one lease with heartbeats; submit its outcome unless lost."""
        job = self._hold(lease, Stage.RUNNING)
        yield from self._execute(job)
        yield Wait(job.done)
        assert job.result is not None
        return job.result

    def _execute(self, job: J) -> Steps[None]:
        if job.lost.is_set():
            self._settle(job, lost(job))
            return
        started = time.monotonic()
        span = None if self.spans is None else self.spans.start(job.lease, self.queue, self.name)
        try:
            value = yield Run(job, span)
        except Exception as exc:
            failure: BaseException | None = exc
            value = None
        else:
            failure = None
        self.pace.handled(time.monotonic() - started)
        if job.lost.is_set():
            if span is not None:
                self.spans.end(span, Outcome.LOST, failure)  # type: ignore[union-attr]
            self._settle(job, lost(job))
            return
        sub = verdict(value, failure)
        if span is not None:
            self.spans.end(span, sub.outcome, failure)  # type: ignore[union-attr]
        with self._lock:
            job.stage = Stage.SETTLING
        self._put(job, sub)

    # -- the loop ------------------------------------------------------------

    def _read_limit(self) -> Steps[int]:
        """How many items may run at once: ours, capped by the queue's concurrency limit.

        The queue's own limit (`queue_limit`) also caps the leases held, prefetched ones included.
        """
        now = time.monotonic()
        if now - self._limit_read_at >= self.limit_refresh:
            try:
                info = yield from self._api.concurrency(self.queue)
                self._warn_fallen(info.limit)
                self._limit = info.limit
                self._limit_read_at = now
                self._warn_below_concurrency()
                self._warn_expiring(info.warning, info.expires_at)
            except errors.QueueClientError as exc:
                self._log.warning("could not read the queue's concurrency limit: %s", exc)
        return max(1, min(self.concurrency, self._limit))

    def _warn_below_concurrency(self) -> None:
        """At start (the first limit read of a run): say so when the queue leases fewer at a
        time than this worker's `concurrency`, which would otherwise run below it silently."""
        if self._limit_warned:
            return
        self._limit_warned = True
        if self._limit < self.concurrency:
            self._log.warning(
                "queue %s leases at most %d at a time (%s; a spend approval raises it);"
                " this worker's concurrency is %d",
                self.queue,
                self._limit,
                self.policy.leased_work.cell("concurrency"),
                self.concurrency,
            )

    def _warn_fallen(self, limit: int) -> None:
        """After the first read of a run: say so when the queue's limit falls below what it
        was and below this worker's `concurrency` (an approval lapsed or was revoked, or an
        operator lowered the queue's concurrency), which would otherwise slow it silently."""
        if self._limit_warned and limit < self._limit and limit < self.concurrency:
            self._log.warning(
                "queue %s now leases at most %d at a time (was %d): its spend approval"
                " lapsed or was revoked, or an operator lowered its concurrency"
                " (queue-server spend show %s)",
                self.queue,
                limit,
                self._limit,
                self.queue,
            )

    def _warn_expiring(self, warning: str | None, expires_at: object) -> None:
        """Once per approval: the server says the approval behind the queue's limit expires
        within its warning window (then the queue leases one at a time)."""
        if warning and expires_at != self._expiry_warned:
            self._expiry_warned = expires_at
            self._log.warning("%s", warning)

    def _start(self) -> None:
        self._log.info(
            "worker %s on %s under policy %s", self.name, self.queue, self.policy.describe()
        )
        self._closing = False
        self._started = 0
        self._comebacks = []
        self._limit_warned = False
        self._expiry_warned = None

    def _slot(self) -> Steps[None]:
        while True:
            with self._lock:
                while not (self._waiting and self._running < self._slots):
                    if self._closing or self.stopping.is_set():
                        return
                    yield Wait(self._work)
                if self.stopping.is_set():
                    return  # a stopping worker starts nothing new; waiting leases go back
                job = self._waiting.popleft()
                job.stage = Stage.RUNNING
                self._running += 1
                self._started += 1
            try:
                yield from self._execute(job)
            except GeneratorExit:
                raise
            except self._survives:
                self._log.exception("the worker failed on %s", job.item_id)
                self._settle(job, lost(job))
            finally:
                with self._lock:
                    self._running -= 1
                    self._room.notify_all()

    def _acquire_loop(self, max_items: int | None, drain: bool) -> Steps[None]:
        taken = 0
        while not self.stopping.is_set():
            limit = yield from self._read_limit()
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
                    yield Wait(self._room, self.limit_refresh)
                    continue
            sent = time.monotonic()
            try:
                leases = yield from self._api.acquire(
                    self.queue,
                    worker=self.name,
                    lease_ttl=self.lease_ttl,
                    max_items=asked,
                    wait=0 if drain else self.wait,
                )
            except (errors.ConnectionFailedError, errors.ServiceUnavailableError) as exc:
                # The client already retried; a long-running worker keeps waiting.
                self._log.warning("acquire failed, retrying: %s", exc)
                yield Wait(self.stopping, 1.0)
                continue
            if leases:
                self.pace.acquired(time.monotonic() - sent)
            if self.stopping.is_set():
                for job in self._hold_all(leases, Stage.SETTLING):
                    self._put(job, give_back(), report=False)
                break
            self._hold_all(leases, Stage.WAITING)
            taken += len(leases)
            if drain and not leases:
                # What was due when we looked and did not come to us is not coming.
                self._comebacks = [t for t in self._comebacks if t > sent]
                if not self._held and self._comebacks:
                    # An item this worker sent back is due again soon (its backoff): wait.
                    yield Wait(self.stopping, max(0.0, min(self._comebacks) - time.monotonic()))
                    continue
                with self._lock:
                    if not self._held:
                        break
                    # Our own running items may come back (requeue): look again once one settles.
                    seen = self._settled
                    while self._settled == seen and not self.stopping.is_set():
                        yield Wait(self._room, 1.0)
        # Finished taking work: let what was taken run to its end, unless stopped meanwhile.
        with self._lock:
            while self._held and not self.stopping.is_set():
                yield Wait(self._room, 0.5)

    def _close_intake(self) -> None:
        """Stop taking work: slots start nothing more, waiting leases are given back."""
        self.stopping.set()
        with self._lock:
            unstarted = list(self._waiting)
            self._waiting.clear()
            for job in unstarted:
                job.stage = Stage.SETTLING
            self._closing = True
            self._work.notify_all()
        for job in unstarted:
            self._put(job, give_back(), report=False)

    def _past_grace(self) -> None:
        for job in self.running():
            job.stop.set()

    def _open_services(self) -> bool:
        """Count a user of the outbox and heartbeat loops; True when they must be started."""
        with self._lock:
            self._services_users += 1
            first = self._services_users == 1
            if first:
                self._beats_closed = False
        if first:
            with self._outbox_lock:
                self._outbox_closed = False
        return first

    def _close_services(self) -> bool:
        """Count a user out; True (with both loops told to end) when it was the last one."""
        with self._lock:
            self._services_users -= 1
            last = self._services_users == 0
            if last:
                self._beats_closed = True
                self._beat_wake.notify_all()
        if last:
            with self._outbox_lock:
                self._outbox_closed = True  # it sends what is pending, then ends
                self._outbox_wake.notify()
        return last

    # -- outcomes ------------------------------------------------------------

    def _put(self, job: J, sub: Submission, *, report: bool = True) -> None:
        with self._outbox_lock:
            self._pending.append((job, sub, report))
            if len(self._pending) == 1 or len(self._pending) >= self.max_batch:
                self._outbox_wake.notify()

    def _outbox(self) -> Steps[None]:
        """Sends outcomes: completions of concurrent handlers together, requeues and triages."""
        while True:
            with self._outbox_lock:
                while not self._pending and not self._outbox_closed:
                    yield Wait(self._outbox_wake)
                if not self._pending:
                    return
                # Other handlers are about to finish: let their outcomes join this request.
                deadline = time.monotonic() + self.linger
                while len(self._pending) < self.max_batch and not self._outbox_closed:
                    left = deadline - time.monotonic()
                    if left <= 0 or not self._running:
                        break
                    yield Wait(self._outbox_wake, left)
                batch, self._pending = self._pending, []
            try:
                yield from self._send(batch)
            except GeneratorExit:
                raise
            except self._survives:
                self._log.exception("sending outcomes failed")
                failed = errors.QueueClientError()
                self._settle_all(
                    [(job, settled(job, sub, failed), report) for job, sub, report in batch]
                )

    def _send(self, batch: list[tuple[J, Submission, bool]]) -> Steps[None]:
        reports = {id(job): report for job, _, report in batch}
        completions = [(job, sub) for job, sub, _ in batch if sub.kind == "complete"]
        for chunk in batches(completions, self.max_batch):
            entries = [(job.item_id, job.fence, sub.result, sub.key) for job, sub in chunk]
            try:
                answers = yield from self._api._settle_many(entries, worker=self.name)
            except errors.QueueClientError as exc:
                if refuses_whole_batch(exc) and len(chunk) > 1:
                    for job, sub in chunk:
                        yield from self._single(job, sub, reports[id(job)])
                    continue
                self._settle_all(
                    [(job, settled(job, sub, exc), reports[id(job)]) for job, sub in chunk]
                )
                continue
            self._settle_all(
                [
                    (
                        job,
                        settled(job, sub, None if answer.ok else answer.error()),
                        reports[id(job)],
                    )
                    for (job, sub), answer in zip(chunk, answers, strict=True)
                ]
            )
        for job, sub, report in batch:
            if sub.kind != "complete":
                yield from self._single(job, sub, report)

    def _single(self, job: J, sub: Submission, report: bool) -> Steps[None]:
        try:
            back = yield from self._submit(job, sub)
        except errors.QueueClientError as exc:
            limit = envelope_limit(exc, "delay") if sub.kind != "complete" else None
            if limit is None:
                self._refused(job, sub, exc, report)
                return
            # A delay above the policy's cap never leaves the item leased: back at the cap.
            cap, cell = limit
            self._log.warning(
                "%s: the delay %s s is above the policy's backoff cap of %g s (%s);"
                " the item goes back at the cap",
                job.item_id,
                f"{sub.delay:g}" if isinstance(sub.delay, float | int) else sub.delay,
                cap,
                cell,
            )
            at_cap = replace(sub, delay=cap, key=new_idempotency_key())
            try:
                back = yield from self._submit(job, at_cap)
            except errors.QueueClientError as again:
                self._refused(job, at_cap, again, report)
                return
            self._comeback(back)
            self._settle(job, settled(job, at_cap, None), report=report)
        else:
            self._comeback(back)
            self._settle(job, settled(job, sub, None), report=report)

    def _comeback(self, item: Item | None) -> None:
        """Note when an item this worker sent back to `ready` is due again."""
        if item is None or item.state != "ready":
            return
        delay = (item.available_at - item.updated_at).total_seconds()
        if delay > 0:
            now = time.monotonic()
            # Only those still ahead are kept: a long-running worker's list stays as short as
            # its items in backoff. A little after the server's instant: its clock, the trip.
            self._comebacks = [t for t in self._comebacks if t > now]
            self._comebacks.append(now + delay + COMEBACK_SLACK)

    def _refused(self, job: J, sub: Submission, exc: errors.QueueClientError, report: bool) -> None:
        """An outcome the server did not take: said in the log, never silent."""
        if sub.kind == "requeue" and not report:
            self._log.warning("could not give %s back: %s", job.item_id, exc)
        else:
            self._log.warning("the server refused the %s of %s: %s", sub.kind, job.item_id, exc)
        self._settle(job, settled(job, sub, exc), report=report)

    def _submit(self, job: J, sub: Submission) -> Steps[Item | None]:
        """Send one outcome; the item as the server answered a requeue or triage."""
        api, name = self._api, self.name
        if sub.kind == "complete":
            yield from api.complete(
                job.item_id,
                result=sub.result,
                worker=name,
                fence=job.fence,
                idempotency_key=sub.key,
            )
            return None
        if sub.kind == "requeue":
            item: Item = yield from api.requeue(
                job.item_id,
                reason=sub.reason,
                worker=name,
                fence=job.fence,
                delay=sub.delay,
                idempotency_key=sub.key,
            )
            return item
        item = yield from api.triage(
            job.item_id,
            failure_class=sub.failure_class,
            message=sub.message,
            transient=sub.transient,
            traceback=sub.traceback,
            decision="quarantine" if sub.quarantine else "requeue",
            worker=name,
            fence=job.fence,
            delay=sub.delay,
            idempotency_key=sub.key,
        )
        return item

    # -- heartbeats ----------------------------------------------------------

    def _heartbeats(self) -> Steps[None]:
        """One loop extends every held lease, all due leases in one request."""
        interval = self.heartbeat_interval
        pause = interval
        while True:
            with self._lock:
                if not self._beats_closed:
                    yield Wait(self._beat_wake, pause)
                if self._beats_closed:
                    return
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
            pause = yield from self._beat([j for j in jobs if now - j.beat_at >= interval / 2])

    def _beat(self, jobs: list[J]) -> Steps[float]:
        sent = time.monotonic()
        try:
            answers = yield from self._api.heartbeat_many(
                [(j.item_id, j.fence) for j in jobs], worker=self.name, lease_ttl=self.lease_ttl
            )
        except errors.QueueClientError as exc:
            # Unreachable for now; each lease is ours until it expires.
            self._log.warning("heartbeat failed: %s", exc)
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
            error = answer.error()
            with self._lock:
                settling = job.stage in (Stage.SETTLING, Stage.SETTLED)
            if settling:
                continue  # its outcome went out meanwhile; the refusal says nothing new
            if is_lease_lost(error):
                self._log.warning("lease on %s lost: %s", job.item_id, error)
                job.lost_reason = error.code
                self._lose(job)
            elif time.monotonic() >= job.expires_at:
                self._lose(job)
            else:
                pause = min(self.heartbeat_interval, 1.0)  # try again soon
        return pause


__all__ = ["HeldJob", "LeaseFacts", "Run", "Steps", "Wait", "WorkerCore"]
