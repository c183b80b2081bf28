"""Watchers (webhook subscriptions): register, read, pause/resume, cancel, rotate the secret.

(nothing) --create--> active <--pause/resume--> paused
active | paused --cancel--> cancelled (its pending outbox rows cancelled too)
active | paused --410 Gone from the receiver--> disabled (same)

A pause stops its deliveries' deadline clock: `paused_at` records when, and the
resume moves each pending row's `deadline_from` on by the time spent paused.
"""

from __future__ import annotations

from datetime import timedelta

from queue_server.store.sql import Statements, fetch_all, fetch_one
from queue_server.store.types import Conn, Row

_SQL = Statements(__name__)


_WATCHER_COLUMNS = (
    "tenant_id, watcher_id, url, events, queues, state, disabled_reason, created_at,"
    " updated_at, previous_secret_expires_at"
)


_CREATE_WATCHER = _SQL(
    "create_watcher",
    f"""
INSERT INTO watchers (tenant_id, url, events, queues, state, secret, created_at, updated_at)
VALUES (%(tenant)s, %(url)s, %(events)s, %(queues)s, 'active', %(secret)s,
        statement_timestamp(), statement_timestamp())
RETURNING {_WATCHER_COLUMNS}
""",
)


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
    row = await fetch_one(conn, _CREATE_WATCHER, params)
    assert row is not None
    return row


_GET_WATCHER = _SQL(
    "get_watcher",
    f"""
SELECT {_WATCHER_COLUMNS} FROM watchers
WHERE tenant_id = %(tenant)s AND watcher_id = %(watcher_id)s
""",
)
_GET_WATCHER_FOR_UPDATE = _SQL("get_watcher_for_update", f"{_GET_WATCHER.rstrip()} FOR UPDATE")


async def get_watcher(
    conn: Conn, *, tenant: str, watcher_id: str, lock: bool = False
) -> Row | None:
    sql = _GET_WATCHER_FOR_UPDATE if lock else _GET_WATCHER
    return await fetch_one(conn, sql, {"tenant": tenant, "watcher_id": watcher_id})


_LIST_WATCHERS = _SQL(
    "list_watchers",
    f"""
SELECT {_WATCHER_COLUMNS} FROM watchers WHERE tenant_id = %(tenant)s
ORDER BY created_at, watcher_id
""",
)


async def list_watchers(conn: Conn, *, tenant: str) -> list[Row]:
    return await fetch_all(conn, _LIST_WATCHERS, {"tenant": tenant})


_CHANGE_STATE = _SQL(
    "change_state",
    f"""
WITH before AS (
    SELECT tenant_id, watcher_id, paused_at FROM watchers
    WHERE tenant_id = %(tenant)s AND watcher_id = %(watcher_id)s AND state = ANY(%(source)s)
    FOR UPDATE
), w AS (
    UPDATE watchers w SET state = %(target)s, updated_at = statement_timestamp(),
        -- Pausing a paused watcher keeps the instant its pause began.
        paused_at = CASE WHEN %(target)s = 'paused'
                         THEN coalesce(w.paused_at, statement_timestamp()) END
    FROM before b
    WHERE w.tenant_id = b.tenant_id AND w.watcher_id = b.watcher_id
    RETURNING {", ".join("w." + c.strip() for c in _WATCHER_COLUMNS.split(","))}
), resumed AS (
    -- The pause did not count toward the deadline of the rows that waited through it.
    UPDATE outbox_deliveries o
    SET deadline_from = o.deadline_from + (statement_timestamp() - b.paused_at)
    FROM before b
    WHERE %(target)s = 'active' AND b.paused_at IS NOT NULL
      AND o.tenant_id = b.tenant_id AND o.watcher_id = b.watcher_id AND o.state = 'pending'
)
SELECT * FROM w
""",
)


async def change_state(
    conn: Conn, *, tenant: str, watcher_id: str, source: tuple[str, ...], target: str
) -> Row | None:
    """source -> target (pause: active -> paused; resume: paused -> active, each pending
    row's deadline moved on by the pause)."""
    params = {"tenant": tenant, "watcher_id": watcher_id, "source": list(source), "target": target}
    return await fetch_one(conn, _CHANGE_STATE, params)


_CANCEL = _SQL(
    "cancel_watcher",
    f"""
WITH w AS (
    UPDATE watchers SET state = %(target)s, disabled_reason = %(reason)s, paused_at = NULL,
        updated_at = statement_timestamp()
    WHERE tenant_id = %(tenant)s AND watcher_id = %(watcher_id)s
      AND state IN ('active', 'paused')
    RETURNING {_WATCHER_COLUMNS}
), rows AS (
    UPDATE outbox_deliveries o
    SET state = 'cancelled', claim_token = NULL, claimed_until = NULL,
        next_attempt_at = NULL, updated_at = statement_timestamp()
    FROM w
    WHERE o.tenant_id = w.tenant_id AND o.watcher_id = w.watcher_id AND o.state = 'pending'
      AND o.delivery_id IS DISTINCT FROM %(except_delivery)s::uuid
    RETURNING o.delivery_id
)
SELECT w.*, (SELECT count(*) FROM rows) AS cancelled_deliveries FROM w
""",
)


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
    return await fetch_one(conn, _CANCEL, params)


_ROTATE_SECRET = _SQL(
    "rotate_secret",
    f"""
UPDATE watchers
SET previous_secret = secret, previous_secret_expires_at = statement_timestamp() + %(grace)s,
    secret = %(secret)s, updated_at = statement_timestamp()
WHERE tenant_id = %(tenant)s AND watcher_id = %(watcher_id)s
  AND state IN ('active', 'paused', 'disabled')
RETURNING {_WATCHER_COLUMNS}
""",
)


async def rotate_secret(
    conn: Conn, *, tenant: str, watcher_id: str, secret: str, grace: timedelta
) -> Row | None:
    """A new signing secret; the current one keeps signing for `grace`."""
    params = {"tenant": tenant, "watcher_id": watcher_id, "secret": secret, "grace": grace}
    return await fetch_one(conn, _ROTATE_SECRET, params)
