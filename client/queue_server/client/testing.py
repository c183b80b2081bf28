"""An in-memory queue server for tests, a catalogue of the routes the SDK calls (one answer
each, hence over 800 lines): your handler runs through the real `Worker` (or `AsyncWorker`)
and `QueueClient`, with no server, no database and a clock the test moves.

    server = InMemoryServer()
    with server.client() as qs:
        item = qs.enqueue("emails", {"to": "ada@example.com"})
        Worker(qs, "emails", send).run(drain=True)
        assert qs.get_item(item.item_id).state == "completed"
    server.clock.advance(30)  # leases run out, delayed items come due: only when told

The seam is HTTP: `client()` gives the SDK's own client an httpx client whose transport
(`httpx.MockTransport`) hands each request to `InMemoryServer.handle`, which answers as
the server's route does: the same paths, fields, statuses and problem documents. What the
SDK makes of an answer (its models and typed errors, the worker's batched outcomes and
heartbeats, lease loss) is the SDK's own code, unchanged. What it answers, as the server
does (tests/client/test_in_memory.py holds it to a live server's answers):

- enqueue, one or a batch, with priority, `delay` and `max_acquisitions` (default 5, at
  most the policy's attempt cap). An Idempotency-Key gets its first answer again (the same
  item), or 422 `idempotency-key-reuse` for another request; so do complete, requeue,
  triage and a batch of completions, whose 409 refusals are kept and replayed too.
- acquire: expired leases first (taken over under the next fence), then the items due at
  the clock, highest priority first, then oldest; never more live leases than the queue's
  concurrency limit (1, or what `approve` sets). An item past its budget is quarantined
  with a dead letter instead. With nothing due, `wait` is a real long poll that any change
  (an enqueue, a requeue, `clock.advance`) wakes; `run(drain=True)` sends no wait.
- heartbeat (one or a batch), complete (one or a batch), requeue and triage, under the
  holder guard in the server's order: 404 `item-not-found`, then 409 `item-not-leased`,
  `stale-fence`, `fence-ahead`, `not-lease-holder` (another worker name, or another
  client: a lease belongs to the client that took it), `lease-deadline-exceeded`,
  `lease-expired`. A lease lasts its TTL (the request's, else 30 s), at most the policy's
  deadline from its acquisition.
- requeue and triage(requeue) after `delay` seconds or "backoff" (1 s doubling with each
  acquisition, up to the policy's backoff cap; no jitter); a delay above that cap is 422
  with its `policy_envelope` entry. A failed item with no attempt left, or a triage
  quarantine, is quarantined with a dead letter (`list_dead_letters`).
- `get_item`, and the queue's `concurrency` (a worker reads it at start).

Left out: tenants, keys and roles (a client may name any tenant), the ledger, backlog
caps, cancel, replay, pause, queue settings, spend approvals as resources, schedules,
watchers, receipts, trace contexts, and checks of fields the SDK always sends
well-formed. Any other route answers 501.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson

from queue_server.client import connection
from queue_server.client.async_client import AsyncQueueClient
from queue_server.client.client import QueueClient
from queue_server.client.core import FAN_IN_MAX
from queue_server.client.models import Item, Lease
from queue_server.policy import LeasedWork, ReliabilityPolicy, runtime_policy

__all__ = ["TENANT", "URL", "Clock", "InMemoryServer"]

#: The base URL of every client of an in-memory server (nothing listens there).
URL = "http://queue-server.in-memory"
#: The tenant `client()` names unless told another.
TENANT = "tests"
PROBLEMS = "https://queue-server.dev/problems"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# The holder guard's refusals: code -> (title, detail), as the server words them.
CONFLICTS = {
    "item-not-leased": ("Item not leased", "The item is not leased."),
    "stale-fence": (
        "Stale fence",
        "The fence is older than the item's current fence: a newer lease superseded this one.",
    ),
    "fence-ahead": (
        "Fence ahead",
        "The fence is higher than the item's current fence: no lease with it was handed out.",
    ),
    "not-lease-holder": ("Not the lease holder", "Another worker holds the lease on this item."),
    "lease-expired": (
        "Lease expired",
        "The lease has expired and grants no authority, even if nobody has taken the item yet.",
    ),
    "lease-deadline-exceeded": (
        "Lease deadline exceeded",
        "The lease reached its deadline (the policy's durable-leased-work deadline from its\n"
        "acquisition, or the queue's shorter one): no heartbeat extends it, and the item is\n"
        "handled as an expired lease.",
    ),
}


class Clock:
    """The in-memory server's time: it starts at the real time and moves only by `advance`."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime.now(UTC)
        self._moved: list[Callable[[], None]] = []

    def now(self) -> datetime:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move `seconds` ahead: leases run out and delayed items come due."""
        if seconds < 0:
            raise ValueError("the clock only moves forward")
        self._now += timedelta(seconds=seconds)
        for wake in self._moved:
            wake()


class _Refusal(Exception):  # noqa: N818 - an answer of the double, not an error of it
    """A problem answer (RFC 9457). `kept`: a refusal of the operation itself (a 409), which
    the server keeps for its Idempotency-Key; a request refused before it ran is not kept."""

    def __init__(
        self, status: int, code: str, title: str, detail: str, kept: bool = False, **more: Any
    ) -> None:
        super().__init__(detail)
        self.status, self.code, self.title, self.detail = status, code, title, detail
        self.kept = kept
        self.more = more

    def document(self, instance: str) -> dict[str, Any]:
        body: dict[str, Any] = {"type": f"{PROBLEMS}/{self.code}", "title": self.title}
        body |= {"status": self.status, "detail": self.detail, "code": self.code}
        body["instance"] = instance
        return body | {k: v for k, v in self.more.items() if k not in body}


def conflict(code: str, item_id: str, detail: str | None = None, **more: Any) -> _Refusal:
    title, default = CONFLICTS[code]
    return _Refusal(409, code, title, detail or default, kept=True, item_id=item_id, **more)


def invalid(loc: list[Any], msg: str, kind: str = "value_error", **more: Any) -> _Refusal:
    detail = f"Invalid fields: {'.'.join(str(p) for p in loc)}."
    entry: dict[str, Any] = {"loc": loc, "msg": msg, "type": kind, **more}
    return _Refusal(422, "invalid-request", "Invalid request", detail, errors=[entry])


def above(loc: list[Any], value: float, leased: LeasedWork, ceiling: str) -> _Refusal:
    """A value above the policy's envelope: 422 naming the field, its limit and the cell,
    which the worker reads (a delay above the backoff cap is sent again at the cap)."""
    limit, cell, what = (
        float(getattr(leased, ceiling)),
        leased.cell(ceiling),
        ceiling.replace("_", " "),
    )
    msg = f"must be at most {limit:g}, the policy's {what}"
    refusal = invalid(loc, msg, "policy_envelope", cell=cell, limit=limit)
    refusal.detail = (
        f"{'.'.join(str(p) for p in loc[1:])} {value:g} exceeds the policy's {what} of"
        f" {limit:g} ({cell}). The policy is a maximum envelope."
    )
    return refusal


def dumps(value: Any) -> bytes:
    """JSON as the server renders it (times in UTC, with a Z)."""
    return orjson.dumps(value, option=orjson.OPT_UTC_Z | orjson.OPT_NAIVE_UTC)


@dataclass(eq=False)
class Record:
    """One work item as the server keeps it."""

    item_id: str
    tenant: str
    queue: str
    payload: Any
    priority: int
    available_at: datetime
    max_acquisitions: int
    created_at: datetime
    state: str = "ready"
    fence: int = 0
    acquisition_count: int = 0
    lease_holder: str | None = None
    lease_client: str | None = None
    lease_expires_at: datetime | None = None
    lease_deadline_at: datetime | None = None
    result: Any = None
    last_failure: Any = None
    unique_key: str | None = None
    ordering_key: str | None = None
    ordering_seq: int = 0  # its place in its ordering key's line
    partition_key: str | None = None  # kept and shown (no rate limit here)
    depends_on: tuple[str, ...] = ()  # the items it waits for
    on_dependency_failure: str = "cancel"
    updated_at: datetime = field(init=False)

    def __post_init__(self) -> None:
        self.updated_at = self.created_at

    def expired(self, now: datetime) -> bool:
        return self.lease_expires_at is not None and self.lease_expires_at <= now

    def at_deadline(self) -> bool:
        """A lease that ran to its deadline: no heartbeat could extend it further."""
        end, deadline = self.lease_expires_at, self.lease_deadline_at
        return end is not None and deadline is not None and end >= deadline

    def release(self, now: datetime, state: str) -> None:
        self.state, self.updated_at = state, now
        self.lease_holder = self.lease_client = self.lease_expires_at = None

    def view(self) -> dict[str, Any]:
        """The item as the API shows it: every field of `queue_server.wire.Item`."""
        shown = {name: getattr(self, name) for name in Item.model_fields}
        if self.state != "leased":  # the deadline of its last lease is not shown
            shown["lease_deadline_at"] = None
        return shown

    def lease(self) -> dict[str, Any]:
        """The lease as acquire answers it: `queue_server.wire.Lease` (no trace context)."""
        return {name: getattr(self, name, None) for name in Lease.model_fields}


@dataclass(frozen=True)
class Request:
    """One request as a route reads it."""

    path: str
    args: dict[str, str]  # from the path: tenant, queue, item, action
    body: Any
    query: httpx.QueryParams
    caller: str  # the client's key: a lease belongs to the client that took it


_T = r"/v1/tenants/(?P<tenant>[^/]+)"
_Q = _T + r"/queues/(?P<queue>[^/]+)"
_ITEM = _T + r"/items/(?P<item>[^/]+)"
# (method, path, route, effecting: it needs an Idempotency-Key, and a repeat replays it)
ROUTES = [
    ("POST", re.compile(_Q + r"/items(?::batch)?"), "enqueue", True),
    ("POST", re.compile(_Q + "/leases"), "acquire", False),
    ("GET", re.compile(_Q + "/concurrency"), "concurrency", False),
    ("GET", re.compile(_ITEM), "get_item", False),
    ("GET", re.compile(_ITEM + "/dependencies"), "dependencies", False),
    ("POST", re.compile(_ITEM + "/heartbeat"), "heartbeat", False),
    ("POST", re.compile(_ITEM + "/(?P<action>complete|requeue|triage)"), "settle", True),
    ("POST", re.compile(_T + "/leases:heartbeat"), "heartbeat_many", False),
    ("POST", re.compile(_T + "/completions"), "complete_many", True),
    ("GET", re.compile(_T + "/dead-letters"), "dead_letters", False),
]


class InMemoryServer:
    """The queue server's work-item routes, in memory, on a clock the test moves (`clock`).

    `max_acquisitions` and `lease_ttl` are the tenant's defaults, `retry_base` and
    `retry_cap` the backoff (the cap at most the policy's, its default); the policy is the
    one the SDK loads unless given. Its clients share its items, each with its own key.
    """

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        max_acquisitions: int = 5,
        lease_ttl: float = 30.0,
        retry_base: float = 1.0,
        retry_cap: float | None = None,
        policy: ReliabilityPolicy | None = None,
    ) -> None:
        self.policy = policy
        self.leased = (policy or runtime_policy()).leased_work
        self.clock = clock or Clock()
        self.max_acquisitions = min(max_acquisitions, self.leased.attempt_cap)
        self.lease_ttl = min(lease_ttl, self.leased.attempt_timeout)
        self.retry_base = retry_base
        self.retry_cap = min(retry_cap or self.leased.backoff_cap, self.leased.backoff_cap)
        self._items: dict[str, Record] = {}
        self._dead: list[tuple[str, dict[str, Any]]] = []  # (tenant, dead letter)
        self._limits: dict[tuple[str, str], int] = {}
        self._receipts: dict[tuple[str, str], tuple[bytes, int, bytes]] = {}
        self._ids = itertools.count(1)
        self._keys = itertools.count(1)
        self._changed = threading.Condition(threading.RLock())
        self.clock._moved.append(self._wake)

    # -- for the test --------------------------------------------------------------

    def client(self, tenant: str = TENANT, **options: Any) -> QueueClient:
        """A `QueueClient` of this server (`options`: QueueClient's `timeout`, `policy`...)."""
        http = connection.in_process(URL, self.handle)
        options.setdefault("policy", self.policy)
        return QueueClient(URL, self._key(), tenant=tenant, http=http, **options)

    def async_client(self, tenant: str = TENANT, **options: Any) -> AsyncQueueClient:
        """An `AsyncQueueClient` of this server; its requests are answered off the event loop."""
        http = connection.in_process_async(URL, self._handle_async)
        options.setdefault("policy", self.policy)
        return AsyncQueueClient(URL, self._key(), tenant=tenant, http=http, **options)

    def _key(self) -> str:
        return f"in-memory-{next(self._keys)}"

    def approve(self, queue: str, max_concurrency: int, *, tenant: str = TENANT) -> None:
        """Let `queue` lease up to `max_concurrency` items at once (as a live spend approval)."""
        with self._changed:
            self._limits[(tenant, queue)] = min(max_concurrency, self.leased.max_approved)
            self._changed.notify_all()

    def items(
        self, queue: str | None = None, *, state: str | None = None, tenant: str = TENANT
    ) -> list[Item]:
        """The tenant's items (of `queue`, in `state`), oldest first, as `get_item` shows them."""
        with self._changed:
            return [
                Item.model_validate(r.view())
                for r in sorted(self._items.values(), key=lambda r: r.item_id)
                if r.tenant == tenant and queue in (None, r.queue) and state in (None, r.state)
            ]

    # -- the transport -------------------------------------------------------------

    def handle(self, request: httpx.Request) -> httpx.Response:
        """Answer one request as the server's route would."""
        path = request.url.path
        try:
            with self._changed:
                for method, pattern, name, effecting in ROUTES:
                    match = pattern.fullmatch(path)
                    if match and request.method == method:
                        return self._route(request, match.groupdict(), name, effecting)
            detail = f"{request.method} {path} is not served by the in-memory server"
            raise _Refusal(501, "not-implemented", "Not implemented", detail)
        except orjson.JSONDecodeError:
            refusal = invalid(["body"], "not JSON")
        except KeyError as missing:  # the fields the SDK always sends are the only ones read
            refusal = invalid(["body", *missing.args], "Field required", "missing")
        except _Refusal as refused:
            refusal = refused
        return self._response(refusal.status, dumps(refusal.document(path)))

    async def _handle_async(self, request: httpx.Request) -> httpx.Response:
        return await asyncio.to_thread(self.handle, request)

    def _route(
        self, request: httpx.Request, args: dict[str, str], name: str, effecting: bool
    ) -> httpx.Response:
        for part in ("tenant", "queue"):
            if part in args and not NAME.fullmatch(args[part]):
                raise invalid(["path", part], "not a valid name")
        body = orjson.loads(request.content) if request.content else None
        if request.method == "POST" and not isinstance(body, dict):
            raise invalid(["body"], "a JSON object is required")
        caller = request.headers.get("authorization", "").removeprefix("Bearer ")
        asked = Request(request.url.path, args, body, request.url.params, caller)
        route: Callable[[Request], tuple[int, Any]] = getattr(self, f"_{name}")
        if not effecting:
            return self._response(*self._answer(route(asked)))
        # Once per (client, Idempotency-Key): a repeat gets the first answer again.
        key = request.headers.get("idempotency-key", "")
        if not 1 <= len(key) <= 255 or not all(33 <= ord(c) <= 126 for c in key):
            detail = "Effecting requests need an Idempotency-Key header."
            raise _Refusal(400, "idempotency-key-required", "Idempotency-Key required", detail)
        asked_for = orjson.dumps([request.method, asked.path, body], option=orjson.OPT_SORT_KEYS)
        kept = self._receipts.get((caller, key))
        if kept is not None:
            if kept[0] != asked_for:
                detail = "This Idempotency-Key was already used for a different request."
                raise _Refusal(
                    422, "idempotency-key-reuse", "Idempotency-Key reused", detail,
                    idempotency_key=key,
                )  # fmt: skip
            return self._response(kept[1], kept[2], replayed=True)
        try:
            status, content = self._answer(route(asked))
        except _Refusal as refusal:
            if not refusal.kept:
                raise
            status, content = refusal.status, dumps(refusal.document(asked.path))
        self._receipts[(caller, key)] = (asked_for, status, content)
        return self._response(status, content)

    @staticmethod
    def _answer(answered: tuple[int, Any]) -> tuple[int, bytes]:
        return answered[0], dumps(answered[1])

    @staticmethod
    def _response(status: int, content: bytes, replayed: bool = False) -> httpx.Response:
        media = "application/problem+json" if status >= 400 else "application/json"
        headers = {"content-type": media}
        if replayed:
            headers["idempotent-replayed"] = "true"
        return httpx.Response(status, content=content, headers=headers)

    def _wake(self) -> None:
        with self._changed:
            self._changed.notify_all()

    # -- items ---------------------------------------------------------------------

    def _enqueue(self, asked: Request) -> tuple[int, Any]:
        batch = asked.path.endswith(":batch")
        specs = asked.body["items"] if batch else [asked.body]
        for i, spec in enumerate(specs):
            budget = spec.get("max_acquisitions")
            if budget is not None and budget > self.leased.attempt_cap:
                at = ["body", *(["items", i] if batch else []), "max_acquisitions"]
                raise above(at, budget, self.leased, "attempt_cap")
        now = self.clock.now()
        made = []
        new: set[str] = set()
        made_ids: dict[str, str] = {}
        held = {
            r.unique_key: r
            for r in self._items.values()
            if r.unique_key is not None
            and r.state in ("waiting", "ready", "leased")
            and (r.tenant, r.queue) == (asked.args["tenant"], asked.args["queue"])
        }
        # A ref names an item of this request (made below), for a later item's depends_on.
        refs: dict[str, str] = {}
        for i, spec in enumerate(specs):
            if spec.get("ref") is not None:
                refs[spec["ref"]] = f"ref:{spec['ref']}"
            spec["depends_on"] = [refs.get(d, d) for d in spec.get("depends_on") or ()] or None
            self._check_dependencies(asked.args["tenant"], spec, i, batch)
        callback = asked.body.get("callback") if batch else None
        named = [str(d).lower() for d in (callback or {}).get("depends_on") or ()]
        if len(specs) + len(named) > FAN_IN_MAX:
            detail = f"callback: a fan-in waits for at most {FAN_IN_MAX:,} items."
            raise _Refusal(422, "invalid-request", "Invalid request", detail)
        if named:
            self._check_dependencies(
                asked.args["tenant"], {"depends_on": named, "on_dependency_failure": "run"}, 0, True
            )
        for spec in specs:
            # An item of the queue holding the key, ready or leased: answered, none made.
            holder = held.get(spec.get("unique_key"))
            if holder is None and spec.get("unique_for") is not None:
                # Unique for a period: the newest made within it, in any state.
                since = now - timedelta(seconds=spec["unique_for"])
                recent = [
                    r
                    for r in self._items.values()
                    if r.unique_key == spec["unique_key"]
                    and (r.tenant, r.queue) == (asked.args["tenant"], asked.args["queue"])
                    and r.created_at > since
                ]
                holder = max(recent, key=lambda r: (r.created_at, r.item_id), default=None)
            if holder is not None:
                made.append(holder.view())
                continue
            # A UUIDv7's shape: the clock's milliseconds, then the order of enqueue.
            ms, n = int(now.timestamp() * 1000), next(self._ids)
            record = Record(
                item_id=str(uuid.UUID(f"{ms:012x}70008{n:015x}")),
                tenant=asked.args["tenant"],
                queue=asked.args["queue"],
                payload=spec.get("payload"),
                priority=spec.get("priority", 0),
                available_at=now + timedelta(seconds=spec.get("delay", 0)),
                max_acquisitions=spec.get("max_acquisitions") or self.max_acquisitions,
                created_at=now,
                unique_key=spec.get("unique_key"),
                ordering_key=spec.get("ordering_key"),
                ordering_seq=n,
                partition_key=spec.get("partition_key"),
                depends_on=tuple(made_ids.get(d, d) for d in spec.get("depends_on") or ()),
                on_dependency_failure=spec.get("on_dependency_failure") or "cancel",
            )
            if record.ordering_key is not None and self._line(record):
                record.state = "waiting"  # behind an item of its key not finished
            if not self._satisfied(record):
                record.state = "waiting"  # a dependency is not completed
            self._items[record.item_id] = record
            if spec.get("ref") is not None:
                made_ids[f"ref:{spec['ref']}"] = record.item_id
            new.add(record.item_id)
            if record.unique_key is not None:
                held[record.unique_key] = record
            made.append(record.view())
        if callback is not None:
            # A fan-in: one more item waiting for every item the batch answered with and
            # those it names, run once each is finished, completed or not.
            ms, n = int(now.timestamp() * 1000), next(self._ids)
            joined = Record(
                item_id=str(uuid.UUID(f"{ms:012x}70008{n:015x}")),
                tenant=asked.args["tenant"],
                queue=callback.get("queue") or asked.args["queue"],
                payload=callback.get("payload"),
                priority=callback.get("priority", 0),
                available_at=now,
                max_acquisitions=callback.get("max_acquisitions") or self.max_acquisitions,
                created_at=now,
                ordering_seq=n,
                depends_on=tuple(sorted({str(item["item_id"]) for item in made} | set(named))),
                on_dependency_failure="run",
            )
            if not self._satisfied(joined):
                joined.state = "waiting"
            self._items[joined.item_id] = joined
        self._changed.notify_all()
        if callback is not None:
            return 201, {"items": made, "callback": joined.view()}
        if batch:
            return 201, {"items": made}
        # One item whose key an item held: that item, nothing created (200).
        return (201 if made[0]["item_id"] in new else 200), made[0]

    def _get_item(self, asked: Request) -> tuple[int, Any]:
        return 200, self._find(asked, asked.args["item"]).view()

    def _find(self, asked: Request, item_id: str) -> Record:
        record = self._items.get(item_id)
        if record is None or record.tenant != asked.args["tenant"]:
            detail = "No such item in this tenant."
            raise _Refusal(404, "item-not-found", "Item not found", detail, item_id=item_id)
        return record

    # -- leases --------------------------------------------------------------------

    def _ttl(self, body: dict[str, Any]) -> float:
        """The request's lease TTL (at most the policy's attempt timeout), else the default."""
        ttl = body.get("lease_ttl")
        if ttl is not None and ttl > self.leased.attempt_timeout:
            raise above(["body", "lease_ttl"], ttl, self.leased, "attempt_timeout")
        return float(ttl if ttl is not None else self.lease_ttl)

    def _limit(self, tenant: str, queue: str) -> int:
        return self._limits.get((tenant, queue), self.leased.concurrency)

    def _queue(self, tenant: str, queue: str) -> list[Record]:
        return [r for r in self._items.values() if r.tenant == tenant and r.queue == queue]

    def _live(self, tenant: str, queue: str, now: datetime) -> int:
        """The queue's leases that have not expired."""
        return sum(r.state == "leased" and not r.expired(now) for r in self._queue(tenant, queue))

    def _concurrency(self, asked: Request) -> tuple[int, Any]:
        tenant, queue = asked.args["tenant"], asked.args["queue"]
        live, limit = self._live(tenant, queue, self.clock.now()), self._limit(tenant, queue)
        answer: dict[str, Any] = {"tenant": tenant, "queue": queue, "limit": limit}
        return 200, answer | {"active_leases": live, "approval": None}

    def _acquire(self, asked: Request) -> tuple[int, Any]:
        body = asked.body
        worker, ttl, max_items = body["worker"], self._ttl(body), body.get("max_items", 1)
        ends = time.monotonic() + body.get("wait", 0)
        while True:
            leased = self._lease(asked, worker, ttl, max_items)
            left = ends - time.monotonic()
            if leased or left <= 0:
                return 200, {"leases": [r.lease() for r in leased]}
            self._changed.wait(left)  # the long poll: any change looks again

    def _lease(self, asked: Request, worker: str, ttl: float, max_items: int) -> list[Record]:
        """leased (expired) or ready (due) -> leased, fence + 1; one past its budget ->
        quarantined instead, and the next candidates are looked at."""
        tenant, queue, now = asked.args["tenant"], asked.args["queue"], self.clock.now()
        room = min(max_items, self._limit(tenant, queue) - self._live(tenant, queue, now))
        deadline = timedelta(seconds=self.leased.deadline)
        leased: list[Record] = []
        while room > 0 and not leased:
            mine = self._queue(tenant, queue)
            expired = [r for r in mine if r.state == "leased" and r.expired(now)]
            due = [r for r in mine if r.state == "ready" and r.available_at <= now]
            expired.sort(key=lambda r: (r.lease_expires_at or now, r.item_id))
            due.sort(key=lambda r: (-r.priority, r.available_at, r.item_id))
            picked = (expired + due)[:room]
            if not picked:
                break
            for record in picked:
                if record.state == "leased" and record.at_deadline():
                    # The attempt's failure: its holder never finished it.
                    at = f"{record.lease_deadline_at:%Y-%m-%dT%H:%M:%S.%fZ}"
                    record.last_failure = {
                        "class": "LeaseDeadlineExceeded",
                        "transient": True,
                        "message": f"the lease held by {record.lease_holder} ran to its"
                        f" deadline at {at}",
                    }
                if record.acquisition_count >= record.max_acquisitions:
                    self._quarantine(record, now, "acquisition budget exhausted")
                    continue
                record.state, record.fence = "leased", record.fence + 1
                record.acquisition_count += 1
                record.lease_holder, record.lease_client = worker, asked.caller
                record.lease_expires_at = now + min(timedelta(seconds=ttl), deadline)
                record.lease_deadline_at = now + deadline
                record.updated_at = now
                leased.append(record)
        leased.sort(key=lambda r: (-r.priority, r.available_at, r.item_id))
        return leased

    def _held(self, asked: Request, item_id: str, worker: str, fence: int) -> Record:
        """The item, when `worker` of the asking client holds its live lease under `fence`;
        else the server's refusal, in the server's order."""
        record, now = self._find(asked, item_id), self.clock.now()
        if record.state != "leased":
            detail = f"The item is {record.state}, not leased."
            raise conflict("item-not-leased", item_id, detail, state=record.state)
        if fence != record.fence:
            code = "stale-fence" if fence < record.fence else "fence-ahead"
            raise conflict(code, item_id, current_fence=record.fence)
        if record.lease_holder != worker or record.lease_client not in (None, asked.caller):
            raise conflict("not-lease-holder", item_id)
        if record.expired(now) and record.at_deadline():
            deadline = record.lease_deadline_at.isoformat()  # type: ignore[union-attr]
            raise conflict("lease-deadline-exceeded", item_id, lease_deadline_at=deadline)
        if record.expired(now):
            expired_at = record.lease_expires_at.isoformat()  # type: ignore[union-attr]
            raise conflict("lease-expired", item_id, expired_at=expired_at)
        return record

    def _heartbeat(self, asked: Request) -> tuple[int, Any]:
        worker, fence = asked.body["worker"], asked.body["fence"]
        return 200, self._extend(asked, asked.args["item"], worker, fence, self._ttl(asked.body))

    def _extend(
        self, asked: Request, item_id: str, worker: str, fence: int, ttl: float
    ) -> dict[str, Any]:
        """leased -> leased for `ttl` more seconds, never past the lease's deadline."""
        record = self._held(asked, item_id, worker, fence)
        now, deadline = self.clock.now(), record.lease_deadline_at
        assert deadline is not None
        record.lease_expires_at = min(now + timedelta(seconds=ttl), deadline)
        record.updated_at = now
        extended: dict[str, Any] = {"item_id": item_id, "fence": fence}
        return extended | {
            "lease_expires_at": record.lease_expires_at,
            "lease_deadline_at": deadline,
        }

    def _heartbeat_many(self, asked: Request) -> tuple[int, Any]:
        worker, ttl = asked.body["worker"], self._ttl(asked.body)
        return self._batch(
            asked, "leases", "extended", lambda item_id, fence, _: self._extend(
                asked, item_id, worker, fence, ttl
            ),
        )  # fmt: skip

    def _complete_many(self, asked: Request) -> tuple[int, Any]:
        worker = asked.body["worker"]
        return self._batch(
            asked, "completions", "completed", lambda item_id, fence, result: {
                "item": self._outcome(asked, item_id, worker, fence, "complete", {"result": result})
            },
        )  # fmt: skip

    def _batch(
        self,
        asked: Request,
        name: str,
        counted: str,
        one: Callable[[str, int, Any], dict[str, Any]],
    ) -> tuple[int, Any]:
        """Each entry under its own fence: its answer, or the problem a single request of it
        would have answered."""
        entries = [(e["item_id"], e["fence"], e.get("result")) for e in asked.body[name]]
        if len({item_id for item_id, _, _ in entries}) != len(entries):
            detail = f"Each item may appear once in a batch of {name}."
            raise _Refusal(422, "invalid-request", "Invalid request", detail)
        results = []
        for item_id, fence, result in entries:
            try:
                results.append({"item_id": item_id, "status": 200, **one(item_id, fence, result)})
            except _Refusal as refusal:
                problem = refusal.document(asked.path)
                results.append({"item_id": item_id, "status": refusal.status, "problem": problem})
        return 200, {counted: sum(r["status"] == 200 for r in results), "results": results}

    def _settle(self, asked: Request) -> tuple[int, Any]:
        body, action = asked.body, asked.args["action"]
        worker, fence = body["worker"], body["fence"]
        return 200, self._outcome(asked, asked.args["item"], worker, fence, action, body)

    def _outcome(
        self, asked: Request, item_id: str, worker: str, fence: int, action: str, body: Any
    ) -> dict[str, Any]:
        """complete, requeue or triage: the request is checked, then the holder guard."""
        failure: dict[str, Any] | None = None
        delay: float | None = 0.0
        decision = "requeue"
        if action != "complete":
            failure = self._failure(body, required=action == "triage")
            delay = self._delay(body)
        if action == "triage":
            decision = body["decision"]
            if decision == "quarantine" and delay != 0.0:
                raise invalid(["body", "delay"], "only with decision requeue")
        record, now = self._held(asked, item_id, worker, fence), self.clock.now()
        if action == "complete":
            record.result = body.get("result")
            record.release(now, "completed")
            self._next_in_line(record, now)
        elif decision == "quarantine":
            self._quarantine(record, now, "quarantined by triage", failure)
        elif action == "triage" and record.acquisition_count >= record.max_acquisitions:
            # No attempt left: this failure was its last.
            self._quarantine(record, now, "acquisition budget exhausted", failure)
        else:
            if delay is None:  # "backoff": doubling with each acquisition, up to the cap
                tries = max(record.acquisition_count - 1, 0)
                delay = min(self.retry_cap, self.retry_base * 2**tries)
            record.available_at = now + timedelta(seconds=delay)
            if failure is not None:
                record.last_failure = failure
            record.release(now, "ready")
        self._changed.notify_all()
        return record.view()

    def _line(self, record: Record) -> list[Record]:
        """The other items of `record`'s ordering key not finished, in their line's order."""
        return sorted(
            (
                r
                for r in self._items.values()
                if r is not record
                and (r.tenant, r.queue, r.ordering_key)
                == (record.tenant, record.queue, record.ordering_key)
                and r.state in ("waiting", "ready", "leased")
            ),
            key=lambda r: r.ordering_seq,
        )

    def _check_dependencies(self, tenant: str, spec: dict[str, Any], i: int, batch: bool) -> None:
        """As the server's admission refuses dependencies: each an item of the tenant, none
        with an ordering key, none failed for good under the rule `cancel`."""
        where = f"items[{i}]" if batch else "items[0]"
        for dep in spec.get("depends_on") or ():
            if str(dep).startswith("ref:"):
                continue  # an earlier item of this request, made with it
            found = self._items.get(str(dep))
            if found is None or found.tenant != tenant:
                detail = f"depends_on: no item {dep} in tenant {tenant}."
                raise _Refusal(422, "invalid-request", "Invalid request", detail)
            if spec.get("ordering_key") is not None:
                detail = f"{where}: an item with depends_on takes no ordering_key."
                raise _Refusal(422, "invalid-request", "Invalid request", detail)
            rule = spec.get("on_dependency_failure") or "cancel"
            if found.state in ("quarantined", "cancelled") and rule == "cancel":
                detail = (
                    f"{where}: its dependency {dep} is {found.state}"
                    " (on_dependency_failure cancel)."
                )
                raise _Refusal(422, "invalid-request", "Invalid request", detail)

    def _satisfied(self, record: Record) -> bool:
        """Every dependency completed (or, to run anyway, failed for good)."""
        done = {"completed"}
        if record.on_dependency_failure == "run":
            done |= {"quarantined", "cancelled"}
        return all(self._items[d].state in done for d in record.depends_on)

    def _release_dependents(self, record: Record, now: datetime) -> None:
        """`record` finished: each item waiting for it is ready once every dependency is
        completed, or, `record` failed for good, cancelled (its own dependents follow) or
        run anyway, as its rule says; under `wait` it waits (this double has no replay)."""
        for dependent in [r for r in self._items.values() if record.item_id in r.depends_on]:
            if dependent.state != "waiting":
                continue
            if record.state == "completed" or dependent.on_dependency_failure == "run":
                if self._satisfied(dependent):
                    dependent.state, dependent.updated_at = "ready", now
            elif dependent.on_dependency_failure == "cancel":
                dependent.state, dependent.updated_at = "cancelled", now
                self._release_dependents(dependent, now)

    def _next_in_line(self, record: Record, now: datetime) -> None:
        """`record` finished: the next waiting item of its ordering key is ready (a dead
        letter releases the key, as a queue's default `ordering_dead_letters` does), and so
        are the items that waited for it alone."""
        self._release_dependents(record, now)
        if record.ordering_key is None:
            return
        waiting = [r for r in self._line(record) if r.state == "waiting"]
        if waiting:
            waiting[0].state, waiting[0].updated_at = "ready", now

    @staticmethod
    def _failure(body: dict[str, Any], *, required: bool) -> dict[str, Any] | None:
        """The failure reported, as the item keeps it (`last_failure`)."""
        raw = body["failure"] if required else body.get("failure")
        if raw is None:
            return None
        failure: dict[str, Any] = {"class": raw["class"], "message": raw.get("message", "")}
        failure["transient"] = raw.get("transient", False)
        if raw.get("traceback") is not None:
            failure["traceback"] = raw["traceback"]
        return failure

    def _delay(self, body: dict[str, Any]) -> float | None:
        """Seconds, or None for "backoff"; above the policy's backoff cap: 422."""
        if body.get("delay") == "backoff":
            return None
        delay = float(body.get("delay", 0.0))
        if delay > self.leased.backoff_cap:
            raise above(["body", "delay"], delay, self.leased, "backoff_cap")
        return delay

    def _quarantine(
        self, record: Record, now: datetime, reason: str, failure: dict[str, Any] | None = None
    ) -> None:
        """-> quarantined, with an open dead letter."""
        if failure is not None:
            record.last_failure = failure
        record.release(now, "quarantined")
        self._next_in_line(record, now)
        letter: dict[str, Any] = {"dead_letter_id": str(uuid.uuid4()), "kind": "item"}
        letter |= {"item_id": record.item_id, "queue": record.queue, "reason": reason}
        letter |= {"last_failure": record.last_failure, "created_at": now}
        letter |= {"closed_at": None, "resolution": None}
        self._dead.append((record.tenant, letter))

    def _dependencies(self, asked: Request) -> tuple[int, Any]:
        """The items an item depends on, as they are now, in id order (the cursor: the last
        id of the page before); how many in all, and how many a waiting one waits for."""
        record = self._find(asked, asked.args["item"])
        limit = int(asked.query.get("limit", 100))
        after = asked.query.get("cursor") or ""
        ids = [d for d in sorted(record.depends_on) if d > after]
        page = ids[:limit]
        more = page[-1] if len(ids) > limit else None
        done = {"completed"} | (
            {"quarantined", "cancelled"} if record.on_dependency_failure == "run" else set()
        )
        unmet = [d for d in set(record.depends_on) if self._items[d].state not in done]
        return 200, {
            "items": [self._items[d].view() for d in page],
            "next_cursor": more,
            "total": len(set(record.depends_on)),
            "waiting_for": len(unmet) if record.state == "waiting" else 0,
        }

    def _dead_letters(self, asked: Request) -> tuple[int, Any]:
        """The tenant's dead letters, oldest first (all open: nothing replays them here)."""
        query = asked.query
        shown = query.get("status", "open") != "closed" and query.get("kind", "item") == "item"
        found = [
            letter
            for tenant, letter in self._dead
            if shown and tenant == asked.args["tenant"]
            and query.get("queue", letter["queue"]) == letter["queue"]
        ]  # fmt: skip
        return 200, {"dead_letters": found, "next_cursor": None}
