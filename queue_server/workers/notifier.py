"""Wakes long-polling acquires and drops revoked keys: one LISTEN connection per process.

Notifications on the ready channel (`tenant/queue`) wake the acquires waiting on that
queue; a notification on the keys channel, and every (dis)connection of the
listener, tells `on_keys_changed` whether the listener is connected.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable

import psycopg

from queue_server.store.channels import KEYS_CHANNEL, LISTEN_KEYS, LISTEN_READY

log = logging.getLogger(__name__)


class Notifier:
    """Maps `tenant/queue` notifications from PostgreSQL to asyncio events."""

    def __init__(
        self,
        conninfo: str,
        *,
        retry_delay: float = 1.0,
        on_keys_changed: Callable[[bool], None] | None = None,
    ) -> None:
        self._conninfo = conninfo
        self._on_keys_changed = on_keys_changed or (lambda listening: None)
        self._retry_delay = retry_delay
        self._waiters: defaultdict[str, set[asyncio.Event]] = defaultdict(set)
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="queue-server-notifier")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def subscribe(self, tenant: str, queue: str) -> asyncio.Event:
        event = asyncio.Event()
        self._waiters[f"{tenant}/{queue}"].add(event)
        return event

    def unsubscribe(self, tenant: str, queue: str, event: asyncio.Event) -> None:
        key = f"{tenant}/{queue}"
        waiters = self._waiters.get(key)
        if waiters is not None:
            waiters.discard(event)
            if not waiters:
                del self._waiters[key]

    def _wake(self, key: str) -> None:
        for event in self._waiters.get(key, ()):
            event.set()

    def _wake_all(self) -> None:
        for waiters in self._waiters.values():
            for event in waiters:
                event.set()

    async def _run(self) -> None:
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True)
                async with conn:
                    await conn.execute(LISTEN_READY)
                    await conn.execute(LISTEN_KEYS)
                    self.connected.set()
                    self._on_keys_changed(self.connected.is_set())
                    # Anything notified while we were not listening: let every waiter re-check.
                    self._wake_all()
                    async for notification in conn.notifies():
                        if notification.channel == KEYS_CHANNEL:
                            self._on_keys_changed(self.connected.is_set())
                        else:
                            self._wake(notification.payload)
            except psycopg.Error as exc:
                log.warning("notification listener lost its connection: %s", exc)
            self.connected.clear()
            self._on_keys_changed(self.connected.is_set())
            await asyncio.sleep(self._retry_delay)
