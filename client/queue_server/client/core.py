"""The SDK's one implementation of the API: every route as a flow, with no I/O (a catalogue,
one flow per route, so longer than 800 lines by design).

A flow is a generator: it builds the request (a `Call`: method, path, body,
query, headers, the attempt timeout and the call's reliability class), yields
it, receives the `Response` and parses it into the typed answer it returns.
It never sends anything itself, so one flow serves both faces:
`QueueClient` drives it with a blocking send, `AsyncQueueClient` with an
awaited one (httpx's auth flows have the same shape). Error answers are raised
by the face's send (`answer`) before the flow sees them; a flow that needs the
tenant asks the server once (`whoami`) through the same send.

Every effecting call carries an Idempotency-Key: generated once per logical
operation (or passed in) and reused on each retry of that same operation, so a
retry never makes a second effect. Only transient failures are retried, as the
call's class allows (`classes.py`).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import itertools
import os
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, TypeAlias, TypeVar
from urllib.parse import quote

import orjson
from pydantic import BaseModel

from queue_server.client import errors
from queue_server.client.classes import AV, CM, LW, RO, CallClass, call_classes
from queue_server.client.connection import Response, TransportFailure
from queue_server.client.models import (
    AdminKey,
    ApiKey,
    ApiKeyInfo,
    BatchEntry,
    BulkReplay,
    CancelledItems,
    Completion,
    Concurrency,
    DeadLetter,
    DeadLetterDetail,
    DeadLetterPage,
    DeletedItems,
    DependencyPage,
    FanIn,
    Heartbeat,
    Item,
    ItemPage,
    Lease,
    LedgerEvent,
    NewItem,
    PolicyHistory,
    PolicyVersion,
    QueueSettings,
    QueueStatus,
    RetriedItems,
    SpendApproval,
    SpendApprovals,
    Status,
    Tenant,
    Verification,
    WhoAmI,
    Workflow,
)
from queue_server.client.version import __version__
from queue_server.policy import OperationClass, ReliabilityPolicy, admit_operation, runtime_policy
from queue_server.wire import Checkpoint, Receipt, StaleReceipt, VerificationRun

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

DEFAULT_URL = "http://127.0.0.1:8080"
# At most this many admitted shapes (fences, in practice) are remembered at once.
ADMITTED_SHAPES = 1024
# The most items of one batch request, and the most one fan-in's callback waits for.
BATCH_MAX = 500
FAN_IN_MAX = 10_000
URL_ENV = "QUEUE_SERVER_URL"
KEY_ENV = "QUEUE_SERVER_KEY"
TENANT_ENV = "QUEUE_SERVER_TENANT"


@dataclass(frozen=True, slots=True)
class Call:
    """One request as a flow describes it; the face sends it (and retries it) as its class allows."""

    method: str
    path: str
    json: Any
    params: dict[str, Any] | None
    headers: dict[str, str] | None
    timeout: float  # per attempt: the class's attempt timeout plus any long poll
    call_class: CallClass
    # A worker's hot call (acquire, outcomes, heartbeats): the face may send it on the
    # transport's lean path; its flow reads only the status and the body.
    lean: bool = False


#: A call of the API: yields its request, receives the answer, returns the typed result.
Flow: TypeAlias = Generator[Call, Response, T]
#: A listing walked page by page: yields requests (answered) and the entries found (not).
Pages: TypeAlias = Generator[Call | T, Any, None]


def answer(response: Response) -> Response:
    """The response, or the typed exception of its problem when it is an error answer."""
    if response.status_code >= 400:
        raise errors.from_response(response)
    return response


def unreachable(url: str, exc: TransportFailure) -> errors.ConnectionFailedError:
    return errors.ConnectionFailedError(url, exc)


def from_environment(
    url: str | None, key: str | None, tenant: str | None
) -> tuple[str, str | None, str | None]:
    """Arguments win; else QUEUE_SERVER_URL, QUEUE_SERVER_KEY and QUEUE_SERVER_TENANT."""
    return (
        (url or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/"),
        key or os.environ.get(KEY_ENV) or None,
        tenant or os.environ.get(TENANT_ENV) or None,
    )


class _KeySource:
    """Idempotency keys unique to this process: 80 random bits drawn once (again in a
    forked child), then a counter. A worker mints a key per item; `uuid4` asked the
    kernel for randomness each time, and each such call let the other threads take the
    interpreter lock (measured: a third of a busy thread worker's CPU)."""

    def __init__(self) -> None:
        self.reset()
        os.register_at_fork(after_in_child=self.reset)

    def reset(self) -> None:
        self._prefix = f"qs-{os.urandom(10).hex()}"
        self._counter = itertools.count()

    def __call__(self) -> str:
        return f"{self._prefix}{next(self._counter):012x}"


#: A new idempotency key: `qs-` and 32 hex digits, never the same twice.
new_idempotency_key = _KeySource()


def is_transient(exc: BaseException) -> bool:
    """Failures worth retrying with the same request and key."""
    if isinstance(exc, TransportFailure):
        return True
    if isinstance(exc, errors.ProblemError):
        if exc.status == 503 or isinstance(exc, errors.IdempotencyKeyInFlightError):
            return True
        return exc.status == 429 and exc.retry_after is not None
    return False


def item_filter(
    queue: str | None,
    state: str | None,
    created_after: datetime | None,
    created_before: datetime | None,
    payload: Any,
) -> dict[str, Any]:
    """The items filter as `POST .../items:cancel` takes it (only the fields given)."""
    match: dict[str, Any] = {"queue": queue, "state": state}
    match["created_after"] = created_after.isoformat() if created_after else None
    match["created_before"] = created_before.isoformat() if created_before else None
    match = {k: v for k, v in match.items() if v is not None}
    if payload is not None:
        match["payload"] = payload
    return match


def item_query(
    queue: str | None,
    state: str | None,
    created_after: datetime | None,
    created_before: datetime | None,
    payload: Any,
) -> dict[str, Any]:
    """The items filter as `GET .../items` takes it: the payload as a JSON string."""
    query = item_filter(queue, state, created_after, created_before, None)
    if payload is not None:
        query["payload"] = orjson.dumps(payload).decode()
    return query


def own_tenant(me: WhoAmI) -> str:
    """The tenant of the key that asked; an admin key has none."""
    if not me.tenant:
        raise errors.NoTenantError()
    return me.tenant


def batch_key(keys: Sequence[str]) -> str:
    """One key for a batch, from its entries' own keys: the same entries, the same key."""
    digest = hashlib.sha256("\n".join(sorted(keys)).encode()).hexdigest()
    return f"qs-batch-{digest[:48]}"


def _item_body(item: NewItem) -> dict[str, Any]:
    body = item.model_dump(exclude_none=True)
    body.setdefault("payload", None)
    return body


class _Batch(BaseModel):
    items: list[Item]


class _Ledger(BaseModel):
    events: list[LedgerEvent]


class _Leases(BaseModel):
    leases: list[Lease]


class _Entries(BaseModel):
    results: list[BatchEntry]


#: One completion of a batch as a worker sends it: item, fence, result, its own key.
CompletionEntry: TypeAlias = tuple[str, int, Any, str]


@dataclass(frozen=True, slots=True)
class EntryAnswer:
    """One entry's answer in a batch as a worker reads it: its status and its problem."""

    item_id: str
    status: int
    problem: dict[str, Any] | None = None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def error(self) -> errors.ProblemError:
        """The typed exception a single request would have raised for this entry."""
        return errors.problem_error(self.status, self.problem or {})


def entry_answers(content: bytes) -> list[EntryAnswer]:
    """A batch answer's entries, their items unread: pydantic validated every field of
    every item, a few microseconds of a worker's item for fields it never reads."""
    results = orjson.loads(content).get("results")
    if not isinstance(results, list):
        raise ValueError("a batch answer without its results")
    answers = []
    for entry in results:
        item_id, status = entry.get("item_id"), entry.get("status")
        problem = entry.get("problem")
        if (
            type(item_id) is not str
            or type(status) is not int
            or not (problem is None or type(problem) is dict)
        ):
            raise ValueError(f"a malformed batch entry: {entry!r:.200}")
        answers.append(EntryAnswer(item_id, status, problem))
    return answers


class ClientCore:
    """What a client of one queue server knows, and every route of its API as a flow.

    The faces (`QueueClient`, `AsyncQueueClient`) hold one and expose each flow as
    a method that sends its calls; see their docstrings for the arguments.
    """

    def __init__(
        self,
        url: str | None,
        key: str | None,
        *,
        tenant: str | None,
        timeout: float | None,
        attempts: int | None,
        max_wait: float | None,
        policy: ReliabilityPolicy | None,
    ) -> None:
        self.url, key, self.tenant = from_environment(url, key, tenant)
        # Every call is classified; its class's cells (from the loaded policy) give its
        # timeout and retries; `timeout`, `attempts` and `max_wait` may only lower them.
        self.reliability_policy = policy or runtime_policy()
        self.calls = call_classes(
            self.reliability_policy, attempts=attempts, timeout=timeout, max_wait=max_wait
        )
        # The shapes of leased work admitted under that policy (`_admit`).
        self._admitted: set[tuple[type, int, bool, bool]] = set()
        self.headers = {"User-Agent": f"queue-server-client/{__version__}"}
        if key:
            self.headers["Authorization"] = f"Bearer {key}"

    # -- plumbing ------------------------------------------------------------

    def _tenant(self, tenant: str | None) -> Flow[str]:
        """The tenant named, else the client's, else the key's own (asked of the server once).

        Two first calls at once may both ask; they learn the same tenant.
        """
        chosen = tenant or self.tenant
        if chosen:
            return chosen
        me = yield from self.whoami()
        if not self.tenant:
            self.tenant = own_tenant(me)
        return self.tenant

    def _at(self, tenant: str | None, suffix: str) -> Flow[str]:
        """The path of `suffix` under the tenant's resources."""
        return f"/v1/tenants/{(yield from self._tenant(tenant))}{suffix}"

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        operation: OperationClass = RO,
        long_poll: float = 0.0,
        lean: bool = False,
    ) -> Flow[Response]:
        """One logical request of class `operation` (reads by default): each attempt within the
        class's attempt timeout (plus `long_poll`), retried only as the class allows and
        always with the same key; errors raised."""
        call_class = self.calls[operation]
        query = {k: v for k, v in params.items() if v is not None} if params else None
        return (
            yield Call(
                method,
                path,
                json,
                query or None,
                {"Idempotency-Key": idempotency_key} if idempotency_key else None,
                call_class.attempt_timeout + long_poll,
                call_class,
                lean,
            )
        )

    def _get(self, /, model: type[M], path: str, **params: Any) -> Flow[M]:
        response = yield from self.request("GET", path, params=params)
        return model.model_validate_json(response.content)

    def _effect(
        self,
        model: type[M],
        method: str,
        path: str,
        body: Any,
        key: str | None,
        operation: OperationClass = CM,
        lean: bool = False,
    ) -> Flow[M]:
        response = yield from self.request(
            method,
            path,
            json=body,
            idempotency_key=key or new_idempotency_key(),
            operation=operation,
            lean=lean,
        )
        return model.model_validate_json(response.content)

    def _admit(self, item_id: str, fence: int, key: str) -> None:
        """Leased work is admitted before dispatch: its key, its item and its current fence.

        Under the client's one policy, admission reads of these only whether the key and
        the item are given and the fence (its type and value): a shape admitted once is
        admitted again without asking (about 5 us each, and a worker admits every item).
        A refusal is never remembered: it is raised again each time.
        """
        shape = (type(fence), fence, bool(key.strip()), bool(item_id.strip()))
        if shape in self._admitted:
            return
        admit_operation(
            LW,
            idempotency_key=key,
            outcome_ref=item_id,
            fence=fence,
            policy=self.reliability_policy,
        )
        if len(self._admitted) >= ADMITTED_SHAPES:
            self._admitted.clear()
        self._admitted.add(shape)

    # -- service -------------------------------------------------------------

    def whoami(self) -> Flow[WhoAmI]:
        return (yield from self._get(WhoAmI, "/v1/whoami"))

    # -- tenants and keys ----------------------------------------------------

    def put_tenant(
        self,
        tenant: str,
        *,
        backlog_cap: int,
        default_max_acquisitions: int = 5,
        default_lease_ttl: float = 30.0,
        retention: float | None = None,
    ) -> Flow[Tenant]:
        """Create the tenant or replace its settings; `retention` in seconds (default 7 days)."""
        body: dict[str, Any] = {
            "backlog_cap": backlog_cap,
            "default_max_acquisitions": default_max_acquisitions,
            "default_lease_ttl": default_lease_ttl,
        }
        if retention is not None:
            body["retention"] = retention
        response = yield from self.request("PUT", f"/v1/tenants/{tenant}", json=body, operation=CM)
        return Tenant.model_validate_json(response.content)

    def get_tenant(self, tenant: str | None = None) -> Flow[Tenant]:
        return (yield from self._get(Tenant, (yield from self._at(tenant, ""))))

    def create_key(
        self,
        role: Literal["worker", "operator"],
        tenant: str | None = None,
        name: str | None = None,
    ) -> Flow[ApiKey]:
        """A new key of the tenant (admin); `name` is shown beside its id in ledgers."""
        path = yield from self._at(tenant, "/keys")
        body = {"role": role, **({"name": name} if name is not None else {})}
        response = yield from self.request("POST", path, json=body, operation=CM)
        return ApiKey.model_validate_json(response.content)

    def list_tenants(self) -> Flow[list[Tenant]]:
        """Every tenant, by name (admin)."""
        found: list[Tenant] = []
        cursor: str | None = None
        while True:
            params = {"limit": 500, **({"cursor": cursor} if cursor else {})}
            page = (yield from self.request("GET", "/v1/tenants", params=params)).json()
            found += [Tenant.model_validate(t) for t in page["tenants"]]
            cursor = page["next_cursor"]
            if not cursor:
                return found

    def list_keys(
        self, tenant: str | None = None, *, revoked: bool = False
    ) -> Flow[list[ApiKeyInfo]]:
        """The tenant's keys, oldest first (admin); revoked ones too with `revoked=True`."""
        path = yield from self._at(tenant, "/keys")
        params = {"revoked": "true"} if revoked else None
        response = yield from self.request("GET", path, params=params)
        return [ApiKeyInfo.model_validate(k) for k in response.json()["keys"]]

    def revoke_key(self, key_id: str, tenant: str | None = None) -> Flow[None]:
        path = yield from self._at(tenant, f"/keys/{key_id}")
        yield from self.request("DELETE", path, operation=CM)

    def create_admin_key(self) -> Flow[AdminKey]:
        """Another admin key (admin); the secret is shown once."""
        response = yield from self.request("POST", "/v1/admin-keys")
        return AdminKey.model_validate_json(response.content)

    def revoke_admin_key(self, key_id: str) -> Flow[None]:
        """Revoke an admin key at once (admin); the last active one cannot be."""
        yield from self.request("DELETE", f"/v1/admin-keys/{key_id}")

    # -- work items ----------------------------------------------------------

    def enqueue(
        self,
        queue: str,
        payload: Any,
        *,
        priority: int = 0,
        delay: float = 0,
        max_acquisitions: int | None = None,
        idempotency_key: str | None = None,
        tenant: str | None = None,
        unique_key: str | None = None,
        ordering_key: str | None = None,
        partition_key: str | None = None,
        unique_for: float | None = None,
        depends_on: Sequence[str] | None = None,
        on_dependency_failure: Literal["cancel", "run", "wait"] | None = None,
    ) -> Flow[Item]:
        """Enqueue one item. With `unique_key`: while an item of the queue with that key is
        ready or leased, none is made and that item is answered (its `item_id` is older); with
        `unique_for` seconds too, nor while one was made within that period, in any state.
        With `ordering_key`: the queue's items with that key are handed out one at a time, in
        enqueue order; this one is `waiting` while one before it is not finished. With
        `partition_key`: a queue's rate limit per partition key counts its leases against it.
        With `depends_on` (ids of items of the tenant): `waiting` until every one has
        completed; `on_dependency_failure` says what a dependency's dead letter or cancel
        does to it (`cancel`, the default, `run` anyway, or `wait` for its replay)."""
        body = NewItem(
            payload=payload,
            priority=priority,
            delay=delay,
            max_acquisitions=max_acquisitions,
            unique_key=unique_key,
            ordering_key=ordering_key,
            partition_key=partition_key,
            unique_for=unique_for,
            depends_on=None if depends_on is None else list(depends_on),
            on_dependency_failure=on_dependency_failure,
        ).model_dump(exclude_none=True)
        body.setdefault("payload", None)
        path = yield from self._at(tenant, f"/queues/{queue}/items")
        return (yield from self._effect(Item, "POST", path, body, idempotency_key))

    def enqueue_batch(
        self,
        queue: str,
        items: Sequence[NewItem],
        *,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Flow[list[Item]]:
        """Enqueue 1 to 500 items at once, all or nothing against the backlog cap."""
        body = {"items": [_item_body(item) for item in items]}
        path = yield from self._at(tenant, f"/queues/{queue}/items:batch")
        return (yield from self._effect(_Batch, "POST", path, body, idempotency_key)).items

    def fan_in(
        self,
        queue: str,
        items: Sequence[NewItem],
        callback: NewItem,
        *,
        callback_queue: str | None = None,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Flow[FanIn]:
        """Enqueue 1 to 10,000 items and a callback item (its payload, priority and budget)
        that waits until every one of them is finished, completed or not; its worker reads
        their outcomes with `list_dependencies`. `callback_queue`: default, `queue`.

        Above 500 items, the items go in batches of 500 and the last batch's callback names
        the earlier ones: each batch is its own request, under `idempotency_key` and the
        batch's number, so a call repeated with the same key after a failure makes nothing
        twice and one callback."""
        if not 1 <= len(items) <= FAN_IN_MAX:
            raise ValueError(f"a fan-in has 1 to {FAN_IN_MAX:,} items, not {len(items):,}")
        spec = {
            "queue": callback_queue,
            "payload": callback.payload,
            "priority": callback.priority,
            "max_acquisitions": callback.max_acquisitions,
        }
        path = yield from self._at(tenant, f"/queues/{queue}/items:batch")
        base = idempotency_key or new_idempotency_key()
        chunks = [items[at : at + BATCH_MAX] for at in range(0, len(items), BATCH_MAX)]
        earlier: list[Item] = []
        for n, chunk in enumerate(chunks[:-1], start=1):
            plain = {"items": [_item_body(item) for item in chunk]}
            made = yield from self._effect(_Batch, "POST", path, plain, f"{base}/{n}")
            earlier += made.items
        body: dict[str, Any] = {
            "items": [_item_body(item) for item in chunks[-1]],
            "callback": {k: v for k, v in spec.items() if v is not None or k == "payload"}
            | ({"depends_on": [item.item_id for item in earlier]} if earlier else {}),
        }
        key = base if len(chunks) == 1 else f"{base}/{len(chunks)}"
        joined = yield from self._effect(FanIn, "POST", path, body, key)
        return FanIn(items=earlier + joined.items, callback=joined.callback)

    def list_dependencies(
        self,
        item_id: str,
        *,
        limit: int = 100,
        cursor: str | None = None,
        tenant: str | None = None,
    ) -> Flow[DependencyPage]:
        """The items `item_id` depends on, as they are now (a page in id order)."""
        path = yield from self._at(tenant, f"/items/{item_id}/dependencies")
        return (yield from self._get(DependencyPage, path, limit=limit, cursor=cursor))

    def get_workflow(self, item_id: str, tenant: str | None = None) -> Flow[Workflow]:
        """The graph of dependencies the item is part of, each item with its state."""
        path = yield from self._at(tenant, f"/items/{item_id}/workflow")
        return (yield from self._get(Workflow, path))

    def get_item(self, item_id: str, tenant: str | None = None) -> Flow[Item]:
        return (yield from self._get(Item, (yield from self._at(tenant, f"/items/{item_id}"))))

    def ledger(self, item_id: str, tenant: str | None = None) -> Flow[list[LedgerEvent]]:
        path = yield from self._at(tenant, f"/items/{item_id}/ledger")
        return (yield from self._get(_Ledger, path)).events

    # -- leases --------------------------------------------------------------

    def acquire(
        self,
        queue: str,
        *,
        worker: str,
        lease_ttl: float | None = None,
        max_items: int = 1,
        wait: float = 0,
        tenant: str | None = None,
    ) -> Flow[list[Lease]]:
        """Lease up to `max_items` due items, long-polling up to `wait` seconds."""
        body: dict[str, Any] = {"worker": worker, "max_items": max_items, "wait": wait}
        if lease_ttl is not None:
            body["lease_ttl"] = lease_ttl
        path = yield from self._at(tenant, f"/queues/{queue}/leases")
        response = yield from self.request(
            "POST", path, json=body, operation=LW, long_poll=wait, lean=True
        )
        return _Leases.model_validate_json(response.content).leases

    def heartbeat(
        self,
        item_id: str,
        *,
        worker: str,
        fence: int,
        lease_ttl: float | None = None,
        tenant: str | None = None,
    ) -> Flow[Heartbeat]:
        body: dict[str, Any] = {"worker": worker, "fence": fence}
        if lease_ttl is not None:
            body["lease_ttl"] = lease_ttl
        self._admit(item_id, fence, f"heartbeat:{item_id}:{fence}")
        path = yield from self._at(tenant, f"/items/{item_id}/heartbeat")
        response = yield from self.request("POST", path, json=body, operation=LW, lean=True)
        return Heartbeat.model_validate_json(response.content)

    def complete(
        self,
        item_id: str,
        *,
        worker: str,
        fence: int,
        result: Any = None,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Flow[Item]:
        body = {"worker": worker, "fence": fence, "result": result}
        key = idempotency_key or new_idempotency_key()
        self._admit(item_id, fence, key)
        path = yield from self._at(tenant, f"/items/{item_id}/complete")
        return (yield from self._effect(Item, "POST", path, body, key, LW, lean=True))

    def requeue(
        self,
        item_id: str,
        *,
        worker: str,
        fence: int,
        reason: str = "",
        delay: float | Literal["backoff"] = 0.0,
        failure_class: str | None = None,
        traceback: str | None = None,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Flow[Item]:
        """Give the item back, due after `delay` seconds, or "backoff": the server's delay
        from the queue's retry settings and the item's acquisition count. With
        `failure_class` or `traceback` (at most 16 KiB), the server keeps the failure (the
        reason its message) as the item's last failure and in its ledger."""
        body: dict[str, Any] = {"worker": worker, "fence": fence, "reason": reason}
        if delay:
            body["delay"] = delay
        if failure_class is not None or traceback is not None:
            failure: dict[str, Any] = {"class": failure_class or "Requeue", "message": reason}
            if traceback is not None:
                failure["traceback"] = traceback
            body["failure"] = failure
        key = idempotency_key or new_idempotency_key()
        self._admit(item_id, fence, key)
        path = yield from self._at(tenant, f"/items/{item_id}/requeue")
        return (yield from self._effect(Item, "POST", path, body, key, LW, lean=True))

    def triage(
        self,
        item_id: str,
        *,
        worker: str,
        fence: int,
        failure_class: str,
        message: str = "",
        transient: bool = False,
        traceback: str | None = None,
        decision: Literal["requeue", "quarantine"] = "requeue",
        delay: float | Literal["backoff"] = 0.0,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Flow[Item]:
        """Record the failure (with `traceback`, at most 16 KiB, kept in the item and its
        ledger); requeue after `delay` seconds (or "backoff", the server's delay for the
        item's acquisition count), or quarantine."""
        failure: dict[str, Any] = {
            "class": failure_class,
            "message": message,
            "transient": transient,
        }
        if traceback is not None:
            failure["traceback"] = traceback
        body = {"worker": worker, "fence": fence, "failure": failure, "decision": decision}
        if delay:
            body["delay"] = delay
        key = idempotency_key or new_idempotency_key()
        self._admit(item_id, fence, key)
        path = yield from self._at(tenant, f"/items/{item_id}/triage")
        return (yield from self._effect(Item, "POST", path, body, key, LW, lean=True))

    def heartbeat_many(
        self,
        leases: Sequence[tuple[str, int]],
        *,
        worker: str,
        lease_ttl: float | None = None,
        tenant: str | None = None,
    ) -> Flow[list[BatchEntry]]:
        """Extend up to 500 leases of one worker in one request; one answer per (item, fence)."""
        body: dict[str, Any] = {
            "worker": worker,
            "leases": [{"item_id": item_id, "fence": fence} for item_id, fence in leases],
        }
        if lease_ttl is not None:
            body["lease_ttl"] = lease_ttl
        path = yield from self._at(tenant, "/leases:heartbeat")
        response = yield from self.request("POST", path, json=body, lean=True)
        return _Entries.model_validate_json(response.content).results

    def complete_many(
        self,
        completions: Sequence[Completion],
        *,
        worker: str,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Flow[list[BatchEntry]]:
        """Complete up to 500 items of one worker in one request, each under its own fence.

        One answer per entry, in order: the item, or the problem a single complete
        would have answered. Without `idempotency_key`, the batch's key is derived
        from its entries' own keys, so the same entries always make the same request.
        """
        entries = [(c.item_id, c.fence, c.result, c.idempotency_key) for c in completions]
        response = yield from self._completions(entries, worker, idempotency_key, tenant)
        return _Entries.model_validate_json(response.content).results

    def _settle_many(
        self, entries: Sequence[CompletionEntry], *, worker: str, tenant: str | None = None
    ) -> Flow[list[EntryAnswer]]:
        """`complete_many` as a worker sends it: each entry (item, fence, result, its own
        key); each answer's status and problem, its item left unread (a worker needs none)."""
        response = yield from self._completions(entries, worker, None, tenant)
        return entry_answers(response.content)

    def _completions(
        self,
        entries: Sequence[CompletionEntry],
        worker: str,
        idempotency_key: str | None,
        tenant: str | None,
    ) -> Flow[Response]:
        body = {
            "worker": worker,
            "completions": [
                {"item_id": item_id, "fence": fence, "result": result}
                for item_id, fence, result, _ in entries
            ],
        }
        # Every entry is admitted on its own: its key, its item and its current fence.
        for item_id, fence, _, key in entries:
            self._admit(item_id, fence, key)
        key = idempotency_key or batch_key([key for *_, key in entries])
        path = yield from self._at(tenant, "/completions")
        return (
            yield from self.request(
                "POST", path, json=body, idempotency_key=key, operation=LW, lean=True
            )
        )

    # -- spend approvals -----------------------------------------------------

    def approve_spend(
        self,
        queue: str,
        *,
        max_concurrency: int,
        expires_at: datetime,
        reason: str,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Flow[SpendApproval]:
        """Let the queue lease up to `max_concurrency` items at once until `expires_at` (at
        most a year ahead, at most the policy's max-approved); this client's key approves."""
        body = {
            "max_concurrency": max_concurrency,
            "expires_at": expires_at.isoformat(),
            "reason": reason,
        }
        path = yield from self._at(tenant, f"/queues/{queue}/spend-approvals")
        return (yield from self._effect(SpendApproval, "POST", path, body, idempotency_key))

    def spend_approvals(self, queue: str, tenant: str | None = None) -> Flow[list[SpendApproval]]:
        """The queue's approvals, live, expired and revoked, newest first."""
        path = yield from self._at(tenant, f"/queues/{queue}/spend-approvals")
        return (yield from self._get(SpendApprovals, path)).approvals

    def revoke_spend_approval(
        self,
        queue: str,
        approval_id: str,
        *,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Flow[SpendApproval]:
        """The approval no longer raises the queue's limit from the next acquire on;
        revoking it again answers it as first revoked."""
        path = yield from self._at(tenant, f"/queues/{queue}/spend-approvals/{approval_id}")
        return (yield from self._effect(SpendApproval, "DELETE", path, None, idempotency_key))

    def concurrency(self, queue: str, tenant: str | None = None) -> Flow[Concurrency]:
        """The queue's limit and what sets it; `expiring` and `warning` while the approval
        behind it ends within the server's warning window."""
        path = yield from self._at(tenant, f"/queues/{queue}/concurrency")
        return (yield from self._get(Concurrency, path))

    def set_concurrency(
        self,
        queue: str,
        concurrency: int | None,
        *,
        reason: str = "",
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Flow[Concurrency]:
        """The queue leases at most `concurrency` at once from the next acquire on (an
        operator key), at most its approved limit; None follows the approved limit."""
        body = {"concurrency": concurrency, "reason": reason}
        path = yield from self._at(tenant, f"/queues/{queue}/concurrency")
        return (yield from self._effect(Concurrency, "PUT", path, body, idempotency_key))

    # -- operators -----------------------------------------------------------

    def status(self, tenant: str | None = None) -> Flow[Status]:
        return (yield from self._get(Status, (yield from self._at(tenant, "/queues"))))

    def list_items(
        self,
        *,
        queue: str | None = None,
        state: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        payload: Any = None,
        limit: int = 50,
        cursor: str | None = None,
        sort: str = "created",
        tenant: str | None = None,
    ) -> Flow[ItemPage]:
        """One page of items in `sort`'s order: created (oldest first), priority or attempts,
        each then by creation, descending with a leading "-" ("-created": newest first);
        `payload` is a document the payload must contain. A cursor continues its own order."""
        query = item_query(queue, state, created_after, created_before, payload)
        if sort != "created":
            query["sort"] = sort
        path = yield from self._at(tenant, "/items")
        return (yield from self._get(ItemPage, path, **query, limit=limit, cursor=cursor))

    def iter_items(
        self, /, *, page_size: int = 200, tenant: str | None = None, **filters: Any
    ) -> Pages[Item]:
        """Every matching item, page by page, in `list_items`'s order (its filters and
        `sort`; oldest first by default)."""
        cursor: str | None = None
        while True:
            page = yield from self.list_items(
                limit=page_size, cursor=cursor, tenant=tenant, **filters
            )
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def cancel_item(
        self,
        item_id: str,
        *,
        reason: str = "",
        descendants: bool = False,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Flow[Item]:
        """Cancel a waiting, ready, leased or quarantined item (its holder is refused from
        then on); with `descendants`, every unfinished item that depends on it too."""
        path = yield from self._at(tenant, f"/items/{item_id}/cancel")
        body: dict[str, Any] = {"reason": reason}
        if descendants:
            body["descendants"] = True
        return (yield from self._effect(Item, "POST", path, body, idempotency_key))

    def cancel_items(
        self,
        *,
        queue: str | None = None,
        state: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        payload: Any = None,
        reason: str = "",
        limit: int = 100,
        cursor: str | None = None,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Flow[CancelledItems]:
        """Cancel the cancellable items of one page of the filter; resume with `next_cursor`."""
        match = item_filter(queue, state, created_after, created_before, payload)
        body: dict[str, Any] = {"filter": match, "reason": reason, "limit": limit}
        if cursor is not None:
            body["cursor"] = cursor
        path = yield from self._at(tenant, "/items:cancel")
        return (yield from self._effect(CancelledItems, "POST", path, body, idempotency_key))

    def retry_items(
        self,
        *,
        state: str,
        queue: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        payload: Any = None,
        item_ids: Sequence[str] | None = None,
        limit: int = 100,
        cursor: str | None = None,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Flow[RetriedItems]:
        """Make the quarantined or cancelled (`state`) items of one page of the filter ready
        now, under the backlog cap; resume with `next_cursor`. `item_ids`: only these
        (a selection, at most 1,000), each still matching the rest of the filter."""
        match = item_filter(queue, state, created_after, created_before, payload)
        if item_ids is not None:
            match["item_ids"] = list(item_ids)
        return (
            yield from self._bulk(
                "retry", RetriedItems, match, limit, cursor, idempotency_key, tenant
            )
        )

    def delete_items(
        self,
        *,
        state: str,
        queue: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        payload: Any = None,
        item_ids: Sequence[str] | None = None,
        limit: int = 100,
        cursor: str | None = None,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Flow[DeletedItems]:
        """Delete the completed or cancelled (`state`) items of one page of the filter with
        their ledgers; resume with `next_cursor`. `item_ids`: only these (a selection, at
        most 1,000), each still matching the rest of the filter."""
        match = item_filter(queue, state, created_after, created_before, payload)
        if item_ids is not None:
            match["item_ids"] = list(item_ids)
        return (
            yield from self._bulk(
                "delete", DeletedItems, match, limit, cursor, idempotency_key, tenant
            )
        )

    def _bulk(
        self,
        action: str,
        model: type[M],
        match: dict[str, Any],
        limit: int,
        cursor: str | None,
        idempotency_key: str | None,
        tenant: str | None,
    ) -> Flow[M]:
        """One page of a bulk action on the items a filter matches (items:retry, :delete)."""
        body: dict[str, Any] = {"filter": match, "limit": limit}
        if cursor is not None:
            body["cursor"] = cursor
        path = yield from self._at(tenant, f"/items:{action}")
        return (yield from self._effect(model, "POST", path, body, idempotency_key))

    def pause_queue(
        self,
        queue: str,
        *,
        reason: str = "",
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Flow[QueueStatus]:
        """Stop handing out leases of the queue; enqueues are still admitted."""
        path = yield from self._at(tenant, f"/queues/{queue}/pause")
        body = {"reason": reason}
        return (yield from self._effect(QueueStatus, "POST", path, body, idempotency_key))

    def resume_queue(
        self,
        queue: str,
        *,
        reason: str = "",
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Flow[QueueStatus]:
        """Hand out leases of the queue again."""
        path = yield from self._at(tenant, f"/queues/{queue}/resume")
        body = {"reason": reason}
        return (yield from self._effect(QueueStatus, "POST", path, body, idempotency_key))

    def queue_settings(self, queue: str, tenant: str | None = None) -> Flow[QueueSettings]:
        """The queue's effective lease TTL, deadline, acquisition budget and retry backoff,
        each with where it comes from (queue, tenant, policy or default)."""
        path = yield from self._at(tenant, f"/queues/{queue}/settings")
        return (yield from self._get(QueueSettings, path))

    def put_queue_settings(
        self,
        queue: str,
        *,
        lease_ttl: float | None = None,
        deadline: float | None = None,
        max_acquisitions: int | None = None,
        retry_base: float | None = None,
        retry_cap: float | None = None,
        retry_jitter: bool | None = None,
        ordering_dead_letters: Literal["release", "hold"] | None = None,
        rate_limit: int | None = None,
        rate_per: float | None = None,
        rate_partitioned: bool = False,
        fairness: Literal["arrival", "partition_key"] | None = None,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Flow[QueueSettings]:
        """Replace the queue's own settings (operator): None inherits the tenant's default,
        else the policy's; a value above the loaded policy's envelope is refused.
        `ordering_dead_letters`: whether an item of an ordering key that goes to dead letters
        lets the next of its key go (`release`, the default) or holds the key (`hold`).
        `rate_limit` leases at most in any `rate_per` seconds, over the queue or per partition
        key (`rate_partitioned`); None: no rate limit. `fairness`: how a priority's due items
        are handed out, the one due longest first (`arrival`, the default) or round-robin
        between their partition keys (`partition_key`)."""
        path = yield from self._at(tenant, f"/queues/{queue}/settings")
        body = {
            "lease_ttl": lease_ttl,
            "deadline": deadline,
            "max_acquisitions": max_acquisitions,
            "retry": {"base": retry_base, "cap": retry_cap, "jitter": retry_jitter},
            "ordering_dead_letters": ordering_dead_letters,
            "fairness": fairness,
            "rate_limit": (
                None
                if rate_limit is None
                else {"limit": rate_limit, "per": rate_per, "partitioned": rate_partitioned}
            ),
        }
        return (yield from self._effect(QueueSettings, "PUT", path, body, idempotency_key))

    def list_dead_letters(
        self,
        *,
        queue: str | None = None,
        kind: Literal["item", "delivery"] | None = None,
        status: Literal["open", "closed", "all"] = "open",
        limit: int = 50,
        cursor: str | None = None,
        tenant: str | None = None,
    ) -> Flow[DeadLetterPage]:
        path = yield from self._at(tenant, "/dead-letters")
        return (
            yield from self._get(
                DeadLetterPage,
                path,
                queue=queue,
                kind=kind,
                status=status,
                limit=limit,
                cursor=cursor,
            )
        )

    def iter_dead_letters(
        self,
        *,
        queue: str | None = None,
        kind: Literal["item", "delivery"] | None = None,
        status: Literal["open", "closed", "all"] = "open",
        page_size: int = 200,
        tenant: str | None = None,
    ) -> Pages[DeadLetter]:
        """Every matching dead letter, oldest first, page by page."""
        cursor: str | None = None
        while True:
            page = yield from self.list_dead_letters(
                queue=queue, kind=kind, status=status, limit=page_size, cursor=cursor, tenant=tenant
            )
            yield from page.dead_letters
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def show_dead_letter(
        self, dead_letter_id: str, tenant: str | None = None
    ) -> Flow[DeadLetterDetail]:
        path = yield from self._at(tenant, f"/dead-letters/{dead_letter_id}")
        return (yield from self._get(DeadLetterDetail, path))

    def replay(
        self,
        dead_letter_id: str,
        *,
        max_acquisitions: int | None = None,
        descendants: bool = False,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Flow[Item]:
        """Put the dead letter's item back in its queue; with `descendants`, the workflow goes
        on from it: the items below it that its failure cancelled wait for it again."""
        body: dict[str, Any] = {}
        if max_acquisitions is not None:
            body["max_acquisitions"] = max_acquisitions
        if descendants:
            body["descendants"] = True
        path = yield from self._at(tenant, f"/dead-letters/{dead_letter_id}/replay")
        return (yield from self._effect(Item, "POST", path, body, idempotency_key))

    def discard(
        self,
        dead_letter_id: str,
        *,
        reason: str = "",
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Flow[Item]:
        path = yield from self._at(tenant, f"/dead-letters/{dead_letter_id}/discard")
        return (yield from self._effect(Item, "POST", path, {"reason": reason}, idempotency_key))

    def replay_queue(
        self,
        queue: str,
        *,
        limit: int = 100,
        max_acquisitions: int | None = None,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Flow[BulkReplay]:
        """Replay up to `limit` (at most 100) of the queue's oldest open item dead letters."""
        body: dict[str, Any] = {"limit": limit}
        if max_acquisitions is not None:
            body["max_acquisitions"] = max_acquisitions
        path = yield from self._at(tenant, f"/queues/{queue}/dead-letters:replay")
        return (yield from self._effect(BulkReplay, "POST", path, body, idempotency_key))

    def verify_ledgers(
        self,
        *,
        tenant: str | None = None,
        all_tenants: bool = False,
        limit: int = 500,
        cursor: str | None = None,
    ) -> Flow[Verification]:
        """One page of ledger verification: of a tenant, or of every tenant (admin)."""
        path = (
            "/v1/ledger-verification"
            if all_tenants
            else (yield from self._at(tenant, "/ledger-verification"))
        )
        return (yield from self._get(Verification, path, limit=limit, cursor=cursor))

    # -- reliability: policy, confirmation receipts, verification runs -----------

    def policy(self) -> Flow[dict[str, Any]]:
        """The server's `operation-reliability.v2` document (GET /v1/policy)."""
        document: dict[str, Any] = (yield from self.request("GET", "/v1/policy")).json()
        return document

    def policy_history(self) -> Flow[list[PolicyVersion]]:
        """Every policy version the server has started under, newest last start first
        (admin; GET /v1/policy/history)."""
        return (yield from self._get(PolicyHistory, "/v1/policy/history")).versions

    def publish_policy(
        self, document: dict[str, Any], *, reason: str, idempotency_key: str | None = None
    ) -> Flow[PolicyVersion]:
        """Publish a policy version and have the server run it (admin; PUT
        /v1/policy/versions/{version}): kept with its sha256, this key and `reason`."""
        version = quote(str(document.get("version", "")), safe="")
        body = {"document": document, "reason": reason}
        return (
            yield from self._effect(
                PolicyVersion, "PUT", f"/v1/policy/versions/{version}", body, idempotency_key
            )
        )

    def claim_receipt(
        self,
        idempotency_key: str,
        outcome_ref: str,
        *,
        claim_token: str | None = None,
        tenant: str | None = None,
    ) -> Flow[tuple[Receipt, bool]]:
        """Claim a confirmed mutation's one-shot receipt; True when this call holds the grant.

        A transient failure is retried with the same `claim_token`, so a claim whose
        answer was lost is granted again rather than mistaken for someone else's.
        """
        body = {
            "idempotency_key": idempotency_key,
            "outcome_ref": outcome_ref,
            "claim_token": claim_token or new_idempotency_key(),
        }
        path = yield from self._at(tenant, "/receipts")
        response = yield from self.request("POST", path, json=body, operation=CM)
        return Receipt.model_validate_json(response.content), response.status_code == 201

    def settle_receipt(
        self,
        outcome_ref: str,
        status: Literal["succeeded", "failed"],
        outcome: Any,
        *,
        tenant: str | None = None,
    ) -> Flow[Receipt]:
        """Settle a pending receipt once; the same settlement again is a no-op."""
        path = yield from self._at(tenant, f"/receipts/{outcome_ref}")
        body = {"status": status, "outcome": outcome}
        response = yield from self.request("PUT", path, json=body, operation=CM)
        return Receipt.model_validate_json(response.content)

    def get_receipt(self, outcome_ref: str, *, tenant: str | None = None) -> Flow[Receipt]:
        path = yield from self._at(tenant, f"/receipts/{outcome_ref}")
        return (yield from self._get(Receipt, path))

    def pending_receipts(
        self, *, older_than: float | None = None, limit: int = 100, tenant: str | None = None
    ) -> Flow[list[StaleReceipt]]:
        """Pending receipts claimed at least `older_than` seconds ago (default: the
        confirmed-mutation deadline: the stale ones), oldest first (operator)."""
        params: dict[str, Any] = {"state": "pending", "limit": limit}
        if older_than is not None:
            params["older_than"] = older_than
        path = yield from self._at(tenant, "/receipts")
        page = (yield from self.request("GET", path, params=params)).json()
        return [StaleReceipt.model_validate(r) for r in page["receipts"]]

    def resolve_receipt(
        self,
        outcome_ref: str,
        status: Literal["succeeded", "failed"],
        outcome: Any,
        *,
        reason: str,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Flow[Receipt]:
        """Settle a stale pending receipt as an operator, with what happened and why."""
        path = yield from self._at(tenant, f"/receipts/{outcome_ref}:resolve")
        body = {"status": status, "outcome": outcome, "reason": reason}
        return (yield from self._effect(Receipt, "POST", path, body, idempotency_key))

    def start_verification_run(
        self,
        artifact_version: str,
        verifier_version: str,
        items: Sequence[str],
        *,
        tenant: str | None = None,
    ) -> Flow[VerificationRun]:
        """Start (or, for the same pair, find again) the run of an artifact and verifier version."""
        body = {
            "artifact_version": artifact_version,
            "verifier_version": verifier_version,
            "items": list(items),
        }
        path = yield from self._at(tenant, "/verification-runs")
        response = yield from self.request("POST", path, json=body, operation=AV)
        return VerificationRun.model_validate_json(response.content)

    def get_verification_run(
        self, run_id: str, *, tenant: str | None = None
    ) -> Flow[VerificationRun]:
        path = yield from self._at(tenant, f"/verification-runs/{run_id}")
        return (yield from self._get(VerificationRun, path))

    def abandon_verification_run(
        self,
        run_id: str,
        *,
        reason: str,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Flow[VerificationRun]:
        """End a running run as abandoned (operator); who and why are recorded."""
        path = yield from self._at(tenant, f"/verification-runs/{run_id}:abandon")
        body = {"reason": reason}
        return (yield from self._effect(VerificationRun, "POST", path, body, idempotency_key))

    def checkpoint(
        self, run_id: str, item: str, result: Any, *, tenant: str | None = None
    ) -> Flow[Checkpoint]:
        """Record one item's result; the same result again is a no-op, another is refused."""
        path = yield from self._at(
            tenant, f"/verification-runs/{run_id}/checkpoints/{quote(item, safe='/')}"
        )
        response = yield from self.request("PUT", path, json={"result": result}, operation=AV)
        return Checkpoint.model_validate_json(response.content)

    def complete_verification_run(
        self, run_id: str, *, tenant: str | None = None
    ) -> Flow[VerificationRun]:
        """Write the terminal run-complete marker; refused until every item is checkpointed."""
        path = yield from self._at(tenant, f"/verification-runs/{run_id}/complete")
        response = yield from self.request("PUT", path, operation=AV)
        return VerificationRun.model_validate_json(response.content)


class ClientFace:
    """What both faces share: the core, and its settings under the names callers use."""

    _core: ClientCore

    @property
    def url(self) -> str:
        return self._core.url

    @property
    def tenant(self) -> str | None:
        return self._core.tenant

    @tenant.setter
    def tenant(self, tenant: str | None) -> None:
        self._core.tenant = tenant

    @property
    def reliability_policy(self) -> ReliabilityPolicy:
        return self._core.reliability_policy

    @property
    def calls(self) -> dict[OperationClass, CallClass]:
        return self._core.calls


def face_method(
    flow: Callable[..., Any],
    method: Callable[..., Any],
    iterator: type[Iterator[Any]] | type[AsyncIterator[Any]] = Iterator,
) -> None:
    """Give a face's method the flow's name, docstring and signature (without `Flow[...]`)."""
    functools.update_wrapper(method, flow)  # `__wrapped__`: annotations resolve in this module
    returns = flow.__annotations__.get("return", "")
    if isinstance(returns, str) and returns.startswith(("Flow[", "Pages[")):
        inner = returns[returns.index("[") + 1 : -1]
        returns = f"{iterator.__name__}[{inner}]" if returns.startswith("Pages[") else inner
    method.__annotations__ = {**flow.__annotations__, "return": returns}
    signature = inspect.signature(flow, eval_str=False)
    method.__signature__ = signature.replace(return_annotation=returns)  # type: ignore[attr-defined]
