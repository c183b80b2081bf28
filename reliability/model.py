"""An in-memory reference model of the queue's API, recording a history.

It answers as the real API does (status codes, problem codes, idempotency
receipts, fences, the backlog cap) on a manual clock, so the checkers can be
shown both to pass on a correct history and to catch planted bugs. Each guard
can be weakened by a flag, the way a mutation test weakens the server:

* ``accept_stale_fence``: holder writes skip the fence, holder and expiry checks;
* ``ignore_idempotency``: no receipts; every retry runs again;
* ``ignore_cap``: enqueue never refuses at the backlog cap;
* ``forget_completions``: a completion is answered 200 but not persisted.

Use ``lose_reply=True`` on an effecting call to apply its effect but record
that no answer arrived (the proxy's ``drop_after_reply``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from reliability.checkers import DatabaseSnapshot, ItemSnapshot, LedgerEvent
from reliability.history import HistoryRecorder, JSONValue, OpKind, PendingOperation, hash_json

__all__ = ["ManualClock", "QueueModel"]


class ManualClock:
    """A monotonic clock that only moves when told to."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def wall(self) -> float:
        return 1_700_000_000.0 + self.now

    def advance(self, seconds: float = 0.001) -> None:
        if seconds < 0:
            raise ValueError("a monotonic clock does not go back")
        self.now += seconds


@dataclass
class _Item:
    item_id: str
    tenant: str
    state: str = "ready"
    fence: int = 0
    acquisition_count: int = 0
    max_acquisitions: int = 5
    holder: str | None = None
    expired: bool = False
    events: list[LedgerEvent] = field(default_factory=list)

    def log(self, kind: str) -> None:
        self.events.append(LedgerEvent(len(self.events) + 1, kind, self.fence))

    def view(self) -> dict[str, JSONValue]:
        return {
            "item_id": self.item_id,
            "tenant": self.tenant,
            "state": self.state,
            "fence": self.fence,
            "acquisition_count": self.acquisition_count,
            "lease_holder": self.holder,
        }


_Answer = tuple[int, JSONValue]


def _problem(status: int, code: str) -> _Answer:
    return status, {"type": f"about:blank#{code}", "title": code, "status": status, "code": code}


class QueueModel:
    """A single-process, sequential model of the API (each call is one request)."""

    def __init__(
        self,
        *,
        caps: dict[str, int] | None = None,
        max_acquisitions: int = 5,
        accept_stale_fence: bool = False,
        ignore_idempotency: bool = False,
        ignore_cap: bool = False,
        forget_completions: bool = False,
        seed: int = 7,
    ) -> None:
        self.clock = ManualClock()
        self.recorder = HistoryRecorder(
            source="model", clock=self.clock, wall_clock=self.clock.wall
        )
        self.caps = dict(caps or {})
        self.max_acquisitions = max_acquisitions
        self.accept_stale_fence = accept_stale_fence
        self.ignore_idempotency = ignore_idempotency
        self.ignore_cap = ignore_cap
        self.forget_completions = forget_completions
        self._ids = (uuid.UUID(int=(seed << 64) + n) for n in range(1, 1 << 62))
        self.items: dict[tuple[str, str], _Item] = {}
        self._order: list[tuple[str, str]] = []
        self._receipts: dict[tuple[str, str], tuple[str, _Answer]] = {}

    @property
    def weakened(self) -> bool:
        """Whether any guard is weakened (a planted bug)."""
        return (
            self.accept_stale_fence
            or self.ignore_idempotency
            or self.ignore_cap
            or self.forget_completions
        )

    # ------------------------------------------------------------- plumbing

    def _finish(
        self, pending: PendingOperation, answer: _Answer, *, replayed: bool, lose_reply: bool
    ) -> _Answer:
        self.clock.advance()
        if lose_reply:
            self.recorder.fail(pending, "RemoteProtocolError: server disconnected")
        else:
            status, body = answer
            raw = json.dumps(body).encode()
            self.recorder.finish(pending, status=status, body=raw, replayed=replayed)
        self.clock.advance()
        return answer

    def _effecting(
        self,
        pending: PendingOperation,
        tenant: str,
        key: str,
        request: JSONValue,
        run: Callable[[], _Answer],
        *,
        lose_reply: bool,
    ) -> _Answer:
        self.clock.advance()
        fingerprint = hash_json(request)
        receipt = None if self.ignore_idempotency else self._receipts.get((tenant, key))
        if receipt is not None:
            stored_fingerprint, stored = receipt
            if stored_fingerprint != fingerprint:
                answer = _problem(422, "idempotency-key-reuse")
                return self._finish(pending, answer, replayed=False, lose_reply=lose_reply)
            return self._finish(pending, stored, replayed=True, lose_reply=lose_reply)
        answer = run()
        if answer[0] < 500 and answer[0] != 429:
            self._receipts[(tenant, key)] = (fingerprint, answer)
        return self._finish(pending, answer, replayed=False, lose_reply=lose_reply)

    def backlog(self, tenant: str) -> int:
        return sum(
            1
            for item in self.items.values()
            if item.tenant == tenant and item.state in ("ready", "leased")
        )

    # ------------------------------------------------------------ producers

    def enqueue(
        self,
        tenant: str,
        *,
        key: str,
        count: int = 1,
        payload: JSONValue = None,
        lose_reply: bool = False,
    ) -> _Answer:
        """Enqueue ``count`` items (a batch when more than one)."""
        batch = count > 1
        request: JSONValue = (
            {"items": [{"payload": payload} for _ in range(count)]}
            if batch
            else {"payload": payload}
        )
        kind = OpKind.ENQUEUE_BATCH if batch else OpKind.ENQUEUE
        pending = self.recorder.begin(
            kind, tenant=tenant, queue="q", idempotency_key=key, request_body=request
        )

        def run() -> _Answer:
            cap = self.caps.get(tenant)
            if cap is not None and not self.ignore_cap and self.backlog(tenant) + count > cap:
                return _problem(429, "backlog-cap-reached")
            made = []
            for _ in range(count):
                item = _Item(str(next(self._ids)), tenant, max_acquisitions=self.max_acquisitions)
                item.log("enqueued")
                self.items[(tenant, item.item_id)] = item
                self._order.append((tenant, item.item_id))
                made.append(item.view())
            if batch:
                items: list[JSONValue] = list(made)
                return 201, {"items": items}
            return 201, made[0]

        return self._effecting(pending, tenant, key, request, run, lose_reply=lose_reply)

    # -------------------------------------------------------------- workers

    def acquire(self, tenant: str, worker: str, *, max_items: int = 1) -> list[tuple[str, int]]:
        request: JSONValue = {"worker": worker, "lease_ttl": 30, "max_items": max_items}
        pending = self.recorder.begin(
            OpKind.ACQUIRE, tenant=tenant, queue="q", worker=worker, request_body=request
        )
        self.clock.advance()
        leases: list[JSONValue] = []
        granted: list[tuple[str, int]] = []
        for key in self._order:
            if len(granted) >= max_items:
                break
            item = self.items[key]
            if item.tenant != tenant:
                continue
            if not (item.state == "ready" or (item.state == "leased" and item.expired)):
                continue
            if item.acquisition_count >= item.max_acquisitions:
                item.state, item.holder, item.expired = "quarantined", None, False
                item.log("quarantined")
                continue
            item.state, item.holder, item.expired = "leased", worker, False
            item.fence += 1
            item.acquisition_count += 1
            item.log("acquired")
            granted.append((item.item_id, item.fence))
            leases.append(
                {
                    "item_id": item.item_id,
                    "fence": item.fence,
                    "acquisition_count": item.acquisition_count,
                }
            )
        self._finish(pending, (200, {"leases": leases}), replayed=False, lose_reply=False)
        return granted

    def expire(self, tenant: str, item_id: str) -> None:
        """Let the current lease run out (time passes on the database's clock)."""
        self.items[(tenant, item_id)].expired = True
        self.clock.advance(1.0)

    def _guard(self, item: _Item | None, worker: str, fence: int) -> _Answer | None:
        if item is None:
            return _problem(404, "item-not-found")
        if self.accept_stale_fence:
            return None if item.state in ("leased", "ready") else _problem(409, "item-not-leased")
        if item.state != "leased":
            return _problem(409, "item-not-leased")
        if fence < item.fence:
            return _problem(409, "stale-fence")
        if item.holder != worker:
            return _problem(409, "not-lease-holder")
        if item.expired:
            return _problem(409, "lease-expired")
        return None

    def heartbeat(self, tenant: str, item_id: str, worker: str, fence: int) -> _Answer:
        request: JSONValue = {"worker": worker, "fence": fence, "lease_ttl": 30}
        pending = self.recorder.begin(
            OpKind.HEARTBEAT,
            tenant=tenant,
            item_id=item_id,
            fence=fence,
            worker=worker,
            request_body=request,
        )
        self.clock.advance()
        item = self.items.get((tenant, item_id))
        refused = self._guard(item, worker, fence)
        answer: _Answer = refused or (200, {"lease_expires_at": "later"})
        return self._finish(pending, answer, replayed=False, lose_reply=False)

    def _holder_write(
        self,
        kind: OpKind,
        tenant: str,
        item_id: str,
        worker: str,
        fence: int,
        key: str,
        extra: dict[str, JSONValue],
        lose_reply: bool,
    ) -> _Answer:
        request: JSONValue = {"worker": worker, "fence": fence, **extra}
        pending = self.recorder.begin(
            kind,
            tenant=tenant,
            item_id=item_id,
            fence=fence,
            worker=worker,
            idempotency_key=key,
            request_body=request,
        )

        def run() -> _Answer:
            item = self.items.get((tenant, item_id))
            refused = self._guard(item, worker, fence)
            if refused is not None or item is None:
                return refused or _problem(404, "item-not-found")
            if kind is OpKind.COMPLETE:
                view = {**item.view(), "state": "completed", "lease_holder": None}
                if not self.forget_completions:
                    item.state, item.holder = "completed", None
                    item.events.append(LedgerEvent(len(item.events) + 1, "completed", fence))
                return 200, view
            if kind is OpKind.REQUEUE:
                item.state, item.holder, item.expired = "ready", None, False
                item.events.append(LedgerEvent(len(item.events) + 1, "requeued", fence))
                return 200, item.view()
            decision = extra.get("decision")
            item.events.append(LedgerEvent(len(item.events) + 1, "triaged", fence))
            # A requeue's failure at the item's last attempt is its quarantine.
            if decision == "quarantine" or item.acquisition_count >= item.max_acquisitions:
                item.state, item.holder, item.expired = "quarantined", None, False
                item.log("quarantined")
            else:
                item.state, item.holder, item.expired = "ready", None, False
            return 200, item.view()

        return self._effecting(pending, tenant, key, request, run, lose_reply=lose_reply)

    def complete(
        self,
        tenant: str,
        item_id: str,
        worker: str,
        fence: int,
        *,
        key: str,
        result: JSONValue = None,
        lose_reply: bool = False,
    ) -> _Answer:
        return self._holder_write(
            OpKind.COMPLETE, tenant, item_id, worker, fence, key, {"result": result}, lose_reply
        )

    def requeue(
        self,
        tenant: str,
        item_id: str,
        worker: str,
        fence: int,
        *,
        key: str,
        lose_reply: bool = False,
    ) -> _Answer:
        return self._holder_write(
            OpKind.REQUEUE, tenant, item_id, worker, fence, key, {"reason": "later"}, lose_reply
        )

    def triage(
        self,
        tenant: str,
        item_id: str,
        worker: str,
        fence: int,
        *,
        key: str,
        decision: str = "quarantine",
        lose_reply: bool = False,
    ) -> _Answer:
        extra: dict[str, JSONValue] = {
            "failure": {"class": "E", "message": "boom", "transient": False},
            "decision": decision,
        }
        return self._holder_write(
            OpKind.TRIAGE, tenant, item_id, worker, fence, key, extra, lose_reply
        )

    # ---------------------------------------------------------- observation

    def probe(self, tenants: Iterable[str] | None = None) -> None:
        """Record a backlog sample per tenant with a cap."""
        for tenant in tenants if tenants is not None else sorted(self.caps):
            self.recorder.record_backlog(tenant, self.backlog(tenant), self.caps[tenant])

    def quiescent(self, tenant: str) -> None:
        counts: dict[str, int] = {}
        for item in self.items.values():
            if item.tenant == tenant:
                counts[item.state] = counts.get(item.state, 0) + 1
        self.recorder.record_quiescent(tenant, counts)

    def snapshot(self) -> DatabaseSnapshot:
        return DatabaseSnapshot(
            tuple(
                ItemSnapshot(
                    item_id=item.item_id,
                    tenant=item.tenant,
                    state=item.state,
                    fence=item.fence,
                    acquisition_count=item.acquisition_count,
                    events=tuple(item.events),
                )
                for item in (self.items[key] for key in self._order)
            )
        )
