"""Watchers (webhook subscriptions) and their outbox: registration, state changes, secret
rotation, delivery listings, and the resolution of dead deliveries. The SQL is in
`store/outbox.py`; sending is `queue_server.workers.deliverer`."""

from __future__ import annotations

from typing import Any

from queue_server import auth, errors, views
from queue_server.models import Role, is_uuid
from queue_server.services.items import Answer, Idempotency, QueueService
from queue_server.store import outbox, tenants
from queue_server.store.outbox import EVENTS
from queue_server.store.types import Conn, Row
from queue_server.transport import AllowList, PolicyRefusedError, check_target_async
from queue_server.transport.signing import generate_secret

WORKER_OR_OPERATOR = (Role.WORKER, Role.OPERATOR)
MAX_DELIVERY_PAGE = 500


class WatcherNotFoundError(errors.NotFoundError):
    """No such watcher in this tenant."""

    code = "watcher-not-found"
    title = "Watcher not found"


class TargetRefusedError(errors.QueueServerError):
    """The watcher URL is not one the server may send to (it resolves to a private,
    loopback, link-local, multicast or unspecified address, or is not http(s))."""

    status = 422
    code = "target-refused"
    title = "Target refused"


class DeliveryNotFoundError(errors.NotFoundError):
    """No such delivery in this tenant."""

    code = "delivery-not-found"
    title = "Delivery not found"


def _ok(status: int, body: Any) -> Answer:
    return Answer(status=status, body=views.dumps(body))


def watcher_view(row: Row, counts: dict[str, int] | None = None) -> dict[str, Any]:
    """A watcher as the API shows it: never its secret."""
    body = {
        "watcher_id": str(row["watcher_id"]),
        "tenant": row["tenant_id"],
        "url": row["url"],
        "events": list(row["events"]),
        "queues": list(row["queues"]) if row["queues"] is not None else None,
        "state": row["state"],
        "disabled_reason": row["disabled_reason"],
        "previous_secret_expires_at": row["previous_secret_expires_at"],
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
    }
    if counts is not None:
        body["deliveries"] = {
            state: counts.get(state, 0) for state in ("pending", "delivered", "dead", "cancelled")
        }
    return body


def delivery_view(row: Row) -> dict[str, Any]:
    return {
        "delivery_id": str(row["delivery_id"]),
        "delivery_key": row["delivery_key"],
        "watcher_id": str(row["watcher_id"]),
        "event": row["event"],
        "item_id": str(row["item_id"]) if row["item_id"] else None,
        "queue": row["queue"],
        "state": row["state"],
        "attempts": row["attempts"],
        "next_attempt_at": row["next_attempt_at"],
        "last_attempt_at": row["last_attempt_at"],
        "last_outcome": row["last_outcome"],
        "receipts": row["receipts"],
        "receipts_omitted": row["receipts_omitted"],
        "created_at": row["created_at"],
        "delivered_at": row["delivered_at"],
    }


async def resolve_dead_delivery(
    conn: Conn, *, tenant: str, dead_letter: Row, replay: bool
) -> Answer:
    """Replay (pending again, fresh budget, same delivery key) or discard a dead delivery.

    The caller holds the dead letter's row lock; the delivery and its watcher are
    locked here, so the checks hold until the statement that acts on them.
    """
    dead_letter_id = str(dead_letter["dead_letter_id"])
    state = await outbox.delivery_watcher_state(
        conn, tenant=tenant, delivery_id=str(dead_letter["delivery_id"])
    )
    if state is None or state["state"] != "dead":
        raise errors.InvalidStateError(
            f"The delivery is {state['state'] if state else 'gone'}, not dead.",
            dead_letter_id=dead_letter_id,
        )
    if replay and state["watcher_state"] in ("cancelled", "disabled"):
        raise errors.InvalidStateError(
            f"The watcher is {state['watcher_state']}; its deliveries cannot be replayed.",
            dead_letter_id=dead_letter_id,
            watcher_id=state["watcher_id"],
        )
    row = await outbox.resolve_dead_letter(
        conn, tenant=tenant, dead_letter_id=dead_letter_id, replay=replay
    )
    if row is None:
        raise errors.QueueServerError("The resolution changed nothing; nothing was kept.")
    return _ok(200, delivery_view(row))


class Watchers:
    """Watcher routes on the service's pool and idempotency receipts."""

    def __init__(self, service: QueueService) -> None:
        self.service = service
        self.allow = AllowList.parse(service.settings.transport_allow)

    async def _check_url(self, url: str) -> None:
        """The SSRF policy at registration; the broker checks again at every dispatch."""
        try:
            await check_target_async(url, self.allow)
        except PolicyRefusedError as exc:
            raise TargetRefusedError(f"The watcher URL is refused: {exc.detail}.") from None

    async def _watcher(self, conn: Conn, tenant: str, watcher_id: str, lock: bool = False) -> Row:
        if not is_uuid(watcher_id):
            raise WatcherNotFoundError(watcher_id=watcher_id)
        row = await outbox.get_watcher(conn, tenant=tenant, watcher_id=watcher_id, lock=lock)
        if row is None:
            raise WatcherNotFoundError(watcher_id=watcher_id)
        return row

    async def create(
        self,
        principal: auth.Principal,
        tenant: str,
        idem: Idempotency,
        *,
        instance: str,
        url: str,
        events: list[str],
        queues: list[str] | None,
    ) -> Answer:
        """(nothing) -> active; the signing secret is in this answer only."""
        principal.require(tenant, *WORKER_OR_OPERATOR)
        unknown = sorted(set(events) - set(EVENTS))
        if unknown:
            raise errors.InvalidRequestError(f"Unknown events: {', '.join(unknown)}.")
        await self._check_url(url)

        async def operation(conn: Conn) -> Answer:
            if await tenants.get_tenant(conn, tenant) is None:
                raise errors.TenantNotFoundError(tenant=tenant)
            secret = generate_secret()
            row = await outbox.create_watcher(
                conn,
                tenant=tenant,
                url=url,
                events=sorted(set(events), key=events.index),
                queues=queues,
                secret=secret,
            )
            return _ok(201, {**watcher_view(row), "secret": secret})

        return await self.service._effect(tenant, idem, instance, operation)

    async def list(self, principal: auth.Principal, tenant: str) -> Answer:
        principal.require(tenant, *WORKER_OR_OPERATOR)
        async with self.service._conn() as conn:
            if await tenants.get_tenant(conn, tenant) is None:
                raise errors.TenantNotFoundError(tenant=tenant)
            rows = await outbox.list_watchers(conn, tenant=tenant)
            counts = await outbox.delivery_counts(conn, tenant=tenant)
        return _ok(
            200,
            {"watchers": [watcher_view(r, counts.get(str(r["watcher_id"]), {})) for r in rows]},
        )

    async def get(self, principal: auth.Principal, tenant: str, watcher_id: str) -> Answer:
        principal.require(tenant, *WORKER_OR_OPERATOR)
        async with self.service._conn() as conn:
            row = await self._watcher(conn, tenant, watcher_id)
            counts = await outbox.delivery_counts(conn, tenant=tenant)
        return _ok(200, watcher_view(row, counts.get(watcher_id, {})))

    async def change(
        self,
        principal: auth.Principal,
        tenant: str,
        watcher_id: str,
        idem: Idempotency,
        *,
        instance: str,
        action: str,
    ) -> Answer:
        """pause: active -> paused; resume: paused -> active; cancel: either -> cancelled.

        Pausing a paused watcher or resuming an active one changes nothing and succeeds.
        Cancelling cancels the watcher's pending deliveries in the same statement.
        """
        principal.require(tenant, *WORKER_OR_OPERATOR)

        async def operation(conn: Conn) -> Answer:
            current = await self._watcher(conn, tenant, watcher_id, lock=True)
            if action == "cancel":
                row = await outbox.cancel_watcher(conn, tenant=tenant, watcher_id=watcher_id)
            else:
                target = "paused" if action == "pause" else "active"
                row = await outbox.change_state(
                    conn,
                    tenant=tenant,
                    watcher_id=watcher_id,
                    source=("active", "paused"),
                    target=target,
                )
            if row is None:
                raise errors.InvalidStateError(
                    f"The watcher is {current['state']}; it cannot be {action}d.",
                    watcher_id=watcher_id,
                    state=current["state"],
                )
            body = watcher_view(row)
            if action == "cancel":
                body["cancelled_deliveries"] = int(row["cancelled_deliveries"])
            return _ok(200, body)

        return await self.service._effect(tenant, idem, instance, operation)

    async def rotate_secret(
        self,
        principal: auth.Principal,
        tenant: str,
        watcher_id: str,
        idem: Idempotency,
        *,
        instance: str,
    ) -> Answer:
        """A new signing secret (shown once); the old one also signs until the grace ends."""
        principal.require(tenant, *WORKER_OR_OPERATOR)

        async def operation(conn: Conn) -> Answer:
            current = await self._watcher(conn, tenant, watcher_id, lock=True)
            secret = generate_secret()
            row = await outbox.rotate_secret(
                conn,
                tenant=tenant,
                watcher_id=watcher_id,
                secret=secret,
                grace=self.service.settings.watcher_secret_grace,
            )
            if row is None:
                raise errors.InvalidStateError(
                    f"The watcher is {current['state']}; its secret cannot be rotated.",
                    watcher_id=watcher_id,
                    state=current["state"],
                )
            return _ok(200, {**watcher_view(row), "secret": secret})

        return await self.service._effect(tenant, idem, instance, operation)

    async def deliveries(
        self,
        principal: auth.Principal,
        tenant: str,
        watcher_id: str,
        *,
        state: str | None,
        limit: int,
        cursor: str | None,
    ) -> Answer:
        """The watcher's outbox rows in creation order, with attempts, schedule and receipts."""
        principal.require(tenant, *WORKER_OR_OPERATOR)
        after: int | None = None
        if cursor:
            if not cursor.isdigit():
                raise errors.InvalidRequestError("The cursor is not one this server issued.")
            after = int(cursor)
        async with self.service._conn() as conn:
            await self._watcher(conn, tenant, watcher_id)
            rows = await outbox.list_deliveries(
                conn,
                tenant=tenant,
                watcher_id=watcher_id,
                state=state,
                after_seq=after,
                limit=limit + 1,
            )
        next_cursor = None
        if len(rows) > limit:
            rows = rows[:limit]
            next_cursor = str(rows[-1]["seq"])
        return _ok(
            200, {"deliveries": [delivery_view(r) for r in rows], "next_cursor": next_cursor}
        )

    async def delivery(self, principal: auth.Principal, tenant: str, delivery_id: str) -> Answer:
        principal.require(tenant, *WORKER_OR_OPERATOR)
        if not is_uuid(delivery_id):
            raise DeliveryNotFoundError(delivery_id=delivery_id)
        async with self.service._conn() as conn:
            row = await outbox.get_delivery(conn, tenant=tenant, delivery_id=delivery_id)
        if row is None:
            raise DeliveryNotFoundError(delivery_id=delivery_id)
        return _ok(200, delivery_view(row))
