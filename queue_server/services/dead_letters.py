"""Operator work: dead-letter triage (list, show, replay, discard, bulk replay), queue status,
and ledger verification. Transaction boundaries and checks; the SQL is in the store."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from queue_server import auth, errors, views
from queue_server.models import ItemState, Role, is_uuid
from queue_server.services import ledgers, watchers
from queue_server.services.items import Answer, Idempotency, QueueService
from queue_server.store import dead_letters, reads, tenants, transitions
from queue_server.store import outbox as outbox_store
from queue_server.store.types import Conn, Row

MAX_BULK_REPLAY = 100
MAX_VERIFY_PAGE = 1000


def _ok(status: int, body: Any) -> Answer:
    return Answer(status=status, body=views.dumps(body))


def dead_letter_view(row: Row) -> dict[str, Any]:
    return {
        "dead_letter_id": str(row["dead_letter_id"]),
        "kind": row["kind"],
        "item_id": str(row["item_id"]) if row["item_id"] else None,
        "delivery_id": str(row["delivery_id"]) if row["delivery_id"] else None,
        "queue": row["queue"],
        "reason": row["reason"],
        "last_failure": row["last_failure"],
        "created_at": row["created_at"],
        "closed_at": row["closed_at"],
        "resolution": row["resolution"],
    }


def encode_cursor(parts: list[str]) -> str:
    return base64.urlsafe_b64encode(orjson.dumps(parts)).decode().rstrip("=")


def decode_cursor(cursor: str, size: int) -> list[str]:
    """An opaque cursor back into its parts; a cursor we did not make is a 422."""
    try:
        parts = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, orjson.JSONDecodeError):
        parts = None
    if (
        not isinstance(parts, list)
        or len(parts) != size
        or not all(isinstance(p, str) for p in parts)
    ):
        raise errors.InvalidRequestError("The cursor is not one this server issued.")
    return parts


class _SkipItemError(Exception):
    """Rolls one item's savepoint back during a bulk replay."""


@dataclass(frozen=True, slots=True)
class Mismatch:
    tenant: str
    item_id: str
    problems: list[str]


def verify_rows(rows: list[Row]) -> list[Mismatch]:
    """Fold each item's ledger (rows carry it as `events`) and compare it with the row."""
    found = []
    for row in rows:
        problems = ledgers.mismatches(row, row["events"])
        if problems:
            found.append(Mismatch(row["tenant_id"], str(row["item_id"]), problems))
    return found


class Operators:
    """Dead letters and verification, on the service's pool and idempotency receipts."""

    def __init__(self, service: QueueService) -> None:
        self.service = service

    async def _require_tenant(self, conn: Conn, tenant: str) -> Row:
        row = await tenants.get_tenant(conn, tenant)
        if row is None:
            raise errors.TenantNotFoundError(tenant=tenant)
        return row

    # -- reads ---------------------------------------------------------------

    async def whoami(self, principal: auth.Principal) -> Answer:
        return _ok(
            200,
            {"key_id": principal.key_id, "tenant": principal.tenant, "role": principal.role},
        )

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
            at, dead_letter_id = decode_cursor(cursor, 2)
            try:
                after = (datetime.fromisoformat(at), dead_letter_id)
            except ValueError:
                raise errors.InvalidRequestError(
                    "The cursor is not one this server issued."
                ) from None
            if not is_uuid(dead_letter_id):
                raise errors.InvalidRequestError("The cursor is not one this server issued.")
        async with self.service._conn() as conn:
            await self._require_tenant(conn, tenant)
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
            next_cursor = encode_cursor(
                [last["created_at"].isoformat(), str(last["dead_letter_id"])]
            )
        return _ok(
            200,
            {"dead_letters": [dead_letter_view(r) for r in rows], "next_cursor": next_cursor},
        )

    async def show_dead_letter(
        self, principal: auth.Principal, tenant: str, dead_letter_id: str
    ) -> Answer:
        """The dead letter, its item as it is now, and the item's whole ledger."""
        principal.require(tenant, Role.OPERATOR)
        if not is_uuid(dead_letter_id):
            raise errors.DeadLetterNotFoundError(dead_letter_id=dead_letter_id)
        async with self.service._conn() as conn:
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
                delivery = await outbox_store.get_delivery(
                    conn, tenant=tenant, delivery_id=str(row["delivery_id"])
                )
        return _ok(
            200,
            {
                "dead_letter": dead_letter_view(row),
                "item": views.item(item) if item else None,
                "events": [views.event(e) for e in events],
                "delivery": watchers.delivery_view(delivery) if delivery else None,
            },
        )

    async def queue_status(self, principal: auth.Principal, tenant: str) -> Answer:
        """Per queue: ready, due, leased, quarantined, oldest due age, concurrency limit."""
        principal.require(tenant, Role.WORKER, Role.OPERATOR)
        async with self.service._conn() as conn:
            row = await self._require_tenant(conn, tenant)
            backlog = await tenants.backlog(conn, tenant)
            queues = []
            for q in await dead_letters.queue_status(conn, tenant=tenant):
                limits = await tenants.concurrency(conn, tenant=tenant, queue=q["queue"])
                age = q["oldest_ready_age"]
                queues.append(
                    {
                        "queue": q["queue"],
                        "ready": q["ready"],
                        "due": q["due"],
                        "leased": q["leased"],
                        "quarantined": q["quarantined"],
                        "oldest_ready_age": float(age) if age is not None else None,
                        "concurrency_limit": limits["limit"],
                        "active_leases": limits["active_leases"],
                    }
                )
            open_dead_letters = await dead_letters.count_open(conn, tenant=tenant)
        return _ok(
            200,
            {
                "tenant": tenant,
                "backlog": backlog,
                "backlog_cap": row["backlog_cap"],
                "open_dead_letters": open_dead_letters,
                "queues": queues,
            },
        )

    # -- effects -------------------------------------------------------------

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
    ) -> Answer:
        """quarantined -> ready with a renewed budget; the dead letter is closed."""
        principal.require(tenant, Role.OPERATOR)
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
            item = await transitions.replay(
                conn,
                tenant=tenant,
                dead_letter_id=dead_letter_id,
                max_acquisitions=max_acquisitions,
                actor=principal.actor,
            )
            if item is None:
                # Both rows are locked and were checked: a 500 rolls everything back.
                raise errors.QueueServerError("The replay changed nothing; nothing was kept.")
            return _ok(200, views.item(item))

        return await self.service._effect(tenant, idem, instance, operation)

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
            return _ok(200, views.item(item))

        return await self.service._effect(tenant, idem, instance, operation)

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
        """Replay up to `limit` of the queue's oldest open item dead letters, each in a savepoint.

        A dead letter whose item is no longer quarantined is skipped and left as it was;
        `remaining` says how many open ones the queue still has.
        """
        principal.require(tenant, Role.OPERATOR)

        async def operation(conn: Conn) -> Answer:
            await self._require_tenant(conn, tenant)
            replayed: list[str] = []
            skipped: list[str] = []
            for row in await dead_letters.open_for_queue(
                conn, tenant=tenant, queue=queue, limit=limit
            ):
                dead_letter_id = str(row["dead_letter_id"])
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
                        )
                        if item is None:
                            raise _SkipItemError()
                    replayed.append(str(item["item_id"]))
                except _SkipItemError:
                    skipped.append(dead_letter_id)
            remaining = await dead_letters.count_open(conn, tenant=tenant, queue=queue)
            return _ok(
                200,
                {
                    "queue": queue,
                    "replayed": len(replayed),
                    "skipped": len(skipped),
                    "remaining": remaining,
                    "item_ids": replayed,
                    "skipped_dead_letter_ids": skipped,
                },
            )

        return await self.service._effect(tenant, idem, instance, operation)

    # -- verification --------------------------------------------------------

    async def verify_ledgers(
        self,
        principal: auth.Principal,
        tenant: str | None,
        *,
        limit: int,
        cursor: str | None,
    ) -> Answer:
        """Fold the ledgers of one page of items (of a tenant, or of all tenants for an admin)."""
        if tenant is None:
            principal.require_admin()
        else:
            principal.require(tenant, Role.OPERATOR)
        after: tuple[str, str] | None = None
        if cursor:
            after_tenant, after_item = decode_cursor(cursor, 2)
            if not is_uuid(after_item):
                raise errors.InvalidRequestError("The cursor is not one this server issued.")
            after = (after_tenant, after_item)
        async with self.service._conn() as conn:
            if tenant is not None:
                await self._require_tenant(conn, tenant)
            rows = await dead_letters.verification_page(
                conn, tenant=tenant, after=after, limit=limit
            )
        found = verify_rows(rows)
        next_cursor = None
        if len(rows) == limit:
            last = rows[-1]
            next_cursor = encode_cursor([last["tenant_id"], str(last["item_id"])])
        return _ok(
            200,
            {
                "checked": len(rows),
                "mismatches": [
                    {"tenant": m.tenant, "item_id": m.item_id, "problems": m.problems}
                    for m in found
                ],
                "next_cursor": next_cursor,
            },
        )
