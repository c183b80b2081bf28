"""Items and their leases: enqueue (under the backlog cap), reads and pages, acquire
(long-polled), heartbeat, the holder's complete, requeue and triage, and an operator's
cancel (one item, or a page of a filter). Transaction boundaries and checks; each state
change is one statement of `store.transitions`."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

import orjson

from queue_server import auth, errors, views
from queue_server.db import Database, admission_refusals
from queue_server.idempotency import Answer, Effects, Idempotency
from queue_server.infra.metrics import Metrics
from queue_server.models import (
    NAME_RE,
    ItemState,
    Role,
    check_utc_offset,
    is_uuid,
    uuid7,
    uuid7s,
)
from queue_server.policy import ReliabilityPolicy
from queue_server.services import common
from queue_server.services.common import (
    WORKER_OR_OPERATOR,
    admission_room,
    require_item_id,
    require_tenant,
    uuid_range,
)
from queue_server.services.envelope import LeaseEnvelope, refuse_above
from queue_server.services.queue_settings import DEFAULT_RETRY_BASE
from queue_server.settings import Settings
from queue_server.store import reads, tenants, transitions
from queue_server.store.types import Conn, Row
from queue_server.tracecontext import TraceContext

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
MAX_BULK_CANCEL = 1000
CANCELLABLE = (ItemState.READY, ItemState.LEASED, ItemState.QUARANTINED)
# The orders of a page of items (GET /items's `sort`): a key, "-" descending.
SORTS = reads.SORTS
# What a bulk retry makes ready, and what a bulk delete removes.
RETRYABLE = ("quarantined", "cancelled")
DELETABLE = ("completed", "cancelled")


@dataclass(frozen=True, slots=True)
class ItemFilter:
    """Which items a page (or a bulk cancel) covers; None is no condition."""

    queue: str | None = None
    state: str | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    # A JSON document the payload must contain (`@>`), as text.
    payload: str | None = None
    # Only these items (a bulk retry's or delete's selection).
    item_ids: tuple[str, ...] | None = None

    def checked(self) -> ItemFilter:
        """The filter, or 422 `invalid-request` naming what is wrong with it."""
        if self.queue is not None and not NAME_RE.match(self.queue):
            raise errors.InvalidRequestError(f"No queue can be named {self.queue!r}.")
        if self.state is not None and self.state not in set(ItemState):
            states = ", ".join(ItemState)
            raise errors.InvalidRequestError(f"state must be one of: {states}.")
        for name, at in (
            ("created_after", self.created_after),
            ("created_before", self.created_before),
        ):
            if at is not None and at.tzinfo is None:
                raise errors.InvalidRequestError(f"{name} needs a time zone (e.g. ...Z).")
        if self.item_ids is not None and (
            not self.item_ids or not all(is_uuid(i) for i in self.item_ids)
        ):
            raise errors.InvalidRequestError("item_ids must be one or more item ids (UUIDs).")
        if self.payload is not None:
            try:
                orjson.loads(self.payload)
            except orjson.JSONDecodeError:
                raise errors.InvalidRequestError(
                    'payload must be a JSON document, e.g. {"customer": 42}.'
                ) from None
        return self


def _looks_by_hand(principal: auth.Principal) -> bool:
    """Whether an item may be looked up by the end of its id: a scan of the tenant's items,
    for the operators and admins who type or copy one, not for a worker key's program."""
    return principal.role is not Role.WORKER


Position = tuple[int | None, str, str]


def _item_cursor(cursor: str | None, sort: str = "created") -> Position | None:
    """A page cursor back into its position in `sort`'s order: (key, created_at, item_id),
    the key None for the created order. A cursor of another order is refused (422)."""
    if not cursor:
        return None
    if sort == "created":
        key = None
        at, item_id = common.decode_cursor(cursor, 2)
    else:
        of, key_text, at, item_id = common.decode_cursor(cursor, 4)
        if of != sort:
            raise errors.InvalidRequestError(
                f"The cursor is of a page sorted by {of!r}, not {sort!r}: start again without it."
            )
        try:
            key = int(key_text) if reads.SORT_COLUMN[sort.lstrip("-")] else None
        except ValueError:
            raise common.foreign_cursor() from None
    try:
        # An offset PostgreSQL cannot read (past 15:59) is no cursor this server issued.
        check_utc_offset(datetime.fromisoformat(at))
    except ValueError:
        raise common.foreign_cursor() from None
    if not is_uuid(item_id):
        raise common.foreign_cursor()
    return key, at, item_id


def _position(row: Row, sort: str = "created") -> str:
    """The cursor after `row` in `sort`'s order (the created order's as it always was)."""
    where = [row["created_at"].isoformat(), str(row["item_id"])]
    if sort == "created":
        return common.encode_cursor(where)
    column = reads.SORT_COLUMN[sort.lstrip("-")]
    return common.encode_cursor([sort, str(row[column]) if column else "", *where])


# While the listener is down, a waiting acquire looks at its queue this often, so it
# still wakes within a second of an enqueue.
LISTENER_DOWN_POLL_INTERVAL = 0.5


def _check_bulk_limit(limit: int) -> None:
    if not 1 <= limit <= MAX_BULK_CANCEL:
        raise errors.InvalidRequestError(f"limit must be 1 to {MAX_BULK_CANCEL}.")


@dataclass(frozen=True, slots=True)
class Bulk:
    """What a bulk action did to its page: the rows it changed, how many of the page's
    first items it took (the next page starts after them), and fields of its own answer."""

    rows: list[Row]
    taken: int
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NewItem:
    payload: Any
    priority: int = 0
    delay: float = 0.0
    max_acquisitions: int | None = None
    # Default: a new time-ordered id. A schedule's fire names its item (schedule, tick).
    item_id: str | None = None
    # The producer's W3C trace context (already validated), handed to each lease.
    trace: TraceContext | None = None


class ItemSpec(Protocol):
    """One item an enqueue is asked for: a `NewItem`, or the API's body (`ItemIn`) as is."""

    @property
    def payload(self) -> Any: ...

    @property
    def priority(self) -> int: ...

    @property
    def delay(self) -> float: ...

    @property
    def max_acquisitions(self) -> int | None: ...


class Wakeups(Protocol):
    """Where a long-polling acquire waits for `tenant/queue` to have work (the notifier)."""

    def subscribe(self, tenant: str, queue: str) -> asyncio.Event: ...

    def unsubscribe(self, tenant: str, queue: str, event: asyncio.Event) -> None: ...

    @property
    def listening(self) -> bool:
        """Whether notifications arrive at all (the listener's session is up)."""
        ...


class Items:
    """Enqueue, read, lease and settle work items."""

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

    async def enqueue(
        self,
        principal: auth.Principal,
        tenant: str,
        queue: str,
        items: Sequence[ItemSpec],
        idem: Idempotency,
        *,
        instance: str,
        batch: bool,
        trace: TraceContext | None = None,
    ) -> Answer:
        """Enqueue `items` (new ids), each with the producer's `trace`, once per key.

        The admission locks the tenant's admission shards it is charged to until the
        commit; concurrent enqueues of a tenant take other shards and never wait for it.
        """
        principal.require(tenant, *WORKER_OR_OPERATOR)
        refuse_above(
            [
                self.envelope.budget(
                    item.max_acquisitions,
                    "body",
                    *(("items", i) if batch else ()),
                    "max_acquisitions",
                )
                for i, item in enumerate(items)
                if item.max_acquisitions is not None
            ]
        )
        await self._refuse_early_at_cap(tenant, idem, len(items))
        specs = self._specs(items, uuid7s(len(items)), trace)

        async def operation(conn: Conn) -> Answer:
            with admission_refusals(tenant):
                written = await transitions.enqueue_rows(
                    conn,
                    tenant=tenant,
                    queue=queue,
                    items=specs,
                    actor=principal.actor,
                    attempt_cap=self.envelope.leased.attempt_cap,
                    backlog_ceiling=self.envelope.leased.backlog_cap,
                )
            shaped = views.enqueued(tenant, queue, specs, written)
            return Answer(201, views.dumps({"items": shaped} if batch else shaped[0]))

        return await self.effects.run(tenant, idem, instance, operation)

    def _specs(
        self, items: Sequence[ItemSpec], ids: Sequence[str], trace: TraceContext | None
    ) -> list[dict[str, Any]]:
        """The items as the admission reads them (`queue_server.admit_rows`), with `ids`;
        the trace context only when there is one."""
        cap = self.envelope.leased.attempt_cap
        traced = (
            {}
            if trace is None
            else {"traceparent": trace.traceparent, "tracestate": trace.tracestate}
        )
        return [
            {
                "item_id": item_id,
                "payload": item.payload,
                "priority": item.priority,
                "delay": item.delay,
                # A schedule stored under a looser policy fires within the loaded one; none
                # given: the queue's budget, else the tenant's default (in the statement).
                "max_acquisitions": (
                    None if item.max_acquisitions is None else min(item.max_acquisitions, cap)
                ),
                **traced,
            }
            for item, item_id in zip(items, ids, strict=True)
        ]

    async def admit(
        self, conn: Conn, tenant: str, queue: str, items: list[NewItem], *, actor: str
    ) -> list[Row]:
        """Enqueue `items` in the caller's transaction, within the tenant's backlog cap (all or
        nothing; its admission shards locked until the transaction ends). Every enqueue of the server comes through here: the
        API's, and each fire of a schedule; `queue_server.enqueue` (an application's own
        transaction) runs the same admission in SQL."""
        specs = [
            spec
            for item in items
            for spec in self._specs([item], [item.item_id or uuid7()], item.trace)
        ]
        with admission_refusals(tenant):
            return await transitions.enqueue(
                conn,
                tenant=tenant,
                queue=queue,
                items=specs,
                actor=actor,
                attempt_cap=self.envelope.leased.attempt_cap,
                backlog_ceiling=self.envelope.leased.backlog_cap,
            )

    async def _refuse_early_at_cap(self, tenant: str, idem: Idempotency, adding: int) -> None:
        """A tenant flooding a full backlog is refused with one read, no lock and no receipt,
        after a short pause (`cap_refusal_delay`) that holds no connection and no CPU.

        Only for a key with no receipt (a replay must still get its original answer);
        whatever this lets through, the admission under its shards' locks decides exactly.
        """
        async with self.db.conn() as conn:
            row = await tenants.room(conn, tenant=tenant, key=idem.receipt_key)
        if row is None or row["has_receipt"]:
            return
        cap = self.envelope.held_backlog_cap(row["backlog_cap"])
        if row["backlog"] + adding > cap:
            await asyncio.sleep(self.settings.cap_refusal_delay)
            raise errors.BacklogCapReachedError(
                f"Backlog {row['backlog']} + {adding} new would exceed the cap of {cap}.",
                backlog=row["backlog"],
                backlog_cap=cap,
                requested=adding,
            )

    async def get_item(self, principal: auth.Principal, tenant: str, item_id: str) -> Answer:
        principal.require(tenant, *WORKER_OR_OPERATOR)
        row = await self._item_row(tenant, item_id, by_end=_looks_by_hand(principal))
        return Answer.of(200, views.item(row))

    async def _item_row(self, tenant: str, item_id: str, *, by_end: bool) -> Row:
        """The item by its id, or by the start or, `by_end`, the end of exactly one item's id
        (a person typing, or copying the end a list shows)."""
        span = None if is_uuid(item_id) else uuid_range(item_id)
        if span is None:
            require_item_id(item_id)
        async with self.db.conn() as conn:
            if span is None:
                row = await reads.get_item(conn, tenant=tenant, item_id=item_id)
            else:
                digits = item_id.lower().replace("-", "")
                rows = await reads.items_in_id_range(conn, tenant=tenant, span=span, limit=5)
                if by_end:
                    rows += await reads.items_with_id_ending(
                        conn, tenant=tenant, digits=digits, limit=5
                    )
                found = {r["item_id"]: r for r in rows}
                rows = sorted(found.values(), key=lambda r: str(r["item_id"]))[:5]
                if len(rows) > 1:
                    raise errors.AmbiguousIdError(
                        f"{len(rows)}{'+' if len(found) >= 5 else ''} items have an id starting"
                        f" or ending with {item_id!r}; give more of it.",
                        item_ids=[str(r["item_id"]) for r in rows],
                    )
                row = rows[0] if rows else None
        if row is None:
            raise errors.ItemNotFoundError(item_id=item_id)
        return row

    async def list_items(
        self,
        principal: auth.Principal,
        tenant: str,
        *,
        filter: ItemFilter,
        limit: int,
        cursor: str | None,
        sort: str = "created",
    ) -> Answer:
        """A page of the tenant's items matching `filter` in `sort`'s order: created (oldest
        first), priority or attempts (acquisition_count), each then by creation; "-" first
        descends. `next_cursor` (of that order only) is null on the last page."""
        principal.require(tenant, Role.OPERATOR)
        filter = filter.checked()
        if sort not in SORTS:
            raise errors.InvalidRequestError(
                f"sort must be one of: {', '.join(SORTS)}.",
                errors=[{"loc": ["query", "sort"], "msg": "not a sort order"}],
            )
        after = _item_cursor(cursor, sort)
        async with self.db.conn() as conn:
            await require_tenant(conn, tenant)
            rows = await self._page(conn, tenant, filter, after, limit, open_only=False, sort=sort)
        next_cursor = None
        if len(rows) > limit:
            rows = rows[:limit]
            next_cursor = _position(rows[-1], sort)
        return Answer.of(200, {"items": [views.item(r) for r in rows], "next_cursor": next_cursor})

    @staticmethod
    async def _page(
        conn: Conn,
        tenant: str,
        filter: ItemFilter,
        after: Position | None,
        limit: int,
        *,
        open_only: bool,
        sort: str = "created",
    ) -> list[Row]:
        """Up to `limit` + 1 items after `after` in `sort`'s order: one more tells whether a
        next page exists. A filter naming items reads just those (a bulk action's
        selection, in the created order)."""
        if filter.item_ids is not None:
            return await reads.items_with_ids(
                conn,
                tenant=tenant,
                item_ids=list(filter.item_ids),
                state=str(filter.state),
                queue=filter.queue,
                created_after=filter.created_after.isoformat() if filter.created_after else None,
                created_before=filter.created_before.isoformat() if filter.created_before else None,
                payload_json=filter.payload,
                after=after,
                limit=limit + 1,
            )
        return await reads.list_items(
            conn,
            tenant=tenant,
            queue=filter.queue,
            state=filter.state,
            open_only=open_only,
            created_after=filter.created_after.isoformat() if filter.created_after else None,
            created_before=filter.created_before.isoformat() if filter.created_before else None,
            payload_json=filter.payload,
            after=after,
            limit=limit + 1,
            sort=sort,
        )

    async def cancel(
        self,
        principal: auth.Principal,
        tenant: str,
        item_id: str,
        idem: Idempotency,
        *,
        instance: str,
        reason: str,
    ) -> Answer:
        """ready, leased or quarantined -> cancelled; the ledger keeps who and why."""
        principal.require(tenant, Role.OPERATOR)
        require_item_id(item_id)

        async def operation(conn: Conn) -> Answer:
            rows = await transitions.cancel(
                conn, tenant=tenant, item_ids=[item_id], reason=reason, actor=principal.actor
            )
            if rows:
                return Answer.of(200, views.item(rows[0]))
            row = await reads.get_item(conn, tenant=tenant, item_id=item_id)
            if row is None:
                raise errors.ItemNotFoundError(item_id=item_id)
            raise errors.InvalidStateError(
                f"The item is {row['state']}; only ready, leased or quarantined items can be"
                " cancelled.",
                item_id=item_id,
                state=row["state"],
            )

        return await self.effects.run(tenant, idem, instance, operation)

    async def cancel_many(
        self,
        principal: auth.Principal,
        tenant: str,
        idem: Idempotency,
        *,
        instance: str,
        filter: ItemFilter,
        reason: str,
        limit: int,
        cursor: str | None,
    ) -> Answer:
        """Cancel the ready, leased and quarantined items of one page of `filter` (at most
        `limit`), in one transaction. `next_cursor` resumes after the page; null when the
        filter has no more items."""
        principal.require(tenant, Role.OPERATOR)
        filter = filter.checked()
        if filter.state is not None and filter.state not in CANCELLABLE:
            raise errors.InvalidRequestError(
                f"{filter.state} items cannot be cancelled; filter on ready, leased or"
                " quarantined items, or on none."
            )
        _check_bulk_limit(limit)

        async def cancel(conn: Conn, page: list[Row]) -> Bulk:
            cancelled = await transitions.cancel(
                conn,
                tenant=tenant,
                item_ids=[str(row["item_id"]) for row in page],
                reason=reason,
                actor=principal.actor,
                state=filter.state,
            )
            return Bulk(cancelled, len(page))

        return await self._bulk(
            tenant, idem, instance, filter, limit, cursor, "cancelled", cancel, open_only=True
        )

    async def count_items(self, principal: auth.Principal, tenant: str, filter: ItemFilter) -> int:
        """How many items of the filter's state match it (an operator's bulk action)."""
        principal.require(tenant, Role.OPERATOR)
        filter = filter.checked()
        if filter.state is None:
            raise errors.InvalidRequestError("Counting takes a state.")
        async with self.db.conn() as conn:
            await require_tenant(conn, tenant)
            return await reads.count_items(
                conn,
                tenant=tenant,
                state=filter.state,
                queue=filter.queue,
                created_after=filter.created_after.isoformat() if filter.created_after else None,
                created_before=filter.created_before.isoformat() if filter.created_before else None,
                payload_json=filter.payload,
            )

    def _bulk_page(
        self, filter: ItemFilter, allowed: tuple[str, ...], done: str, limit: int
    ) -> ItemFilter:
        """A bulk retry's or delete's filter, checked: one of the `allowed` states."""
        filter = filter.checked()
        if filter.state not in allowed:
            raise errors.InvalidRequestError(
                f"Only {' or '.join(allowed)} items can be {done}: filter on one of them."
            )
        _check_bulk_limit(limit)
        return filter

    async def _bulk(
        self,
        tenant: str,
        idem: Idempotency,
        instance: str,
        filter: ItemFilter,
        limit: int,
        cursor: str | None,
        verb: str,
        act: Callable[[Conn, list[Row]], Awaitable[Bulk]],
        *,
        open_only: bool,
    ) -> Answer:
        """An operator's bulk action on one page of `filter` (at most `limit` items after
        `cursor`), in one transaction, once per key: `act` changes the page's first items
        and says how many it took; the answer counts the rows it changed under `verb`, with
        their ids and `next_cursor`, after the last item taken while any is left."""
        after = _item_cursor(cursor)

        async def operation(conn: Conn) -> Answer:
            await require_tenant(conn, tenant)
            page = await self._page(conn, tenant, filter, after, limit, open_only=open_only)
            more = len(page) > limit
            page = page[:limit]
            done = await act(conn, page)
            left = more or done.taken < len(page)
            return Answer.of(
                200,
                {
                    verb: len(done.rows),
                    "item_ids": [str(row["item_id"]) for row in done.rows],
                    **done.extra,
                    "next_cursor": _position(page[done.taken - 1]) if done.taken and left else None,
                },
            )

        return await self.effects.run(tenant, idem, instance, operation)

    async def retry_many(
        self,
        principal: auth.Principal,
        tenant: str,
        idem: Idempotency,
        *,
        instance: str,
        filter: ItemFilter,
        limit: int,
        cursor: str | None,
    ) -> Answer:
        """Make one page of `filter`'s quarantined or cancelled items (at most `limit`) ready
        now, as a replay: back in the backlog within the tenant's cap (admission shards). Those
        past the cap's room are left as they were (`over_cap`; 429 when none fits), and
        `next_cursor` resumes after the last one retried."""
        principal.require(tenant, Role.OPERATOR)
        filter = self._bulk_page(filter, RETRYABLE, "retried", limit)

        async def retry(conn: Conn, page: list[Row]) -> Bulk:
            shards, cap = await admission_room(conn, tenant, len(page), self.envelope, "retried")
            retried = await transitions.retry(
                conn,
                tenant=tenant,
                item_ids=[str(r["item_id"]) for r in page[: len(shards)]],
                shards=shards,
                state=str(filter.state),
                actor=principal.actor,
            )
            over = {"over_cap": len(page) - len(shards), "backlog_cap": cap}
            return Bulk(retried, len(shards), over)

        return await self._bulk(
            tenant, idem, instance, filter, limit, cursor, "retried", retry, open_only=False
        )

    async def delete_many(
        self,
        principal: auth.Principal,
        tenant: str,
        idem: Idempotency,
        *,
        instance: str,
        filter: ItemFilter,
        limit: int,
        cursor: str | None,
    ) -> Answer:
        """Delete one page of `filter`'s completed or cancelled items (at most `limit`) with
        their ledgers, in one transaction; `next_cursor` resumes after the page."""
        principal.require(tenant, Role.OPERATOR)
        filter = self._bulk_page(filter, DELETABLE, "deleted", limit)

        async def delete(conn: Conn, page: list[Row]) -> Bulk:
            deleted = await transitions.delete_finished(
                conn,
                tenant=tenant,
                item_ids=[str(r["item_id"]) for r in page],
                state=str(filter.state),
                actor=principal.actor,
            )
            return Bulk(deleted, len(page))

        return await self._bulk(
            tenant, idem, instance, filter, limit, cursor, "deleted", delete, open_only=False
        )

    async def ledger(self, principal: auth.Principal, tenant: str, item_id: str) -> Answer:
        principal.require(tenant, *WORKER_OR_OPERATOR)
        by_end = _looks_by_hand(principal)
        item_id = str((await self._item_row(tenant, item_id, by_end=by_end))["item_id"])
        async with self.db.conn() as conn:
            events = await reads.ledger(conn, tenant=tenant, item_id=item_id)
        return Answer.of(200, {"item_id": item_id, "events": [views.event(e) for e in events]})

    # -- leases ------------------------------------------------------------

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
        while True:
            wakeup = self.wakeups.subscribe(tenant, queue)
            try:
                leased = await self._acquire_once(
                    tenant, queue, worker, principal.key_id, ttl, max_items, client_gone
                )
                remaining = deadline - loop.time()
                if leased or remaining <= 0:
                    return Answer.of(200, {"leases": [views.lease(r) for r in leased]})
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wakeup.wait(), min(remaining, self._poll_interval()))
                if await client_gone():
                    raise errors.ClientDisconnectedError()
            finally:
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
            refusals = (
                await transitions.explain_rejections(
                    conn, tenant=tenant, worker=worker, key_id=principal.key_id, fences=refused
                )
                if refused
                else {}
            )
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
            refusal = refusals.get(item_id) or errors.ItemNotFoundError(item_id=item_id)
            problem = errors.problem(
                refusal, base_uri=self.settings.problem_base_uri, instance=instance
            )
            results.append({"item_id": item_id, "status": refusal.status, "problem": problem})
        return Answer.of(200, {"extended": len(extended), "results": results})

    async def _holder_effect(
        self,
        principal: auth.Principal,
        tenant: str,
        item_id: str,
        idem: Idempotency,
        instance: str,
        *,
        worker: str,
        fence: int,
        change: Callable[[Conn], Awaitable[Row | None]],
        on_refusal: Callable[[Conn, errors.QueueServerError], Awaitable[None]] | None = None,
        roles: tuple[Role, ...] = (Role.WORKER,),
    ) -> Answer:
        """The holder's `change` under the receipt, or its precise refusal. A key of `roles`
        other than a worker's (an operator's, for triage) holds no lease: its `change` must
        refuse, and its refusal is explained whatever name and fence it presented."""
        principal.require(tenant, *roles)
        require_item_id(item_id)
        holder = None if principal.role is Role.OPERATOR else worker

        async def operation(conn: Conn) -> Answer:
            row = await change(conn)
            if row is None:
                refusal = await transitions.explain_rejection(
                    conn,
                    tenant=tenant,
                    item_id=item_id,
                    worker=holder,
                    key_id=principal.key_id,
                    fence=fence,
                )
                if on_refusal is not None and not isinstance(refusal, errors.NotFoundError):
                    await on_refusal(conn, refusal)
                raise refusal
            return Answer.of(200, views.item(row))

        return await self.effects.run_pipelined(tenant, idem, instance, operation)

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
        async def change(conn: Conn) -> Row | None:
            return await transitions.complete(
                conn,
                tenant=tenant,
                item_id=item_id,
                worker=worker,
                key_id=principal.key_id,
                fence=fence,
                result=result,
            )

        return await self._holder_effect(
            principal, tenant, item_id, idem, instance, worker=worker, fence=fence, change=change
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
            refusals = (
                await transitions.explain_rejections(
                    conn, tenant=tenant, worker=worker, key_id=principal.key_id, fences=refused
                )
                if refused
                else {}
            )
            results = []
            for item_id in ids:
                if item_id in done:
                    results.append(
                        {"item_id": item_id, "status": 200, "item": views.item(done[item_id])}
                    )
                    continue
                refusal = refusals.get(item_id) or errors.ItemNotFoundError(item_id=item_id)
                problem = errors.problem(
                    refusal, base_uri=self.settings.problem_base_uri, instance=instance
                )
                results.append({"item_id": item_id, "status": refusal.status, "problem": problem})
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

        async def change(conn: Conn) -> Row | None:
            return await transitions.requeue(
                conn,
                tenant=tenant,
                item_id=item_id,
                worker=worker,
                key_id=principal.key_id,
                fence=fence,
                reason=reason,
                delay=delay,
                backoff=self._backoff,
                failure=failure,
            )

        return await self._holder_effect(
            principal, tenant, item_id, idem, instance, worker=worker, fence=fence, change=change
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

        holds_leases = principal.role is not Role.OPERATOR

        async def change(conn: Conn) -> Row | None:
            if not holds_leases:
                return None
            return await transitions.triage(
                conn,
                tenant=tenant,
                item_id=item_id,
                worker=worker,
                key_id=principal.key_id,
                fence=fence,
                failure=failure,
                quarantine=quarantine,
                delay=delay,
                backoff=self._backoff,
            )

        async def record(conn: Conn, refusal: errors.QueueServerError) -> None:
            # A refused triage is still an observable failure fact.
            await transitions.record_triage_rejected(
                conn,
                tenant=tenant,
                item_id=item_id,
                worker=worker,
                fence=fence,
                failure=failure,
                reason=refusal.code,
                actor=worker if holds_leases else principal.actor,
            )

        return await self._holder_effect(
            principal,
            tenant,
            item_id,
            idem,
            instance,
            worker=worker,
            fence=fence,
            change=change,
            on_refusal=record,
            roles=WORKER_OR_OPERATOR,
        )
