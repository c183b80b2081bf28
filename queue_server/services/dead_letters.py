"""Dead letters: list, show, replay, discard, and replay a queue's letters in bulk.

An item's letter is resolved by `store.transitions` (replay, discard) under the
letter's row lock; a dead webhook delivery's letter by the watchers service.
A replayed item is back in the backlog: replay is admitted like an enqueue, within the
tenant's backlog cap, charged to an admission shard it locks (`admission_room`).
"""

from __future__ import annotations

from datetime import datetime

from queue_server import auth, errors, views
from queue_server.db import Database
from queue_server.idempotency import Answer, Effects, Idempotency
from queue_server.models import ItemState, Role, is_uuid
from queue_server.policy import ReliabilityPolicy
from queue_server.services import common, watchers
from queue_server.services.common import admission_room, require_tenant
from queue_server.services.envelope import LeaseEnvelope, refuse_above
from queue_server.store import dead_letters, outbox, reads, transitions
from queue_server.store.types import Conn, Row

MAX_BULK_REPLAY = 100


class _SkipItemError(Exception):
    """Rolls one item's savepoint back during a bulk replay."""


class DeadLetters:
    """List, show, replay and discard dead letters; replay a queue's dead letters in bulk."""

    def __init__(self, db: Database, effects: Effects, policy: ReliabilityPolicy) -> None:
        self.db = db
        self.effects = effects
        self.envelope = LeaseEnvelope(policy)

    async def list_dead_letters(
        self,
        principal: auth.Principal,
        tenant: str,
        *,
        queue: str | None,
        kind: str | None,
        status: str,
        limit: int,
        cursor: str | None,
    ) -> Answer:
        """A page in (created_at, dead_letter_id) order; `next_cursor` is null on the last page."""
        principal.require(tenant, Role.OPERATOR)
        after: tuple[datetime, str] | None = None
        if cursor:
            at, dead_letter_id = common.decode_cursor(cursor, 2)
            try:
                after = (datetime.fromisoformat(at), dead_letter_id)
            except ValueError:
                raise common.foreign_cursor() from None
            if not is_uuid(dead_letter_id):
                raise common.foreign_cursor()
        async with self.db.conn() as conn:
            await require_tenant(conn, tenant)
            rows = await dead_letters.list_page(
                conn,
                tenant=tenant,
                queue=queue,
                kind=kind,
                status=status,
                after=after,
                limit=limit + 1,
            )
        next_cursor = None
        if len(rows) > limit:
            rows = rows[:limit]
            last = rows[-1]
            next_cursor = common.encode_cursor(
                [last["created_at"].isoformat(), str(last["dead_letter_id"])]
            )
        return Answer.of(
            200,
            {"dead_letters": [views.dead_letter(r) for r in rows], "next_cursor": next_cursor},
        )

    async def dead_letter_of_delivery(
        self, principal: auth.Principal, tenant: str, delivery_id: str
    ) -> str:
        """The id of a delivery's dead letter (the open one, else the latest); 404 if none."""
        principal.require(tenant, Role.OPERATOR)
        row = None
        if is_uuid(delivery_id):
            async with self.db.conn() as conn:
                row = await dead_letters.latest_for_delivery(
                    conn, tenant=tenant, delivery_id=delivery_id
                )
        if row is None:
            raise errors.DeadLetterNotFoundError(
                "This delivery was never dead-lettered.", delivery_id=delivery_id
            )
        return str(row["dead_letter_id"])

    async def open_dead_letter_of_item(
        self, principal: auth.Principal, tenant: str, item_id: str
    ) -> str | None:
        """The id of the item's open dead letter; None if it has none."""
        principal.require(tenant, Role.OPERATOR)
        if not is_uuid(item_id):
            return None
        async with self.db.conn() as conn:
            row = await dead_letters.open_for_item(conn, tenant=tenant, item_id=item_id)
        return None if row is None else str(row["dead_letter_id"])

    async def show_dead_letter(
        self, principal: auth.Principal, tenant: str, dead_letter_id: str
    ) -> Answer:
        """The dead letter, its item as it is now, and the item's whole ledger."""
        principal.require(tenant, Role.OPERATOR)
        if not is_uuid(dead_letter_id):
            raise errors.DeadLetterNotFoundError(dead_letter_id=dead_letter_id)
        async with self.db.conn() as conn:
            row = await dead_letters.get(conn, tenant=tenant, dead_letter_id=dead_letter_id)
            if row is None:
                raise errors.DeadLetterNotFoundError(dead_letter_id=dead_letter_id)
            item = None
            events: list[Row] = []
            if row["item_id"] is not None:
                item_id = str(row["item_id"])
                item = await reads.get_item(conn, tenant=tenant, item_id=item_id)
                events = await reads.ledger(conn, tenant=tenant, item_id=item_id)
            delivery = None
            if row["delivery_id"] is not None:
                delivery = await outbox.get_delivery(
                    conn, tenant=tenant, delivery_id=str(row["delivery_id"])
                )
        return Answer.of(
            200,
            {
                "dead_letter": views.dead_letter(row),
                "item": views.item(item) if item else None,
                "events": [views.event(e) for e in events],
                "delivery": views.delivery(delivery) if delivery else None,
            },
        )

    @staticmethod
    def _check_resolvable(row: Row | None, dead_letter_id: str) -> Row:
        if row is None:
            raise errors.DeadLetterNotFoundError(dead_letter_id=dead_letter_id)
        if row["closed_at"] is not None:
            raise errors.DeadLetterClosedError(
                f"This dead letter was already {row['resolution']}.",
                dead_letter_id=dead_letter_id,
                resolution=row["resolution"],
            )
        if row["kind"] != "item" or row["item_id"] is None:
            raise errors.InvalidStateError(
                "Only item dead letters are replayed or discarded here.",
                dead_letter_id=dead_letter_id,
                kind=row["kind"],
            )
        return row

    async def replay(
        self,
        principal: auth.Principal,
        tenant: str,
        dead_letter_id: str,
        idem: Idempotency,
        *,
        instance: str,
        max_acquisitions: int | None,
        descendants: bool = False,
    ) -> Answer:
        """quarantined -> ready with a renewed budget; the dead letter is closed. With
        `descendants`, the workflow goes on from this step: the items below it that its
        failure cancelled are back, each waiting for what it depends on."""
        principal.require(tenant, Role.OPERATOR)
        refuse_above([self.envelope.budget(max_acquisitions, "body", "max_acquisitions")])
        if not is_uuid(dead_letter_id):
            raise errors.DeadLetterNotFoundError(dead_letter_id=dead_letter_id)

        async def operation(conn: Conn) -> Answer:
            locked = await dead_letters.lock_for_resolution(
                conn, tenant=tenant, dead_letter_id=dead_letter_id
            )
            if locked is not None and locked["kind"] == "delivery" and not locked["closed_at"]:
                # A dead webhook delivery: pending again, fresh budget, same delivery key.
                return await watchers.resolve_dead_delivery(
                    conn, tenant=tenant, dead_letter=locked, replay=True
                )
            row = self._check_resolvable(locked, dead_letter_id)
            if row["item_state"] != ItemState.QUARANTINED:
                raise errors.InvalidStateError(
                    f"The item is {row['item_state']}, not quarantined.",
                    item_id=str(row["item_id"]),
                    state=row["item_state"],
                )
            (shard,), _ = await admission_room(conn, tenant, 1, self.envelope, "replayed")
            item = await transitions.replay(
                conn,
                tenant=tenant,
                dead_letter_id=dead_letter_id,
                max_acquisitions=max_acquisitions,
                actor=principal.actor,
                shard=shard,
            )
            if item is None:
                # Both rows are locked and were checked: a 500 rolls everything back.
                raise errors.QueueServerError("The replay changed nothing; nothing was kept.")
            if descendants:
                below = await reads.descendants(conn, tenant=tenant, item_id=str(item["item_id"]))
                back = await reads.cancelled_by_dependency(conn, tenant=tenant, item_ids=below)
                if back:
                    shards, _ = await admission_room(
                        conn, tenant, len(back), self.envelope, "replayed"
                    )
                    # As many as the backlog cap has room for; the rest stay cancelled.
                    await transitions.retry(
                        conn,
                        tenant=tenant,
                        item_ids=back[: len(shards)],
                        shards=list(shards),
                        state="cancelled",
                        actor=principal.actor,
                    )
            return Answer.of(200, views.item(item))

        return await self.effects.run(tenant, idem, instance, operation)

    async def discard(
        self,
        principal: auth.Principal,
        tenant: str,
        dead_letter_id: str,
        idem: Idempotency,
        *,
        instance: str,
        reason: str,
    ) -> Answer:
        """Any state but completed -> cancelled; the dead letter is closed."""
        principal.require(tenant, Role.OPERATOR)
        if not is_uuid(dead_letter_id):
            raise errors.DeadLetterNotFoundError(dead_letter_id=dead_letter_id)

        async def operation(conn: Conn) -> Answer:
            locked = await dead_letters.lock_for_resolution(
                conn, tenant=tenant, dead_letter_id=dead_letter_id
            )
            if locked is not None and locked["kind"] == "delivery" and not locked["closed_at"]:
                return await watchers.resolve_dead_delivery(
                    conn, tenant=tenant, dead_letter=locked, replay=False
                )
            row = self._check_resolvable(locked, dead_letter_id)
            if row["item_state"] in (None, ItemState.COMPLETED):
                raise errors.InvalidStateError(
                    f"The item is {row['item_state'] or 'gone'}; it cannot be cancelled.",
                    item_id=str(row["item_id"]),
                    state=row["item_state"],
                )
            item = await transitions.discard(
                conn,
                tenant=tenant,
                dead_letter_id=dead_letter_id,
                reason=reason,
                actor=principal.actor,
            )
            if item is None:
                raise errors.QueueServerError("The discard changed nothing; nothing was kept.")
            return Answer.of(200, views.item(item))

        return await self.effects.run(tenant, idem, instance, operation)

    async def replay_queue(
        self,
        principal: auth.Principal,
        tenant: str,
        queue: str,
        idem: Idempotency,
        *,
        instance: str,
        limit: int,
        max_acquisitions: int | None,
    ) -> Answer:
        """Replay up to `limit` of the queue's oldest open item dead letters, each in a savepoint,
        as many as the backlog cap has room for.

        A dead letter whose item is no longer quarantined is skipped and left as it was;
        those past the cap's room are left open and listed in `over_cap_dead_letter_ids`
        (a 429 when none fits at all); `remaining` says how many open ones the queue still has.
        """
        principal.require(tenant, Role.OPERATOR)
        refuse_above([self.envelope.budget(max_acquisitions, "body", "max_acquisitions")])

        async def operation(conn: Conn) -> Answer:
            await require_tenant(conn, tenant)
            replayed: list[str] = []
            skipped: list[str] = []
            over_cap: list[str] = []
            letters = await dead_letters.open_for_queue(
                conn, tenant=tenant, queue=queue, limit=limit
            )
            shards, cap = await admission_room(
                conn, tenant, len(letters), self.envelope, "replayed"
            )
            for row in letters:
                dead_letter_id = str(row["dead_letter_id"])
                if len(replayed) >= len(shards):
                    over_cap.append(dead_letter_id)
                    continue
                try:
                    async with conn.transaction():
                        locked = await dead_letters.lock_for_resolution(
                            conn, tenant=tenant, dead_letter_id=dead_letter_id
                        )
                        if locked is None or locked["item_state"] != ItemState.QUARANTINED:
                            raise _SkipItemError()
                        item = await transitions.replay(
                            conn,
                            tenant=tenant,
                            dead_letter_id=dead_letter_id,
                            max_acquisitions=max_acquisitions,
                            actor=principal.actor,
                            shard=shards[len(replayed)],
                        )
                        if item is None:
                            raise _SkipItemError()
                    replayed.append(str(item["item_id"]))
                except _SkipItemError:
                    skipped.append(dead_letter_id)
            remaining = await dead_letters.count_open(conn, tenant=tenant, queue=queue)
            return Answer.of(
                200,
                {
                    "queue": queue,
                    "replayed": len(replayed),
                    "skipped": len(skipped),
                    "over_cap": len(over_cap),
                    "remaining": remaining,
                    "backlog_cap": cap,
                    "item_ids": replayed,
                    "skipped_dead_letter_ids": skipped,
                    "over_cap_dead_letter_ids": over_cap,
                },
            )

        return await self.effects.run(tenant, idem, instance, operation)
