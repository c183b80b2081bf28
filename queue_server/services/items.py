"""Items: enqueue (under the backlog cap), reads and pages, and an operator's cancel, retry
and delete (one item, or a page of a filter). Their leases are `services.leases`.
Transaction boundaries and checks; each state change is one statement of
`store.transitions`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson

from queue_server import auth, errors, views
from queue_server.db import Database, admission_refusals
from queue_server.idempotency import Answer, Effects, Idempotency
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
from queue_server.services.item_specs import CallbackSpec, ItemSpec, NewItem, resolve_dependencies
from queue_server.services.leases import Wakeups
from queue_server.settings import Settings
from queue_server.store import reads, tenants, transitions
from queue_server.store.types import Conn, Row
from queue_server.tracecontext import TraceContext

MAX_BULK_CANCEL = 1000
CANCELLABLE = (ItemState.WAITING, ItemState.READY, ItemState.LEASED, ItemState.QUARANTINED)
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


@dataclass(frozen=True, slots=True)
class BulkPage:
    """One page of an operator's bulk action: at most `limit` items of `filter` after
    `cursor`, answered under the receipt of `instance` (the REST path it is known by)."""

    instance: str
    filter: ItemFilter
    limit: int
    cursor: str | None = None

    def checked(self, allowed: Sequence[str] | None = None, done: str = "") -> BulkPage:
        """This page with its filter checked, its limit in range and, given `allowed`, its
        filter's state one of them (else the action `done` would refuse it)."""
        filter = self.filter.checked()
        if allowed is not None and filter.state not in allowed:
            raise errors.InvalidRequestError(
                f"Only {' or '.join(allowed)} items can be {done}: filter on one of them."
            )
        if not 1 <= self.limit <= MAX_BULK_CANCEL:
            raise errors.InvalidRequestError(f"limit must be 1 to {MAX_BULK_CANCEL}.")
        return BulkPage(self.instance, filter, self.limit, self.cursor)


@dataclass(frozen=True, slots=True)
class Bulk:
    """What a bulk action did to its page: the rows it changed, how many of the page's
    first items it took (the next page starts after them), and fields of its own answer."""

    rows: list[Row]
    taken: int
    extra: dict[str, Any] = field(default_factory=dict)


# The most items of a workflow's graph read at once (REST and the console's drawing).
WORKFLOW_NODES = 200


class Items:
    """Enqueue, read, cancel, retry and delete work items."""

    def __init__(
        self,
        db: Database,
        effects: Effects,
        settings: Settings,
        *,
        policy: ReliabilityPolicy,
        wakeups: Wakeups,
    ) -> None:
        self.db = db
        self.policy = policy
        self.envelope = LeaseEnvelope(policy)
        self.effects = effects
        self.settings = settings
        self.wakeups = wakeups

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
        callback: CallbackSpec | None = None,
    ) -> Answer:
        """Enqueue `items` (new ids), each with the producer's `trace`, once per key.

        The admission locks the tenant's admission shards it is charged to until the
        commit; concurrent enqueues of a tenant take other shards and never wait for it.
        """
        principal.require(tenant, *WORKER_OR_OPERATOR)
        budgets: list[tuple[int | None, tuple[str | int, ...]]] = [
            (item.max_acquisitions, ("items", i) if batch else ()) for i, item in enumerate(items)
        ]
        if callback is not None:
            budgets.append((callback.max_acquisitions, ("callback",)))
        refuse_above(
            [
                self.envelope.budget(budget, "body", *at, "max_acquisitions")
                for budget, at in budgets
                if budget is not None
            ]
        )
        # An item with a unique key may be answered by the item holding it, charged nothing:
        # only those without one are sure to be charged (the admission decides exactly).
        charged = sum(i.unique_key is None for i in items) + (callback is not None)
        await self._refuse_early_at_cap(tenant, idem, charged)
        specs = self._specs(items, uuid7s(len(items)), trace)

        # A dependency refused (migration 0035) is kept on the receipt like any 422: the
        # admission runs in a savepoint then, so that the transaction can still keep it.
        dependent = callback is not None or any("depends_on" in spec for spec in specs)

        async def operation(conn: Conn) -> Answer:
            # With a callback, the batch and its callback are admitted together or not at
            # all: a callback refused (a dependency unknown, the cap) leaves no item behind.
            with admission_refusals(tenant):
                async with conn.transaction() if dependent else contextlib.nullcontext():
                    done = await self._admit_rows(conn, principal, tenant, queue, specs)
                    shaped = await self._answered(conn, tenant, queue, specs, done)
                    if callback is not None:
                        answered = await self._fan_in(
                            conn,
                            principal,
                            tenant,
                            callback.queue or queue,
                            callback,
                            shaped,
                            trace,
                        )
            if callback is not None:
                return Answer(201, views.dumps({"items": shaped, "callback": answered}))
            if batch:
                return Answer(201, views.dumps({"items": shaped}))
            # One item whose unique key an item already holds: that item, nothing created.
            made = specs[0]["item_id"] in done.written
            return Answer(201 if made else 200, views.dumps(shaped[0]))

        answer = await self.effects.run(tenant, idem, instance, operation)
        if answer.status < 300:  # committed: this process's waiters look now (others: the watch)
            for woken in {queue, (callback.queue or queue) if callback else queue}:
                self.wakeups.wake(tenant, woken)
        return answer

    async def _fan_in(
        self,
        conn: Conn,
        principal: auth.Principal,
        tenant: str,
        into: str,
        callback: CallbackSpec,
        shaped: Sequence[dict[str, Any]],
        trace: TraceContext | None,
    ) -> dict[str, Any]:
        """The fan-in: one more item, depending on every item the batch answered with and
        those the callback names, run once each is finished, completed or not."""
        named = {str(item_id).lower() for item_id in callback.depends_on or ()}
        fan_in = self._specs(
            [
                NewItem(
                    payload=callback.payload,
                    priority=callback.priority,
                    max_acquisitions=callback.max_acquisitions,
                    depends_on=sorted(named | {str(item["item_id"]) for item in shaped}),
                    on_dependency_failure="run",
                )
            ],
            uuid7s(1),
            trace,
        )
        joined = await self._admit_rows(conn, principal, tenant, into, fan_in)
        (answered,) = await self._answered(conn, tenant, into, fan_in, joined)
        return answered

    async def _admit_rows(
        self,
        conn: Conn,
        principal: auth.Principal,
        tenant: str,
        queue: str,
        specs: list[dict[str, Any]],
    ) -> transitions.Enqueued:
        """The rows of `specs` admitted into `queue`, within the policy's envelope."""
        return await transitions.enqueue_rows(
            conn,
            tenant=tenant,
            queue=queue,
            items=specs,
            actor=principal.actor,
            attempt_cap=self.envelope.leased.attempt_cap,
            backlog_ceiling=self.envelope.leased.backlog_cap,
        )

    @staticmethod
    async def _answered(
        conn: Conn,
        tenant: str,
        queue: str,
        specs: list[dict[str, Any]],
        done: transitions.Enqueued,
    ) -> list[dict[str, Any]]:
        """Each item asked for as the answer shows it, in order: the one made, or the item
        holding its unique key (made by this enqueue for an earlier entry, or read)."""
        made = views.enqueued(
            tenant, queue, [s for s in specs if s["item_id"] in done.written], done.written
        )
        by_id = {item["item_id"]: item for item in made}
        shaped = []
        for spec in specs:
            found = by_id.get(spec["item_id"])
            if found is None:
                holder = done.holders[spec["unique_key"]]
                if holder not in by_id:
                    row = await reads.get_item(conn, tenant=tenant, item_id=holder)
                    assert row is not None  # the admission saw it ready or leased
                    by_id[holder] = views.item(row)
                found = by_id[holder]
            shaped.append(found)
        return shaped

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
        needs = resolve_dependencies(items, ids)
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
                # The keys an item may carry, those it has.
                **{
                    name: value
                    for name in ("unique_key", "unique_for", "ordering_key", "partition_key")
                    if (value := getattr(item, name)) is not None
                },
                # What it depends on (ids as text), and its rule.
                **(
                    {}
                    if needs[i] is None
                    else {
                        "depends_on": needs[i],
                        "on_dependency_failure": item.on_dependency_failure,
                    }
                ),
            }
            for i, (item, item_id) in enumerate(zip(items, ids, strict=True))
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
        if adding == 0:
            return
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
        descendants: bool = False,
    ) -> Answer:
        """waiting, ready, leased or quarantined -> cancelled; the ledger keeps who and why.
        With `descendants`, every item depending on it too, in the same transaction."""
        principal.require(tenant, Role.OPERATOR)
        require_item_id(item_id)

        async def operation(conn: Conn) -> Answer:
            rows = await transitions.cancel(
                conn, tenant=tenant, item_ids=[item_id], reason=reason, actor=principal.actor
            )
            if rows:
                below = (
                    await reads.descendants(conn, tenant=tenant, item_id=item_id)
                    if descendants
                    else []
                )
                if below:
                    # Those still unfinished, whatever their rule (its own cancel has
                    # cancelled the waiting ones whose rule is `cancel` already).
                    await transitions.cancel(
                        conn, tenant=tenant, item_ids=below, reason=reason, actor=principal.actor
                    )
                return Answer.of(200, views.item(rows[0]))
            row = await reads.get_item(conn, tenant=tenant, item_id=item_id)
            if row is None:
                raise errors.ItemNotFoundError(item_id=item_id)
            raise errors.InvalidStateError(
                f"The item is {row['state']}; only waiting, ready, leased or quarantined items"
                " can be cancelled.",
                item_id=item_id,
                state=row["state"],
            )

        return await self.effects.run(tenant, idem, instance, operation)

    async def cancel_many(
        self,
        principal: auth.Principal,
        tenant: str,
        idem: Idempotency,
        page: BulkPage,
        *,
        reason: str,
    ) -> Answer:
        """Cancel the ready, leased and quarantined items of one page of a filter, in one
        transaction. `next_cursor` resumes after the page; null when the filter has no more
        items."""
        principal.require(tenant, Role.OPERATOR)
        page = page.checked()
        state = page.filter.state
        if state is not None and state not in CANCELLABLE:
            raise errors.InvalidRequestError(
                f"{state} items cannot be cancelled; filter on ready, leased or"
                " quarantined items, or on none."
            )

        async def cancel(conn: Conn, rows: list[Row]) -> Bulk:
            cancelled = await transitions.cancel(
                conn,
                tenant=tenant,
                item_ids=[str(row["item_id"]) for row in rows],
                reason=reason,
                actor=principal.actor,
                state=state,
            )
            return Bulk(cancelled, len(rows))

        return await self._bulk(tenant, idem, page, "cancelled", cancel, open_only=True)

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

    async def _bulk(
        self,
        tenant: str,
        idem: Idempotency,
        page: BulkPage,
        verb: str,
        act: Callable[[Conn, list[Row]], Awaitable[Bulk]],
        *,
        open_only: bool,
    ) -> Answer:
        """An operator's bulk action on one page, in one transaction, once per key: `act`
        changes the page's first items and says how many it took; the answer counts the rows
        it changed under `verb`, with their ids and `next_cursor`, after the last item taken
        while any is left."""
        after = _item_cursor(page.cursor)

        async def operation(conn: Conn) -> Answer:
            await require_tenant(conn, tenant)
            rows = await self._page(
                conn, tenant, page.filter, after, page.limit, open_only=open_only
            )
            more = len(rows) > page.limit
            rows = rows[: page.limit]
            done = await act(conn, rows)
            left = more or done.taken < len(rows)
            return Answer.of(
                200,
                {
                    verb: len(done.rows),
                    "item_ids": [str(row["item_id"]) for row in done.rows],
                    **done.extra,
                    "next_cursor": _position(rows[done.taken - 1]) if done.taken and left else None,
                },
            )

        return await self.effects.run(tenant, idem, page.instance, operation)

    async def retry_many(
        self, principal: auth.Principal, tenant: str, idem: Idempotency, page: BulkPage
    ) -> Answer:
        """Make one page of a filter's quarantined or cancelled items ready now, as a replay:
        back in the backlog within the tenant's cap (admission shards). Those past the cap's
        room are left as they were (`over_cap`; 429 when none fits), and `next_cursor`
        resumes after the last one retried."""
        principal.require(tenant, Role.OPERATOR)
        page = page.checked(RETRYABLE, "retried")

        async def retry(conn: Conn, rows: list[Row]) -> Bulk:
            shards, cap = await admission_room(conn, tenant, len(rows), self.envelope, "retried")
            retried = await transitions.retry(
                conn,
                tenant=tenant,
                item_ids=[str(r["item_id"]) for r in rows[: len(shards)]],
                shards=shards,
                state=str(page.filter.state),
                actor=principal.actor,
            )
            over = {"over_cap": len(rows) - len(shards), "backlog_cap": cap}
            return Bulk(retried, len(shards), over)

        return await self._bulk(tenant, idem, page, "retried", retry, open_only=False)

    async def delete_many(
        self, principal: auth.Principal, tenant: str, idem: Idempotency, page: BulkPage
    ) -> Answer:
        """Delete one page of a filter's completed or cancelled items with their ledgers, in
        one transaction; `next_cursor` resumes after the page."""
        principal.require(tenant, Role.OPERATOR)
        page = page.checked(DELETABLE, "deleted")

        async def delete(conn: Conn, rows: list[Row]) -> Bulk:
            deleted = await transitions.delete_finished(
                conn,
                tenant=tenant,
                item_ids=[str(r["item_id"]) for r in rows],
                state=str(page.filter.state),
                actor=principal.actor,
            )
            return Bulk(deleted, len(rows))

        return await self._bulk(tenant, idem, page, "deleted", delete, open_only=False)

    async def dependencies(
        self, principal: auth.Principal, tenant: str, item_id: str, limit: int, cursor: str | None
    ) -> Answer:
        """The items `item_id` depends on, as they are now (a fan-in's worker reads its batch's
        results and failures here), a page in id order; `next_cursor` null on the last; how
        many in all, and how many of them a waiting item still waits for."""
        principal.require(tenant, *WORKER_OR_OPERATOR)
        after = None
        if cursor:
            (after,) = common.decode_cursor(cursor, 1)
            if not is_uuid(after):
                raise common.foreign_cursor()
        item_id = str((await self._item_row(tenant, item_id, by_end=False))["item_id"])
        async with self.db.conn() as conn:
            rows = await reads.dependencies(
                conn, tenant=tenant, item_id=item_id, after=after, limit=limit + 1
            )
            total, waiting_for = await reads.dependency_count(conn, tenant=tenant, item_id=item_id)
        next_cursor = None
        if len(rows) > limit:
            rows = rows[:limit]
            next_cursor = common.encode_cursor([str(rows[-1]["item_id"])])
        return Answer.of(
            200,
            {
                "items": [views.item(r) for r in rows],
                "next_cursor": next_cursor,
                "total": total,
                "waiting_for": waiting_for,
            },
        )

    async def workflow(
        self, principal: auth.Principal, tenant: str, item_id: str, limit: int = WORKFLOW_NODES
    ) -> Answer:
        """The graph the item is part of: every item it waits for, directly or not, every item
        waiting for it, and itself (at most `limit`, `complete` false when cut there), each
        with its state and its dependencies among them."""
        principal.require(tenant, *WORKER_OR_OPERATOR)
        item_id = str((await self._item_row(tenant, item_id, by_end=False))["item_id"])
        async with self.db.conn() as conn:
            rows = await reads.workflow(conn, tenant=tenant, item_id=item_id, limit=limit + 1)
        complete = len(rows) <= limit
        if not complete:
            # One more than the answer holds, in id order: the last other than the item
            # itself goes (the statement never cuts the item, wherever its id sorts).
            cut = next(r for r in reversed(rows) if r["item_id"] != item_id)
            rows = [r for r in rows if r is not cut]
        kept = {r["item_id"] for r in rows}
        nodes = [
            {"item_id": r["item_id"], "queue": r["queue"], "state": r["state"],
             "depends_on": [d for d in r["depends_on"] if d in kept]}
            for r in rows
        ]  # fmt: skip
        return Answer.of(200, {"item_id": item_id, "nodes": nodes, "complete": complete})

    async def ledger(self, principal: auth.Principal, tenant: str, item_id: str) -> Answer:
        principal.require(tenant, *WORKER_OR_OPERATOR)
        by_end = _looks_by_hand(principal)
        item_id = str((await self._item_row(tenant, item_id, by_end=by_end))["item_id"])
        async with self.db.conn() as conn:
            events = await reads.ledger(conn, tenant=tenant, item_id=item_id)
        return Answer.of(200, {"item_id": item_id, "events": [views.event(e) for e in events]})
