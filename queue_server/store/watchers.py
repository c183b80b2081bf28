"""Watchers (webhook subscriptions): register, read, pause/resume, cancel, rotate the secret.

(nothing) --create--> active <--pause/resume--> paused
active | paused --cancel--> cancelled (its pending outbox rows cancelled too)
active | paused --410 Gone from the receiver--> disabled (same)

A pause stops its deliveries' deadline clock: `paused_at` records when, and the
resume moves each pending row's `deadline_from` on by the time spent paused.
"""

from __future__ import annotations

from datetime import timedelta

from queue_server.store.sql import fetch_all, fetch_one, load
from queue_server.store.types import Conn, Row

_SQL = load("watchers")


async def create_watcher(
    conn: Conn,
    *,
    tenant: str,
    url: str,
    events: list[str],
    queues: list[str] | None,
    secret: str,
) -> Row:
    """(nothing) -> active."""
    params = {"tenant": tenant, "url": url, "events": events, "queues": queues, "secret": secret}
    row = await fetch_one(conn, _SQL["create_watcher"], params)
    assert row is not None
    return row


async def get_watcher(
    conn: Conn, *, tenant: str, watcher_id: str, lock: bool = False
) -> Row | None:
    sql = _SQL["get_watcher_for_update"] if lock else _SQL["get_watcher"]
    return await fetch_one(conn, sql, {"tenant": tenant, "watcher_id": watcher_id})


async def list_watchers(conn: Conn, *, tenant: str) -> list[Row]:
    return await fetch_all(conn, _SQL["list_watchers"], {"tenant": tenant})


async def change_state(
    conn: Conn, *, tenant: str, watcher_id: str, source: tuple[str, ...], target: str
) -> Row | None:
    """source -> target (pause: active -> paused; resume: paused -> active, each pending
    row's deadline moved on by the pause)."""
    params = {"tenant": tenant, "watcher_id": watcher_id, "source": list(source), "target": target}
    return await fetch_one(conn, _SQL["change_state"], params)


async def cancel_watcher(
    conn: Conn,
    *,
    tenant: str,
    watcher_id: str,
    disabled_reason: str | None = None,
    except_delivery: str | None = None,
) -> Row | None:
    """active or paused -> cancelled (or disabled, with a reason); pending rows cancelled."""
    params = {
        "tenant": tenant,
        "watcher_id": watcher_id,
        "target": "cancelled" if disabled_reason is None else "disabled",
        "reason": disabled_reason,
        "except_delivery": except_delivery,
    }
    return await fetch_one(conn, _SQL["cancel_watcher"], params)


async def rotate_secret(
    conn: Conn, *, tenant: str, watcher_id: str, secret: str, grace: timedelta
) -> Row | None:
    """A new signing secret; the current one keeps signing for `grace`."""
    params = {"tenant": tenant, "watcher_id": watcher_id, "secret": secret, "grace": grace}
    return await fetch_one(conn, _SQL["rotate_secret"], params)
