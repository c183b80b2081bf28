"""The notification channels statements notify on, and the LISTEN statements of the notifier."""

from __future__ import annotations

import hashlib
from typing import Any

from psycopg import AsyncConnection

from queue_server.store.sql import load

_SQL = load("channels")

# PostgreSQL has no LISTEN privilege: any role of the database (an application's enqueue
# role too) may listen on any channel, and NOTIFY on it. So a payload names no tenant, and
# a notification is only ever a hint that makes the server look again.
#
# Payload `ready_tag(secret, tenant, queue)`: the queue may have work due (requeue, replay,
# release; an enqueue sends none, its waiters are woken by `placed_since`). Without the installation's secret it cannot be computed, so a
# listener learns no queue name and a forged wake reaches no chosen queue; a tag seen and
# sent again only makes that queue's waiting acquires look once more.
READY_CHANNEL = "queue_server_ready"
# Payload empty: a key was revoked; every API process drops its cache of keys.
KEYS_CHANNEL = "queue_server_keys"
# Payload empty: an admin published a policy version; every API process reads the version
# activated last at once (and every `policy_poll_interval` in any case).
POLICY_CHANNEL = "queue_server_policy"

LISTEN_READY = _SQL["listen_ready"]
LISTEN_KEYS = _SQL["listen_keys"]
LISTEN_POLICY = _SQL["listen_policy"]

LISTENER_PROBE = _SQL["listener_probe"]
INSTALLATION_SECRET = _SQL["installation_secret"]
PLACED_SINCE = _SQL["placed_since"]


async def placed_since(
    conn: AsyncConnection[Any], since: str | None
) -> tuple[str, list[tuple[str, str]] | None]:
    """The queues (tenant, queue) with rows made ready by the transactions that ended since
    the snapshot `since` (none without one; None: too many rows to tell, every queue), and
    the snapshot to look from next time."""
    row = await (await conn.execute(PLACED_SINCE, {"since": since})).fetchone()
    assert row is not None  # an aggregate: always one row
    if row["more"]:
        return str(row["snapshot"]), None
    return str(row["snapshot"]), list(zip(row["tenants"], row["queues"], strict=True))


def ready_tag(secret: str, tenant: str, queue: str) -> str:
    """The ready channel's payload for a queue: queue_server.ready_tag's (migration 0022)."""
    return hashlib.sha256(f"{secret}/{tenant}/{queue}".encode()).hexdigest()


async def installation_secret(conn: AsyncConnection[Any]) -> str:
    """The installation's secret (migration 0022), which only the tables' owner reads."""
    row = await (await conn.execute(INSTALLATION_SECRET)).fetchone()
    if row is None:
        raise LookupError("the installation's secret is missing (migration 0022)")
    # A pooled connection's rows are dicts, the listener's tuples.
    return str(row["secret"] if isinstance(row, dict) else row[0])
