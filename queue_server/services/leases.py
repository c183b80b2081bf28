"""The lease protocol: acquire (long-polled, under the queue's concurrency limit), the
holder's heartbeat, complete, requeue and triage, single and in batches. Each refusal is
the precise one the database explains; each effect runs once per Idempotency-Key. The
routes that call it are on the lean path too (`api/hot.py`): acquire, heartbeat,
complete and their batch forms."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from queue_server import auth, errors, views
from queue_server.db import Database
from queue_server.idempotency import Answer, Effects, Idempotency
from queue_server.infra.metrics import Metrics
from queue_server.infra.tasks import wait_event
from queue_server.models import Role, is_uuid
from queue_server.policy import ReliabilityPolicy
from queue_server.services.common import WORKER_OR_OPERATOR, require_item_id
from queue_server.services.envelope import LeaseEnvelope, refuse_above
from queue_server.services.queue_settings import DEFAULT_RETRY_BASE
from queue_server.settings import Settings
from queue_server.store import transitions
from queue_server.store.types import Conn, Row

# How long a queue found near its concurrency limit skips the shared-lock attempt.
NEAR_LIMIT_MEMORY = 5.0
# How many such queues one process remembers (the least recently found go first).
NEAR_LIMIT_ENTRIES = 10_000


class NearLimit:
    """Queues lately found near their concurrency limit, each remembered `memory` seconds.

    At most `max_entries` of them: a client acquiring on ever new queue names must not
    grow a process's memory without end. Forgetting a queue costs its next acquire one
    shared-lock attempt, nothing else.
    """

    def __init__(
        self, *, memory: float = NEAR_LIMIT_MEMORY, max_entries: int = NEAR_LIMIT_ENTRIES
    ) -> None:
        self.memory = memory
        self.max_entries = max_entries
        self._since: OrderedDict[tuple[str, str], float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._since)

    def mark(self, tenant: str, queue: str) -> None:
        key = (tenant, queue)
        self._since[key] = time.monotonic()
        self._since.move_to_end(key)
        while len(self._since) > self.max_entries:
            self._since.popitem(last=False)

    def recent(self, tenant: str, queue: str) -> bool:
        since = self._since.get((tenant, queue))
        if since is None:
            return False
        if time.monotonic() - since < self.memory:
            return True
        del self._since[(tenant, queue)]
        return False


# Items one bulk cancel examines at most (one transaction).

# While the listener is down, a waiting acquire looks at its queue this often, so it
# still wakes within a second of an enqueue.
LISTENER_DOWN_POLL_INTERVAL = 0.5


class Wakeups(Protocol):
    """Where a long-polling acquire waits for `tenant/queue` to have work (the notifier)."""

    def subscribe(self, tenant: str, queue: str) -> asyncio.Event: ...

    def unsubscribe(self, tenant: str, queue: str, event: asyncio.Event) -> None: ...

    def wake(self, tenant: str, queue: str) -> None:
        """Wake this process's acquires waiting on `tenant/queue` (it committed work there)."""
        ...

    @property
    def listening(self) -> bool:
        """Whether notifications arrive at all (the listener's session is up)."""
        ...


class Leases:
    """Lease work items and settle them: the worker's side of the protocol."""

    def __init__(
        self,
        db: Database,
        effects: Effects,
        settings: Settings,
        *,
        wakeups: Wakeups,
        metrics: Metrics,
        policy: ReliabilityPolicy,
    ) -> None:
        self.db = db
        self.policy = policy
        self.envelope = LeaseEnvelope(policy)
        self.effects = effects
        self.settings = settings
        self.wakeups = wakeups
        self.metrics = metrics
        self.near_limit = NearLimit()

    def _poll_interval(self) -> float:
        """How long a waiting acquire sleeps between looks without a notification:
        `poll_interval`, and at most half a second while the listener is down."""
        if self.wakeups.listening:
            return self.settings.poll_interval
        return min(self.settings.poll_interval, LISTENER_DOWN_POLL_INTERVAL)

    async def acquire(
        self,
        principal: auth.Principal,
        tenant: str,
        queue: str,
        *,
        worker: str,
        lease_ttl: float | None,
        max_items: int,
        wait: float,
        client_gone: Callable[[], Awaitable[bool]],
    ) -> Answer:
        """Lease up to `max_items` due items, long-polling up to `wait` seconds for one.

        A lease is committed only while the client is still connected, so a
        long-poll whose client went away hands nothing out.
        """
        principal.require(tenant, Role.WORKER)
        refuse_above([self.envelope.lease_ttl(lease_ttl, "body", "lease_ttl")])
        ttl = None if lease_ttl is None else timedelta(seconds=lease_ttl)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        # Listened for only once an acquire found nothing and may wait: an acquire that
        # leases at once (a busy queue) is no waiter, and keeps the process's watch idle.
        wakeup: asyncio.Event | None = None
        try:
            while True:
                if wakeup is not None:
                    wakeup.clear()  # before the look: a wake-up during it is kept
                leased = await self._acquire_once(
                    tenant, queue, worker, principal.key_id, ttl, max_items, client_gone
                )
                remaining = deadline - loop.time()
                if leased:
                    self.metrics.observe_leases(
                        tenant, queue, leased, late_after=self.settings.slo_lease_wait_seconds
                    )
                if leased or remaining <= 0:
                    return Answer.of(200, {"leases": [views.lease(r) for r in leased]})
                if wakeup is None:
                    # Listening from now on, look again at once: what was made ready
                    # between the first look and now woke nobody.
                    wakeup = self.wakeups.subscribe(tenant, queue)
                    continue
                await wait_event(wakeup, min(remaining, self._poll_interval()))
                if await client_gone():
                    raise errors.ClientDisconnectedError()
        finally:
            if wakeup is not None:
                self.wakeups.unsubscribe(tenant, queue, wakeup)

    @property
    def _max_ttl(self) -> timedelta:
        """The longest lease TTL: the policy's attempt timeout. A request above it is refused;
        a queue's or tenant's default stored under a looser policy is held to it."""
        return timedelta(seconds=self.envelope.leased.attempt_timeout)

    @property
    def _backoff(self) -> transitions.Backoff:
        leased = self.envelope.leased
        return transitions.Backoff(
            base=min(DEFAULT_RETRY_BASE, leased.backoff_cap), cap=leased.backoff_cap
        )

    async def _acquire_once(
        self,
        tenant: str,
        queue: str,
        worker: str,
        key_id: str,
        ttl: timedelta | None,
        max_items: int,
        client_gone: Callable[[], Awaitable[bool]],
    ) -> list[Row]:
        """Acquire transactions until something is leased or nothing more was quarantined.

        A client that has left gets nothing: it is checked before the acquire, and
        leases committed while it left are released at once, uncharged.
        """
        while True:
            if await client_gone():
                raise errors.ClientDisconnectedError()
            with self.metrics.acquire_seconds.time():
                async with self.db.conn() as conn:
                    acquired = await transitions.acquire(
                        conn,
                        tenant=tenant,
                        queue=queue,
                        worker=worker,
                        key_id=key_id,
                        ttl=ttl,
                        max_ttl=self._max_ttl,
                        deadline=timedelta(seconds=self.envelope.leased.deadline),
                        max_items=max_items,
                        base_limit=self.envelope.leased.concurrency,
                        max_approved=self.envelope.leased.max_approved,
                        # A queue lately found near its limit goes exclusive at once.
                        shared_first=not self.near_limit.recent(tenant, queue),
                    )
                    leased, quarantined = acquired.leased, acquired.quarantined
                    if acquired.contended:
                        self.near_limit.mark(tenant, queue)
                    if leased and await client_gone():
                        async with conn.transaction():
                            await transitions.release_unsent(
                                conn, tenant=tenant, worker=worker, key_id=key_id, leases=leased
                            )
                        raise errors.ClientDisconnectedError()
            if leased or not quarantined:
                return leased

    async def heartbeat(
        self,
        principal: auth.Principal,
        tenant: str,
        item_id: str,
        *,
        worker: str,
        fence: int,
        lease_ttl: float | None,
    ) -> Answer:
        principal.require(tenant, Role.WORKER)
        refuse_above([self.envelope.lease_ttl(lease_ttl, "body", "lease_ttl")])
        ttl = None if lease_ttl is None else timedelta(seconds=lease_ttl)
        require_item_id(item_id)
        async with self.db.tx() as conn:
            row = await transitions.heartbeat(
                conn,
                tenant=tenant,
                item_id=item_id,
                worker=worker,
                key_id=principal.key_id,
                fence=fence,
                ttl=ttl,
                max_ttl=self._max_ttl,
            )
            if row is None:
                raise await transitions.explain_rejection(
                    conn,
                    tenant=tenant,
                    item_id=item_id,
                    worker=worker,
                    key_id=principal.key_id,
                    fence=fence,
                )
        return Answer.of(
            200,
            {
                "item_id": item_id,
                "fence": fence,
                "lease_expires_at": row["lease_expires_at"],
                "lease_deadline_at": row["lease_deadline_at"],
            },
        )

    async def heartbeat_many(
        self,
        principal: auth.Principal,
        tenant: str,
        *,
        worker: str,
        leases: list[dict[str, Any]],
        lease_ttl: float | None,
        instance: str,
    ) -> Answer:
        """Extend many leases of one worker in one transaction, each under its own fence.

        Each entry gets its own answer: the new expiry, or the refusal a single
        heartbeat would have given.
        """
        principal.require(tenant, Role.WORKER)
        ids = [entry["item_id"] for entry in leases]
        if len(set(ids)) != len(ids):
            raise errors.InvalidRequestError("Each item may appear once in a batch of heartbeats.")
        refuse_above([self.envelope.lease_ttl(lease_ttl, "body", "lease_ttl")])
        ttl = None if lease_ttl is None else timedelta(seconds=lease_ttl)
        valid = [entry for entry in leases if is_uuid(entry["item_id"])]
        async with self.db.tx() as conn:
            extended = (
                await transitions.heartbeat_many(
                    conn,
                    tenant=tenant,
                    worker=worker,
                    key_id=principal.key_id,
                    leases=valid,
                    ttl=ttl,
                    max_ttl=self._max_ttl,
                )
                if valid
                else {}
            )
            refused = {e["item_id"]: e["fence"] for e in valid if e["item_id"] not in extended}
            refusals = await _explained(conn, tenant, worker, principal.key_id, refused)
        results: list[dict[str, Any]] = []
        for entry in leases:
            item_id = entry["item_id"]
            if item_id in extended:
                results.append(
                    {
                        "item_id": item_id,
                        "status": 200,
                        "fence": entry["fence"],
                        "lease_expires_at": extended[item_id]["lease_expires_at"],
                        "lease_deadline_at": extended[item_id]["lease_deadline_at"],
                    }
                )
                continue
            results.append(self._refused(item_id, refusals, instance))
        return Answer.of(200, {"extended": len(extended), "results": results})

    def _refused(
        self, item_id: str, refusals: dict[str, errors.QueueServerError], instance: str
    ) -> dict[str, Any]:
        """A batch entry that changed nothing: its refusal as a problem (an id the database
        cannot explain is simply not found)."""
        refusal = refusals.get(item_id) or errors.ItemNotFoundError(item_id=item_id)
        problem = errors.problem(
            refusal, base_uri=self.settings.problem_base_uri, instance=instance
        )
        return {"item_id": item_id, "status": refusal.status, "problem": problem}

    async def complete(
        self,
        principal: auth.Principal,
        tenant: str,
        item_id: str,
        idem: Idempotency,
        *,
        instance: str,
        worker: str,
        fence: int,
        result: Any,
    ) -> Answer:
        """leased -> completed with `result`: only by the holder, with its fence, before
        expiry."""
        held = Held.of(principal, tenant, item_id, worker=worker, fence=fence)
        return await self.effects.run_pipelined(
            tenant, idem, instance, change_held, held, transitions.complete, {"result": result}
        )

    async def complete_many(
        self,
        principal: auth.Principal,
        tenant: str,
        idem: Idempotency,
        *,
        instance: str,
        worker: str,
        completions: list[dict[str, Any]],
    ) -> Answer:
        """Complete many items in one transaction, each guarded by its own fence.

        One receipt covers the batch; each entry gets its own answer (the item, or
        the refusal that a single complete would have given).
        """
        principal.require(tenant, Role.WORKER)
        ids = [entry["item_id"] for entry in completions]
        if len(set(ids)) != len(ids):
            raise errors.InvalidRequestError("Each item may appear once in a batch of completions.")

        async def operation(conn: Conn) -> Answer:
            valid = [entry for entry in completions if is_uuid(entry["item_id"])]
            done = await transitions.complete_many(
                conn, tenant=tenant, worker=worker, key_id=principal.key_id, completions=valid
            )
            # Ids that are not ours cannot be explained by the database: they are simply not found.
            refused = {
                entry["item_id"]: entry["fence"] for entry in valid if entry["item_id"] not in done
            }
            refusals = await _explained(conn, tenant, worker, principal.key_id, refused)
            results = []
            for item_id in ids:
                if item_id in done:
                    results.append(
                        {"item_id": item_id, "status": 200, "item": views.item(done[item_id])}
                    )
                    continue
                results.append(self._refused(item_id, refusals, instance))
            return Answer.of(200, {"completed": len(done), "results": results})

        return await self.effects.run_pipelined(tenant, idem, instance, operation)

    async def requeue(
        self,
        principal: auth.Principal,
        tenant: str,
        item_id: str,
        idem: Idempotency,
        *,
        instance: str,
        worker: str,
        fence: int,
        reason: str,
        delay: float | None = 0.0,
        failure: dict[str, Any] | None = None,
    ) -> Answer:
        """leased -> ready, due after `delay` seconds (at most the policy's backoff cap);
        None (`"delay": "backoff"`): the queue's backoff for the item's acquisition count.
        A `failure` (a traceback with it) becomes the item's last failure and is ledgered."""
        refuse_above([self.envelope.delay(delay, "body", "delay")])
        held = Held.of(principal, tenant, item_id, worker=worker, fence=fence)
        args = {"reason": reason, "delay": delay, "backoff": self._backoff, "failure": failure}
        return await self.effects.run_pipelined(
            tenant, idem, instance, change_held, held, transitions.requeue, args
        )

    async def triage(
        self,
        principal: auth.Principal,
        tenant: str,
        item_id: str,
        idem: Idempotency,
        *,
        instance: str,
        worker: str,
        fence: int,
        failure: dict[str, Any],
        quarantine: bool,
        delay: float | None = 0.0,
    ) -> Answer:
        """leased -> ready after `delay` (decision requeue; None: the queue's backoff) or
        quarantined, failure recorded; only by the holder, with its fence, before expiry.

        Any key of the tenant may report a failure: a refused triage (an unleased item, a
        stale or foreign holder, an operator's key, which holds no lease) is still ledgered
        as `triage_rejected` by its actor."""
        if quarantine and delay != 0.0:
            raise errors.InvalidRequestError(
                "A delay applies to decision requeue only.",
                errors=[{"loc": ["body", "delay"], "msg": "only with decision requeue"}],
            )
        refuse_above([self.envelope.delay(delay, "body", "delay")])

        held = Held.of(
            principal, tenant, item_id, worker=worker, fence=fence, roles=WORKER_OR_OPERATOR
        )
        args = {
            "failure": failure,
            "quarantine": quarantine,
            "delay": delay,
            "backoff": self._backoff,
        }
        # A refused triage is still an observable failure fact: ledgered by its actor (the
        # worker name a worker's key presented, else the key).
        refused = Refused(
            transitions.record_triage_rejected,
            {"failure": failure, "actor": worker if held.holds_lease else principal.actor},
        )
        return await self.effects.run_pipelined(
            tenant, idem, instance, change_held, held, transitions.triage, args, refused
        )


# -- the holder operations: complete, requeue and triage each hand `change_held` (the step
# under the receipt, `Effects.run_pipelined`) their store function and its arguments.

Step = Callable[..., Awaitable[Row | None]]


@dataclass(frozen=True, slots=True)
class Held:
    """The lease a holder operation presents: the tenant's item, the worker's name, the key
    that sent it, and the fence it was leased under. An operator's key holds no lease."""

    tenant: str
    item_id: str
    worker: str
    key_id: str
    fence: int
    holds_lease: bool

    @classmethod
    def of(
        cls,
        principal: auth.Principal,
        tenant: str,
        item_id: str,
        *,
        worker: str,
        fence: int,
        roles: tuple[Role, ...] = (Role.WORKER,),
    ) -> Held:
        """The lease `principal` presents, once it may act on the tenant's items at all."""
        principal.require(tenant, *roles)
        require_item_id(item_id)
        return cls(
            tenant=tenant,
            item_id=item_id,
            worker=worker,
            key_id=principal.key_id,
            fence=fence,
            holds_lease=principal.role is not Role.OPERATOR,
        )


@dataclass(frozen=True, slots=True)
class Refused:
    """What a refused operation still ledgers: a store function, called with the held item,
    the refusal's code as `reason`, and `args`."""

    record: Callable[..., Awaitable[None]]
    args: dict[str, Any]


async def _explained(
    conn: Conn, tenant: str, worker: str, key_id: str, refused: dict[str, int]
) -> dict[str, errors.QueueServerError]:
    """Why each of `refused` (item id: fence) changed nothing; none asked, nothing read."""
    if not refused:
        return {}
    return await transitions.explain_rejections(
        conn, tenant=tenant, worker=worker, key_id=key_id, fences=refused
    )


async def change_held(
    conn: Conn, held: Held, step: Step, args: dict[str, Any], refused: Refused | None = None
) -> Answer:
    """`step` on the held item (its guard: holder, key, fence, unexpired lease) with `args`;
    the item it changed, or the precise refusal the database explains when it changed
    nothing. A missing item is refused without a ledger entry: there is no ledger."""
    guard = {
        "tenant": held.tenant,
        "item_id": held.item_id,
        "worker": held.worker,
        "key_id": held.key_id,
        "fence": held.fence,
    }
    row = await step(conn, **guard, **args) if held.holds_lease else None
    if row is not None:
        return Answer.of(200, views.item(row))
    refusal = await transitions.explain_rejection(
        conn,
        tenant=held.tenant,
        item_id=held.item_id,
        worker=held.worker if held.holds_lease else None,
        key_id=held.key_id,
        fence=held.fence,
    )
    if refused is not None and not isinstance(refusal, errors.NotFoundError):
        await refused.record(
            conn,
            tenant=held.tenant,
            item_id=held.item_id,
            worker=held.worker,
            fence=held.fence,
            reason=refusal.code,
            **refused.args,
        )
    raise refusal
