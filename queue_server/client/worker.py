"""The worker helper: long-poll acquire, run a handler, heartbeat in the background, then
complete on success or triage on failure.

Leased work is never retried here: a failed item goes back through the queue
(triage with decision `requeue`), and the server quarantines it once its
acquisition budget is spent. When a heartbeat is refused the lease is lost:
the handler is told to stop (`job.stop`) and its result is not submitted.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from queue_server.client import errors
from queue_server.client.client import QueueClient
from queue_server.client.models import Lease

log = logging.getLogger(__name__)


class TransientError(Exception):
    """Raise from a handler: the failure is transient; the item is requeued."""


class Quarantine(Exception):  # noqa: N818 - an instruction, not an error condition
    """Raise from a handler: the item can never succeed; quarantine it now."""


class Requeue(Exception):  # noqa: N818 - an instruction, not an error condition
    """Raise from a handler: give the item back untouched (no failure is recorded)."""


class Outcome(StrEnum):
    COMPLETED = "completed"
    REQUEUED = "requeued"
    TRIAGED = "triaged"
    QUARANTINED = "quarantined"
    LOST = "lost"
    UNSUBMITTED = "unsubmitted"


@dataclass
class Job:
    """One leased item as a handler sees it."""

    lease: Lease
    worker: str
    stop: threading.Event = field(default_factory=threading.Event)
    lost: threading.Event = field(default_factory=threading.Event)

    @property
    def item_id(self) -> str:
        return self.lease.item_id

    @property
    def fence(self) -> int:
        return self.lease.fence

    @property
    def payload(self) -> Any:
        return self.lease.payload

    @property
    def acquisition_count(self) -> int:
        return self.lease.acquisition_count

    def should_stop(self) -> bool:
        """True once the lease is lost or the worker is shutting down: stop and return."""
        return self.stop.is_set()


@dataclass(frozen=True)
class Result:
    item_id: str
    fence: int
    outcome: Outcome
    detail: str = ""


Handler = Callable[[Job], Any]


def default_worker_name() -> str:
    """hostname-pid, cut to the API's name pattern."""
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()) or "host"
    return f"{host[:50]}-{os.getpid()}".lstrip("._-") or f"worker-{os.getpid()}"


class Worker:
    """Runs `handler` for each leased item of `queue`, up to `concurrency` at once.

    The number of leases asked for never exceeds the queue's concurrency limit
    (read from the server, refreshed every `limit_refresh` seconds).

    Example::

        def handler(job: Job) -> dict:
            return {"sent": job.payload["to"]}

        Worker(client, "emails", handler, lease_ttl=30).run(stop_event)
    """

    def __init__(
        self,
        client: QueueClient,
        queue: str,
        handler: Handler,
        *,
        name: str | None = None,
        lease_ttl: float = 30.0,
        heartbeat_fraction: float = 1 / 3,
        wait: float = 5.0,
        concurrency: int = 1,
        limit_refresh: float = 10.0,
        on_result: Callable[[Result], None] | None = None,
    ) -> None:
        if not 0 < heartbeat_fraction < 1:
            raise ValueError("heartbeat_fraction must be between 0 and 1")
        self.client = client
        self.queue = queue
        self.handler = handler
        self.name = name or default_worker_name()
        self.lease_ttl = lease_ttl
        self.heartbeat_interval = lease_ttl * heartbeat_fraction
        self.wait = wait
        self.concurrency = max(1, concurrency)
        self.limit_refresh = limit_refresh
        self.on_result = on_result
        self.stopping = threading.Event()
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()
        self._limit = 1
        self._limit_read_at = float("-inf")

    # -- one item ------------------------------------------------------------

    def process(self, lease: Lease) -> Result:
        """Run the handler for one lease with heartbeats; submit its outcome unless lost."""
        job = Job(lease=lease, worker=self.name)
        with self._lock:
            self._jobs[lease.item_id] = job
        beats = threading.Thread(
            target=self._heartbeat, args=(job,), name=f"heartbeat-{lease.item_id}", daemon=True
        )
        beats.start()
        try:
            try:
                value = self.handler(job)
            except Exception as exc:
                failure: BaseException | None = exc
                value = None
            else:
                failure = None
            job.stop.set()  # ends the heartbeat thread
            beats.join()
            result = self._submit(job, value, failure)
        finally:
            with self._lock:
                self._jobs.pop(lease.item_id, None)
        if self.on_result is not None:
            self.on_result(result)
        return result

    def _heartbeat(self, job: Job) -> None:
        expires = time.monotonic() + self.lease_ttl
        while not job.stop.wait(self.heartbeat_interval):
            try:
                self.client.heartbeat(
                    job.item_id, worker=self.name, fence=job.fence, lease_ttl=self.lease_ttl
                )
                expires = time.monotonic() + self.lease_ttl
            except (errors.LeaseLostError, errors.NotFoundError) as exc:
                log.warning("lease on %s lost: %s", job.item_id, exc)
                self._lose(job)
                return
            except errors.QueueClientError as exc:
                # Unreachable for now; the lease is ours until it expires.
                log.warning("heartbeat for %s failed: %s", job.item_id, exc)
                if time.monotonic() >= expires:
                    self._lose(job)
                    return

    @staticmethod
    def _lose(job: Job) -> None:
        job.lost.set()
        job.stop.set()

    def _submit(self, job: Job, value: Any, failure: BaseException | None) -> Result:
        def result(outcome: Outcome, detail: str = "") -> Result:
            return Result(job.item_id, job.fence, outcome, detail)

        if job.lost.is_set():
            return result(Outcome.LOST, "the lease was lost; nothing was submitted")
        try:
            if failure is None:
                self.client.complete(job.item_id, result=value, worker=self.name, fence=job.fence)
                return result(Outcome.COMPLETED)
            if isinstance(failure, Requeue):
                self.client.requeue(
                    job.item_id, reason=str(failure), worker=self.name, fence=job.fence
                )
                return result(Outcome.REQUEUED, str(failure))
            quarantine = isinstance(failure, Quarantine)
            self.client.triage(
                job.item_id,
                failure_class=type(failure).__name__,
                message=str(failure)[:4000],
                transient=isinstance(failure, TransientError),
                decision="quarantine" if quarantine else "requeue",
                worker=self.name,
                fence=job.fence,
            )
            return result(Outcome.QUARANTINED if quarantine else Outcome.TRIAGED, str(failure))
        except errors.LeaseLostError as exc:
            job.lost.set()
            return result(Outcome.LOST, f"the server refused the outcome: {exc}")
        except errors.QueueClientError as exc:
            # The lease will expire and the item will be handed out again.
            return result(Outcome.UNSUBMITTED, f"could not submit the outcome: {exc}")

    # -- the loop ------------------------------------------------------------

    def limit(self) -> int:
        """How many items may run at once: ours, capped by the queue's concurrency limit."""
        now = time.monotonic()
        if now - self._limit_read_at >= self.limit_refresh:
            try:
                self._limit = self.client.concurrency(self.queue).limit
                self._limit_read_at = now
            except errors.QueueClientError as exc:
                log.warning("could not read the queue's concurrency limit: %s", exc)
        return max(1, min(self.concurrency, self._limit))

    def running(self) -> list[Job]:
        with self._lock:
            return list(self._jobs.values())

    def run(
        self, *, max_items: int | None = None, drain: bool = False, grace: float | None = None
    ) -> int:
        """Work until `stop()` (or `max_items` handled, or, with `drain`, nothing is due).

        On stop, no new lease is taken; running handlers get `grace` seconds
        (None: as long as they need), then are told to stop. Returns items handled.
        """
        handled = 0
        futures: set[Future[Result]] = set()
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="job") as pool:
            while not self.stopping.is_set():
                futures = {f for f in futures if not f.done()}
                if max_items is not None and handled >= max_items:
                    break
                free = self.limit() - len(futures)
                if max_items is not None:
                    free = min(free, max_items - handled)
                if free <= 0:
                    time.sleep(0.05)
                    continue
                try:
                    leases = self.client.acquire(
                        self.queue,
                        worker=self.name,
                        lease_ttl=self.lease_ttl,
                        max_items=free,
                        wait=0 if drain else self.wait,
                    )
                except (errors.ConnectionFailedError, errors.ServiceUnavailableError) as exc:
                    # The client already retried; a long-running worker keeps waiting.
                    log.warning("acquire failed, retrying: %s", exc)
                    self.stopping.wait(1.0)
                    continue
                if self.stopping.is_set():
                    for lease in leases:
                        self._give_back(lease)
                    break
                if not leases and drain and not futures:
                    break
                if not leases and drain:
                    time.sleep(0.05)
                    continue
                for lease in leases:
                    futures.add(pool.submit(self.process, lease))
                    handled += 1
            self._finish(futures, grace)
        return handled

    def _give_back(self, lease: Lease) -> None:
        try:
            self.client.requeue(
                lease.item_id, worker=self.name, fence=lease.fence, reason="worker stopping"
            )
        except errors.QueueClientError as exc:
            log.warning("could not give %s back: %s", lease.item_id, exc)

    def _finish(self, futures: set[Future[Result]], grace: float | None) -> None:
        deadline = None if grace is None else time.monotonic() + grace
        pending = {f for f in futures if not f.done()}
        while pending:
            if deadline is not None and time.monotonic() >= deadline:
                for job in self.running():
                    job.stop.set()
                deadline = None
            time.sleep(0.05)
            pending = {f for f in pending if not f.done()}

    def stop(self) -> None:
        """Take no new work; `run` then lets running handlers finish within its grace."""
        self.stopping.set()

    def abort(self) -> None:
        """Tell every running handler to stop now."""
        self.stopping.set()
        for job in self.running():
            job.stop.set()
