"""SDK for schedules (periodic enqueues), on a `QueueClient`'s connection."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from queue_server.client.client import QueueClient, new_idempotency_key
from queue_server.client.models import Item, Model

CatchUp = Literal["skip", "latest", "all-bounded"]


class Fire(Model):
    tick_at: datetime
    kind: str
    outcome: str
    item_id: str | None = None
    attempts: int
    at: datetime
    detail: dict[str, Any] | None = None


class Schedule(Model):
    schedule: str
    tenant: str
    schedule_id: str
    queue: str
    payload: Any = None
    priority: int = 0
    max_acquisitions: int | None = None
    cron: str | None = None
    every: int | None = None
    timezone: str
    catch_up: str
    catch_up_limit: int
    paused: bool
    next_fires: list[datetime] = Field(default_factory=list)
    fires: int = 0
    refusals: int = 0
    skipped: int = 0
    created_at: datetime
    updated_at: datetime
    # Only in the answer of `get`: the newest fires, newest first.
    recent_fires: list[Fire] | None = None


class SchedulePage(Model):
    schedules: list[Schedule]
    next_cursor: str | None = None


class Triggered(Model):
    schedule: str
    tick_at: datetime
    item: Item


class ScheduleClient:
    """Schedule routes of one queue server, through an existing `QueueClient`.

    Example::

        with QueueClient(url, key, tenant="acme") as qs:
            ScheduleClient(qs).put("nightly", queue="reports", cron="30 2 * * *",
                                   timezone="Europe/Berlin")
    """

    def __init__(self, client: QueueClient) -> None:
        self.client = client

    def _path(self, tenant: str | None, suffix: str = "") -> str:
        return f"/v1/tenants/{self.client._tenant(tenant)}/schedules{suffix}"

    def put(
        self,
        name: str,
        *,
        queue: str,
        cron: str | None = None,
        every: int | None = None,
        timezone: str = "UTC",
        payload: Any = None,
        priority: int = 0,
        max_acquisitions: int | None = None,
        catch_up: CatchUp = "skip",
        catch_up_limit: int = 100,
        paused: bool = False,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Schedule:
        """Create or replace the schedule `name`."""
        body: dict[str, Any] = {
            "queue": queue,
            "payload": payload,
            "priority": priority,
            "timezone": timezone,
            "catch_up": catch_up,
            "catch_up_limit": catch_up_limit,
            "paused": paused,
        }
        if cron is not None:
            body["cron"] = cron
        if every is not None:
            body["every"] = every
        if max_acquisitions is not None:
            body["max_acquisitions"] = max_acquisitions
        path = self._path(tenant, f"/{name}")
        return self.client._effect(Schedule, "PUT", path, body, idempotency_key)

    def list_schedules(
        self, *, limit: int = 100, cursor: str | None = None, tenant: str | None = None
    ) -> SchedulePage:
        return self.client._get(SchedulePage, self._path(tenant), limit=limit, cursor=cursor)

    def get(self, name: str, tenant: str | None = None) -> Schedule:
        return self.client._get(Schedule, self._path(tenant, f"/{name}"))

    def _action(
        self, name: str, action: str, idempotency_key: str | None, tenant: str | None
    ) -> Schedule:
        path = self._path(tenant, f"/{name}/{action}")
        return self.client._effect(Schedule, "POST", path, {}, idempotency_key)

    def pause(
        self, name: str, *, idempotency_key: str | None = None, tenant: str | None = None
    ) -> Schedule:
        return self._action(name, "pause", idempotency_key, tenant)

    def resume(
        self, name: str, *, idempotency_key: str | None = None, tenant: str | None = None
    ) -> Schedule:
        return self._action(name, "resume", idempotency_key, tenant)

    def trigger(
        self, name: str, *, idempotency_key: str | None = None, tenant: str | None = None
    ) -> Triggered:
        """One run now: the item it enqueued."""
        path = self._path(tenant, f"/{name}/trigger")
        return self.client._effect(Triggered, "POST", path, {}, idempotency_key)

    def delete(
        self, name: str, *, idempotency_key: str | None = None, tenant: str | None = None
    ) -> None:
        self.client.request(
            "DELETE",
            self._path(tenant, f"/{name}"),
            idempotency_key=idempotency_key or new_idempotency_key(),
        )
