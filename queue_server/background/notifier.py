"""Wakes long-polling acquires and drops revoked keys: one LISTEN session per process.

Notifications on the ready channel (a queue's tag, made with the installation's secret:
see `store/channels.py`) wake the acquires waiting on that queue, which look again; a notification on the keys channel, and every (dis)connection of the
listener, tells `on_keys_changed` whether the listener is connected.

The session is direct (a transaction pooler would deliver nothing) and follows the
primary: when it breaks (a failover, a restart, a cut by HAProxy) it reconnects with
capped exponential backoff and jitter, LISTENs again, and wakes every waiter so each
re-reads its queue (notifications sent while nobody listened are lost). While it is
down, waiters poll instead and the key cache is off, so a revocation still takes
effect at once. A session gone silent (a host lost without a FIN) is found by a probe
every `probe_interval`, and by TCP keepalives; each notification and each answered
probe is reported to `on_alive`, which is what the key cache's trust rests on (see
`infra/keycache.py`): a half-open session stops vouching for it within its trust window.

An enqueue sends no notification (PostgreSQL makes every transaction that notifies commit
one at a time, and an application's own transactions enqueue). While acquires wait in this
process, the watch looks every `watch_interval` for rows made ready since its last look
(`placed_since`: by the ended transactions, from the last look's snapshot) and wakes the
waiters of their queues. Its first look after a pause only takes its place, and wakes
every waiter once: a row made ready before that place was looked at by then.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence

import psycopg

from queue_server import errors
from queue_server.infra.tasks import stop_tasks
from queue_server.store.channels import (
    KEYS_CHANNEL,
    LISTEN_KEYS,
    LISTEN_POLICY,
    LISTEN_READY,
    LISTENER_PROBE,
    POLICY_CHANNEL,
    installation_secret,
    ready_tag,
)

log = logging.getLogger(__name__)

# The watch looks on this long after the last waiter left (an acquire waits again soon
# after its answer), and after a failed look waits this long before the next.
WATCH_LINGER = 2.0
WATCH_RETRY = 0.5

# A look: the snapshot given (None: from now) -> this look's snapshot, the queues placed
# (None: too many rows to tell, every queue).
PlacedSince = Callable[[str | None], Awaitable[tuple[str, Sequence[tuple[str, str]] | None]]]


class Notifier:
    """Maps the ready channel's tags from PostgreSQL to the asyncio events of `tenant/queue`."""

    def __init__(
        self,
        conninfo: str,
        *,
        min_backoff: float = 0.1,
        max_backoff: float = 5.0,
        probe_interval: float = 10.0,
        on_keys_changed: Callable[[bool], None] | None = None,
        on_disconnect: Callable[[], None] | None = None,
        on_alive: Callable[[], None] | None = None,
        on_policy: Callable[[], None] | None = None,
        read_secret: Callable[[], Awaitable[str]] | None = None,
        placed_since: PlacedSince | None = None,
        watch_interval: float = 0.01,
    ) -> None:
        """`placed_since` (None, or a `watch_interval` of 0: no watch) is the watch's look."""
        self._conninfo = conninfo
        self._placed_since = placed_since if watch_interval > 0 else None
        self._watch_interval = watch_interval
        self._watch_task: asyncio.Task[None] | None = None
        self._someone_waits = asyncio.Event()
        # Read by the server's own role (the listener's may be another: LISTEN_DATABASE_URL);
        # without it, on the listener's session.
        self._read_secret = read_secret
        self._on_keys_changed = on_keys_changed or (lambda listening: None)
        self._on_alive = on_alive or (lambda: None)
        self._on_policy = on_policy or (lambda: None)
        self._on_disconnect = on_disconnect or (lambda: None)
        self._min_backoff = min_backoff
        self._max_backoff = max_backoff
        self._probe_interval = probe_interval
        self._waiters: defaultdict[str, set[asyncio.Event]] = defaultdict(set)
        # The installation's secret (read at each connection) and the tag of each
        # `tenant/queue` waited on, made with it.
        self._secret: str | None = None
        self._tags: dict[str, str] = {}
        self._task: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()
        #: The backend pid of the current session (0 while disconnected).
        self.backend_pid = 0

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="queue-server-notifier")
        if self._placed_since is not None:
            self._watch_task = asyncio.create_task(self._watch(), name="queue-server-watch")

    async def stop(self) -> None:
        await stop_tasks([self._task, self._watch_task])

    def subscribe(self, tenant: str, queue: str) -> asyncio.Event:
        event = asyncio.Event()
        self._waiters[f"{tenant}/{queue}"].add(event)
        self._someone_waits.set()
        return event

    def unsubscribe(self, tenant: str, queue: str, event: asyncio.Event) -> None:
        key = f"{tenant}/{queue}"
        waiters = self._waiters.get(key)
        if waiters is not None:
            waiters.discard(event)
            if not waiters:
                del self._waiters[key]
                self._tags.pop(key, None)

    def wake(self, tenant: str, queue: str) -> None:
        """Wake the acquires waiting here on `tenant/queue`: this process committed items
        there, and they need not wait for the watch's next look."""
        for event in self._waiters.get(f"{tenant}/{queue}", ()):
            event.set()

    def _tag(self, key: str) -> str | None:
        if self._secret is None:
            return None
        tag = self._tags.get(key)
        if tag is None:
            tenant, _, queue = key.partition("/")
            tag = self._tags[key] = ready_tag(self._secret, tenant, queue)
        return tag

    def _wake(self, tag: str) -> None:
        """Wake the waiters of the queue whose tag this is (none, for a tag of no queue
        waited on here: another tenant's, or a forged one)."""
        for key, waiters in list(self._waiters.items()):
            if self._tag(key) == tag:
                for event in waiters:
                    event.set()

    def _wake_all(self) -> None:
        for waiters in self._waiters.values():
            for event in waiters:
                event.set()

    async def _watch(self) -> None:
        """While acquires wait here (and WATCH_LINGER after), wake those of each queue with
        rows made ready since the last look."""
        assert self._placed_since is not None
        loop = asyncio.get_running_loop()
        since: str | None = None
        last_waiting = -math.inf  # at rest from the start, until an acquire waits
        while True:
            if self._waiters:
                last_waiting = loop.time()
            elif loop.time() - last_waiting > WATCH_LINGER:
                since = None
                self._someone_waits.clear()
                await self._someone_waits.wait()
                last_waiting = loop.time()
            try:
                now, placed = await self._placed_since(since)
            except Exception as exc:  # the database away: the waiters poll meanwhile
                log.warning("wake-up watch: %s", exc)
                since = None
                await asyncio.sleep(WATCH_RETRY)
                continue
            if since is None or placed is None:
                self._wake_all()
            for tenant, queue in placed or ():
                self.wake(tenant, queue)
            since = now
            await asyncio.sleep(self._watch_interval)

    @property
    def listening(self) -> bool:
        return self.connected.is_set()

    async def _run(self) -> None:
        backoff = self._min_backoff
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    self._conninfo,
                    autocommit=True,
                    application_name="queue-server-listener",
                    # TCP keepalives: a dead peer is noticed by the kernel too.
                    keepalives=1,
                    keepalives_idle=10,
                    keepalives_interval=3,
                    keepalives_count=3,
                    connect_timeout=5,
                )
                async with conn:
                    if self._read_secret is not None:
                        secret = await self._read_secret()
                    else:
                        secret = await installation_secret(conn)
                    if secret != self._secret:
                        self._secret, self._tags = secret, {}
                    await conn.execute(LISTEN_READY)
                    await conn.execute(LISTEN_KEYS)
                    await conn.execute(LISTEN_POLICY)
                    self.backend_pid = conn.info.backend_pid
                    self.connected.set()
                    backoff = self._min_backoff
                    log.info("notification listener connected (backend %s)", self.backend_pid)
                    # Anything notified while we were not listening: every waiter re-reads,
                    # and keys are looked up afresh.
                    self._on_keys_changed(True)
                    self._on_policy()
                    self._wake_all()
                    await self._listen(conn)
            except (psycopg.Error, OSError, TimeoutError, errors.QueueServerError) as exc:
                log.warning("notification listener: %s", exc)
            if self.connected.is_set():
                # The session was lost: the key cache turns itself off, and every waiter
                # goes back to sleep for the polling interval instead of a notification.
                self.backend_pid = 0
                self.connected.clear()
                self._on_disconnect()
                self._on_keys_changed(False)
                self._wake_all()
            await asyncio.sleep(backoff * random.uniform(0.5, 1.5))
            backoff = min(backoff * 2, self._max_backoff)

    async def _listen(self, conn: psycopg.AsyncConnection[object]) -> None:
        """Dispatch notifications; every `probe_interval`, check the session answers."""
        while True:
            async for notification in conn.notifies(timeout=self._probe_interval):
                if notification.channel == KEYS_CHANNEL:
                    self._on_keys_changed(True)
                elif notification.channel == POLICY_CHANNEL:
                    self._on_policy()
                else:
                    self._wake(notification.payload)
                self._on_alive()
            # A session whose server vanished would stay quiet forever: it must answer.
            await self._probe(conn)
            self._on_alive()

    async def _probe(self, conn: psycopg.AsyncConnection[object]) -> None:
        """The session answers a probe within `probe_interval`, or is closed (TimeoutError).

        Not `wait_for(execute)`: cancelling a query makes psycopg cancel it on the server
        too, over a new connection to the same unreachable place, for up to 10 s more.
        """
        probe = asyncio.ensure_future(conn.execute(LISTENER_PROBE))
        done, _ = await asyncio.wait({probe}, timeout=self._probe_interval)
        if probe in done:
            probe.result()
            return
        await conn.close()  # the socket first: the pending probe then has nothing to cancel
        probe.cancel()
        # Its end, whatever it is (cancelled, or failed on the closed socket); a
        # cancellation of this task meanwhile is raised, not taken for the probe's.
        await asyncio.wait({probe})
        if not probe.cancelled():
            probe.exception()
        raise TimeoutError(f"the listener's probe got no answer in {self._probe_interval:.1f}s")
