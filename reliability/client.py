"""A recording HTTP client of the queue API, and a worker loop built on it.

Every attempt is one :class:`~reliability.history.Operation` in the
recorder's history. An effecting request (one with an ``Idempotency-Key``)
whose answer was lost (no answer, a 5xx, or ``idempotency-key-in-flight``) is
retried with the same key and the same body until an answer arrives or the
retry budget runs out, so the checkers can compare the original answer with
every replay. Acquires carry no key and are never retried: an acquire whose
answer was lost may have handed out a lease that nobody will use; it expires.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

from reliability.history import HistoryRecorder, JSONValue, Operation, OpKind

__all__ = ["RecordingClient", "WorkerStats", "run_worker"]

RETRY_CODES = frozenset({"idempotency-key-in-flight"})


class RecordingClient:
    """One tenant's key against one base URL; thread-safe (httpx.Client is)."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        tenant: str,
        recorder: HistoryRecorder,
        *,
        timeout: float = 10.0,
        retry_for: float = 30.0,
        stop: threading.Event | None = None,
    ) -> None:
        self.tenant = tenant
        self.recorder = recorder
        self.retry_for = retry_for
        self.stop = stop
        self.http = httpx.Client(
            base_url=base_url,
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=httpx.Timeout(timeout, connect=3.0),
            limits=httpx.Limits(max_keepalive_connections=4),
        )
        self.attempts = 0
        self.retries = 0
        self.statuses: dict[int | None, int] = {}
        #: (status, content type) of every error answer that was not problem+json.
        self.non_problem_errors: list[tuple[int, str]] = []
        self._lock = threading.Lock()

    def close(self) -> None:
        self.http.close()

    # ------------------------------------------------------------- transport

    def attempt(
        self,
        kind: OpKind,
        path: str,
        *,
        body: JSONValue = None,
        method: str = "POST",
        idempotency_key: str | None = None,
        item_id: str | None = None,
        queue: str | None = None,
        fence: int | None = None,
        worker: str | None = None,
    ) -> tuple[Operation, httpx.Response | None]:
        """One request, recorded; never raises on transport errors."""
        pending = self.recorder.begin(
            kind,
            tenant=self.tenant,
            item_id=item_id,
            queue=queue,
            fence=fence,
            worker=worker,
            idempotency_key=idempotency_key,
            request_body=body,
        )
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        try:
            if method == "GET":
                response = self.http.get(path, headers=headers)
            else:
                response = self.http.request(method, path, json=body, headers=headers)
        except httpx.HTTPError as exc:
            op = self.recorder.fail(pending, exc)
            self._count(None)
            return op, None
        replayed = response.headers.get("Idempotent-Replayed", "").lower() == "true"
        content_type = response.headers.get("content-type", "")
        if response.status_code >= 400 and not content_type.startswith("application/problem+json"):
            with self._lock:
                self.non_problem_errors.append((response.status_code, content_type))
        op = self.recorder.finish(
            pending, status=response.status_code, body=response.content, replayed=replayed
        )
        self._count(response.status_code)
        return op, response

    def _count(self, status: int | None) -> None:
        with self._lock:
            self.attempts += 1
            self.statuses[status] = self.statuses.get(status, 0) + 1

    def call(
        self,
        kind: OpKind,
        path: str,
        *,
        body: JSONValue = None,
        idempotency_key: str | None = None,
        item_id: str | None = None,
        queue: str | None = None,
        fence: int | None = None,
        worker: str | None = None,
    ) -> Operation:
        """A request retried with the same key while its answer is lost."""
        deadline = time.monotonic() + self.retry_for
        backoff = 0.05
        while True:
            op, _ = self.attempt(
                kind,
                path,
                body=body,
                idempotency_key=idempotency_key,
                item_id=item_id,
                queue=queue,
                fence=fence,
                worker=worker,
            )
            lost = op.indeterminate or op.problem_code in RETRY_CODES
            if idempotency_key is None or not lost or time.monotonic() > deadline:
                return op
            if self.stop is not None and self.stop.is_set() and time.monotonic() > deadline - 5:
                return op
            with self._lock:
                self.retries += 1
            time.sleep(backoff * (0.5 + random.random()))
            backoff = min(backoff * 2, 0.5)

    # ------------------------------------------------------------------ API

    def enqueue(self, queue: str, payload: JSONValue, *, key: str | None = None) -> Operation:
        return self.call(
            OpKind.ENQUEUE,
            f"/v1/tenants/{self.tenant}/queues/{queue}/items",
            body={"payload": payload},
            idempotency_key=key or uuid.uuid4().hex,
            queue=queue,
        )

    def enqueue_batch(
        self, queue: str, payloads: list[JSONValue], *, key: str | None = None
    ) -> Operation:
        items: list[JSONValue] = [{"payload": p} for p in payloads]
        return self.call(
            OpKind.ENQUEUE_BATCH,
            f"/v1/tenants/{self.tenant}/queues/{queue}/items:batch",
            body={"items": items},
            idempotency_key=key or uuid.uuid4().hex,
            queue=queue,
        )

    def acquire(
        self, queue: str, worker: str, *, ttl: float, max_items: int = 1, wait: float = 0
    ) -> Operation:
        return self.call(
            OpKind.ACQUIRE,
            f"/v1/tenants/{self.tenant}/queues/{queue}/leases",
            body={"worker": worker, "lease_ttl": ttl, "max_items": max_items, "wait": wait},
            queue=queue,
            worker=worker,
        )

    def holder(
        self,
        kind: OpKind,
        item_id: str,
        worker: str,
        fence: int,
        extra: dict[str, JSONValue],
        *,
        key: str | None = None,
    ) -> Operation:
        body: dict[str, JSONValue] = {"worker": worker, "fence": fence, **extra}
        needs_key = kind is not OpKind.HEARTBEAT
        return self.call(
            kind,
            f"/v1/tenants/{self.tenant}/items/{item_id}/{kind.value}",
            body=body,
            idempotency_key=(key or uuid.uuid4().hex) if needs_key else None,
            item_id=item_id,
            fence=fence,
            worker=worker,
        )

    def complete(
        self, item_id: str, worker: str, fence: int, result: JSONValue, *, key: str | None = None
    ) -> Operation:
        return self.holder(OpKind.COMPLETE, item_id, worker, fence, {"result": result}, key=key)

    def requeue(self, item_id: str, worker: str, fence: int, reason: str) -> Operation:
        return self.holder(OpKind.REQUEUE, item_id, worker, fence, {"reason": reason})

    def heartbeat(self, item_id: str, worker: str, fence: int, ttl: float) -> Operation:
        return self.holder(OpKind.HEARTBEAT, item_id, worker, fence, {"lease_ttl": ttl})

    def tenant_status(self) -> tuple[int | None, dict[str, JSONValue]]:
        try:
            response = self.http.get(f"/v1/tenants/{self.tenant}")
        except httpx.HTTPError:
            return None, {}
        body = response.json() if response.status_code == 200 else {}
        return response.status_code, body if isinstance(body, dict) else {}


@dataclass
class WorkerStats:
    acquired: int = 0
    completed: int = 0
    refused: int = 0
    requeued: int = 0
    empty_polls: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)


def run_worker(
    client: RecordingClient,
    queue: str,
    worker: str,
    stop: threading.Event,
    *,
    ttl: float,
    max_items: int = 1,
    requeue_ratio: float = 0.0,
    heartbeat_ratio: float = 0.0,
    work_seconds: Callable[[], float] = lambda: 0.0,
    until_empty: int = 0,
    stats: WorkerStats | None = None,
    rng: random.Random | None = None,
) -> WorkerStats:
    """Acquire, work, then complete (or requeue) until ``stop``; returns counters.

    ``until_empty`` > 0 also stops after that many empty acquires in a row.
    """
    rng = rng or random.Random()
    stats = stats or WorkerStats()
    while not stop.is_set():
        op = client.acquire(queue, worker, ttl=ttl, max_items=max_items)
        stats.latencies.append(op.end_mono - op.start_mono)
        if not op.accepted:
            stats.errors += 1
            stop.wait(0.05)
            continue
        leases = op.leases()
        if not leases:
            stats.empty_polls += 1
            if until_empty and stats.empty_polls >= until_empty:
                return stats
            stop.wait(0.05)
            continue
        stats.empty_polls = 0
        stats.acquired += len(leases)
        for item_id, fence in leases:
            pause = work_seconds()
            if pause > 0:
                time.sleep(pause)
            if heartbeat_ratio and rng.random() < heartbeat_ratio:
                client.heartbeat(item_id, worker, fence, ttl)
            if requeue_ratio and rng.random() < requeue_ratio:
                done = client.requeue(item_id, worker, fence, "reliability: requeue")
                if done.accepted:
                    stats.requeued += 1
                else:
                    stats.refused += 1
                continue
            done = client.complete(item_id, worker, fence, {"by": worker, "fence": fence})
            if done.accepted:
                stats.completed += 1
            else:
                stats.refused += 1
    return stats
