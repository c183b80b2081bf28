"""Watchers (webhook subscriptions) and their outbox: registration, state changes, secret
rotation, delivery listings, and the resolution of dead deliveries. The SQL is in
`store/watchers.py` and `store/outbox.py`; sending is `queue_server.background.deliverer`.

Watchers are configuration, like every other: an operator's (or admin's) business; a
worker key gets 403."""

from __future__ import annotations

from typing import Any

from queue_server import auth, errors, views
from queue_server.db import Database
from queue_server.idempotency import Answer, Effects, Idempotency
from queue_server.models import Role, is_uuid
from queue_server.services.common import foreign_cursor, require_tenant
from queue_server.settings import Settings
from queue_server.store import outbox, watchers
from queue_server.store.outbox import EVENTS
from queue_server.store.types import Conn, Row
from queue_server.transport import AllowList, PolicyRefusedError, check_target_async
from queue_server.transport.signing import generate_secret

MAX_DELIVERY_PAGE = 500


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
    return Answer.of(200, views.delivery(row))


class Watchers:
    """Register, list, change and rotate watchers; list and show their deliveries."""

    def __init__(self, db: Database, effects: Effects, settings: Settings) -> None:
        self.db = db
        self.effects = effects
        self.secret_grace = settings.watcher_secret_grace
        self.allow = AllowList.parse(settings.transport_allow, settings.own_ports())

    async def _check_url(self, url: str) -> None:
        """The SSRF policy at registration; the broker checks again at every dispatch."""
        try:
            await check_target_async(url, self.allow)
        except PolicyRefusedError as exc:
            raise errors.TargetRefusedError(f"The watcher URL is refused: {exc.detail}.") from None

    async def _watcher(self, conn: Conn, tenant: str, watcher_id: str, lock: bool = False) -> Row:
        if not is_uuid(watcher_id):
            raise errors.WatcherNotFoundError(watcher_id=watcher_id)
        row = await watchers.get_watcher(conn, tenant=tenant, watcher_id=watcher_id, lock=lock)
        if row is None:
            raise errors.WatcherNotFoundError(watcher_id=watcher_id)
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
        principal.require(tenant, Role.OPERATOR)
        unknown = sorted(set(events) - set(EVENTS))
        if unknown:
            raise errors.InvalidRequestError(f"Unknown events: {', '.join(unknown)}.")
        await self._check_url(url)

        async def operation(conn: Conn) -> Answer:
            await require_tenant(conn, tenant)
            secret = generate_secret()
            row = await watchers.create_watcher(
                conn,
                tenant=tenant,
                url=url,
                events=sorted(set(events), key=events.index),
                queues=queues,
                secret=secret,
            )
            return _shown_once(201, views.watcher(row), secret)

        return await self.effects.run(tenant, idem, instance, operation)

    async def list(self, principal: auth.Principal, tenant: str) -> Answer:
        principal.require(tenant, Role.OPERATOR)
        async with self.db.conn() as conn:
            await require_tenant(conn, tenant)
            rows = await watchers.list_watchers(conn, tenant=tenant)
            counts = await outbox.delivery_counts(conn, tenant=tenant)
        return Answer.of(
            200,
            {"watchers": [views.watcher(r, counts.get(str(r["watcher_id"]), {})) for r in rows]},
        )

    async def get(self, principal: auth.Principal, tenant: str, watcher_id: str) -> Answer:
        principal.require(tenant, Role.OPERATOR)
        async with self.db.conn() as conn:
            row = await self._watcher(conn, tenant, watcher_id)
            counts = await outbox.delivery_counts(conn, tenant=tenant)
        return Answer.of(200, views.watcher(row, counts.get(watcher_id, {})))

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
        principal.require(tenant, Role.OPERATOR)

        async def operation(conn: Conn) -> Answer:
            current = await self._watcher(conn, tenant, watcher_id, lock=True)
            if action == "cancel":
                row = await watchers.cancel_watcher(conn, tenant=tenant, watcher_id=watcher_id)
            else:
                target = "paused" if action == "pause" else "active"
                row = await watchers.change_state(
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
            body = views.watcher(row)
            if action == "cancel":
                body["cancelled_deliveries"] = int(row["cancelled_deliveries"])
            return Answer.of(200, body)

        return await self.effects.run(tenant, idem, instance, operation)

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
        principal.require(tenant, Role.OPERATOR)

        async def operation(conn: Conn) -> Answer:
            current = await self._watcher(conn, tenant, watcher_id, lock=True)
            secret = generate_secret()
            row = await watchers.rotate_secret(
                conn,
                tenant=tenant,
                watcher_id=watcher_id,
                secret=secret,
                grace=self.secret_grace,
            )
            if row is None:
                raise errors.InvalidStateError(
                    f"The watcher is {current['state']}; its secret cannot be rotated.",
                    watcher_id=watcher_id,
                    state=current["state"],
                )
            return _shown_once(200, views.watcher(row), secret)

        return await self.effects.run(tenant, idem, instance, operation)

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
        principal.require(tenant, Role.OPERATOR)
        after: int | None = None
        if cursor:
            # ASCII digits only: "²".isdigit() is true, and int("²") raises.
            if not (cursor.isascii() and cursor.isdigit() and len(cursor) <= 18):
                raise foreign_cursor()
            after = int(cursor)
        async with self.db.conn() as conn:
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
        return Answer.of(
            200, {"deliveries": [views.delivery(r) for r in rows], "next_cursor": next_cursor}
        )

    async def delivery(self, principal: auth.Principal, tenant: str, delivery_id: str) -> Answer:
        principal.require(tenant, Role.OPERATOR)
        if not is_uuid(delivery_id):
            raise errors.DeliveryNotFoundError(delivery_id=delivery_id)
        async with self.db.conn() as conn:
            row = await outbox.get_delivery(conn, tenant=tenant, delivery_id=delivery_id)
        if row is None:
            raise errors.DeliveryNotFoundError(delivery_id=delivery_id)
        return Answer.of(200, views.delivery(row))


def _shown_once(status: int, watcher: dict[str, Any], secret: str) -> Answer:
    """The watcher with its new signing secret; a replay of the request's key answers the
    same without it (`secret` null): the receipt never keeps a second copy of the secret."""
    return Answer.of(status, {**watcher, "secret": secret}, retained={**watcher, "secret": None})
