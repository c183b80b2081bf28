"""SDK for watchers (webhooks) and their deliveries, on a `QueueClient`'s connection."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from queue_server.client.client import QueueClient
from queue_server.client.models import Model

DeliveryState = Literal["pending", "delivered", "dead", "cancelled"]


class DeliveryCounts(Model):
    pending: int = 0
    delivered: int = 0
    dead: int = 0
    cancelled: int = 0


class Watcher(Model):
    watcher_id: str
    tenant: str
    url: str
    events: list[str]
    queues: list[str] | None = None
    state: str
    disabled_reason: str | None = None
    # Past the outbox cap: events from `backlog_from` on wait in the ledger for the backfill.
    backlogged: bool = False
    backlogged_at: datetime | None = None
    backlog_from: datetime | None = None
    previous_secret_expires_at: datetime | None = None
    created_at: datetime
    updated_at: datetime
    deliveries: DeliveryCounts | None = None
    # Only in the answers of create and rotate-secret: the signing secret, shown once.
    secret: str | None = None
    cancelled_deliveries: int | None = None


class Delivery(Model):
    delivery_id: str
    delivery_key: str
    watcher_id: str
    event: str
    item_id: str | None = None
    queue: str | None = None
    state: str
    attempts: int
    next_attempt_at: datetime | None = None
    last_attempt_at: datetime | None = None
    last_outcome: Any = None
    receipts: list[dict[str, Any]] = Field(default_factory=list)
    receipts_omitted: int = 0
    created_at: datetime
    delivered_at: datetime | None = None


class DeliveryPage(Model):
    deliveries: list[Delivery]
    next_cursor: str | None = None


class _Watchers(Model):
    watchers: list[Watcher]


class WatcherClient:
    """Watcher routes of one queue server, through an existing `QueueClient`.

    Example::

        with QueueClient(url, key, tenant="acme") as qs:
            hooks = WatcherClient(qs)
            created = hooks.create("https://example.com/hook", ["item.completed"])
            print(created.secret)  # shown once
    """

    def __init__(self, client: QueueClient) -> None:
        self.client = client

    def _path(self, tenant: str | None, suffix: str = "") -> str:
        return f"/v1/tenants/{self.client._tenant(tenant)}/watchers{suffix}"

    def create(
        self,
        url: str,
        events: list[str],
        *,
        queues: list[str] | None = None,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Watcher:
        body: dict[str, Any] = {"url": url, "events": events}
        if queues:
            body["queues"] = queues
        return self.client._effect(Watcher, "POST", self._path(tenant), body, idempotency_key)

    def list_watchers(self, tenant: str | None = None) -> list[Watcher]:
        return self.client._get(_Watchers, self._path(tenant)).watchers

    def get(self, watcher_id: str, tenant: str | None = None) -> Watcher:
        return self.client._get(Watcher, self._path(tenant, f"/{watcher_id}"))

    def _action(
        self, watcher_id: str, action: str, idempotency_key: str | None, tenant: str | None
    ) -> Watcher:
        path = self._path(tenant, f"/{watcher_id}/{action}")
        return self.client._effect(Watcher, "POST", path, {}, idempotency_key)

    def pause(
        self, watcher_id: str, *, idempotency_key: str | None = None, tenant: str | None = None
    ) -> Watcher:
        return self._action(watcher_id, "pause", idempotency_key, tenant)

    def resume(
        self, watcher_id: str, *, idempotency_key: str | None = None, tenant: str | None = None
    ) -> Watcher:
        return self._action(watcher_id, "resume", idempotency_key, tenant)

    def cancel(
        self, watcher_id: str, *, idempotency_key: str | None = None, tenant: str | None = None
    ) -> Watcher:
        return self._action(watcher_id, "cancel", idempotency_key, tenant)

    def rotate_secret(
        self, watcher_id: str, *, idempotency_key: str | None = None, tenant: str | None = None
    ) -> Watcher:
        return self._action(watcher_id, "rotate-secret", idempotency_key, tenant)

    def deliveries(
        self,
        watcher_id: str,
        *,
        state: DeliveryState | None = None,
        limit: int = 50,
        cursor: str | None = None,
        tenant: str | None = None,
    ) -> DeliveryPage:
        path = self._path(tenant, f"/{watcher_id}/deliveries")
        return self.client._get(DeliveryPage, path, state=state, limit=limit, cursor=cursor)

    def delivery(self, delivery_id: str, tenant: str | None = None) -> Delivery:
        path = f"/v1/tenants/{self.client._tenant(tenant)}/deliveries/{delivery_id}"
        return self.client._get(Delivery, path)

    def replay(
        self,
        dead_letter_id: str,
        *,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Delivery:
        """Replay a dead delivery: pending again, fresh budget, same delivery key."""
        path = f"/v1/tenants/{self.client._tenant(tenant)}/dead-letters/{dead_letter_id}/replay"
        return self.client._effect(Delivery, "POST", path, {}, idempotency_key)
