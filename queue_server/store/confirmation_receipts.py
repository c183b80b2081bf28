"""SQL of confirmed-mutation receipts: a one-shot claim (-> pending) and one settlement.

    (none) --claim--> pending --settle--> succeeded | failed
                         '--(past the class deadline) an operator settles, with a reason-->

The claim is the mutation's exclusive grant (docs/decisions/operation-class-policy.md,
Decision 5): a second claim of the same (idempotency key, outcome reference) finds the first
receipt. Each function takes the caller's connection and never commits.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from psycopg.types.json import Jsonb

from queue_server.store.sql import Statements
from queue_server.store.types import Conn, Row

_SQL = Statements(__name__)

_COLUMNS = (
    "tenant_id, outcome_ref, idempotency_key, claim_token, status, outcome, created_at, settled_at,"
    " settled_by, settle_reason"
)

# ON CONFLICT covers both identities: the outcome reference (primary key) and the
# idempotency key (unique per tenant). A concurrent claim of the same pair waits
# for the first one to commit, then inserts nothing and reads the existing row.
_CLAIM = _SQL(
    "claim",
    f"""
INSERT INTO confirmation_receipts (tenant_id, outcome_ref, idempotency_key, claim_token)
VALUES (%(tenant)s, %(ref)s, %(key)s, %(token)s)
ON CONFLICT DO NOTHING
RETURNING {_COLUMNS}
""",
)

_SETTLE = _SQL(
    "settle",
    f"""
UPDATE confirmation_receipts
SET status = %(status)s, outcome = %(outcome)s, settled_at = statement_timestamp()
WHERE tenant_id = %(tenant)s AND outcome_ref = %(ref)s AND status = 'pending'
RETURNING {_COLUMNS}
""",
)


async def claim(conn: Conn, *, tenant: str, key: str, ref: str, token: str | None) -> Row | None:
    """(none) -> pending; None when the reference or the key is already claimed."""
    cur = await conn.execute(_CLAIM, {"tenant": tenant, "ref": ref, "key": key, "token": token})
    return await cur.fetchone()


_GET = _SQL(
    "get",
    f"SELECT {_COLUMNS} FROM confirmation_receipts WHERE tenant_id = %s AND outcome_ref = %s",
)


async def get(conn: Conn, *, tenant: str, ref: str) -> Row | None:
    cur = await conn.execute(_GET, (tenant, ref))
    return await cur.fetchone()


_GET_BY_KEY = _SQL(
    "get_by_key",
    f"SELECT {_COLUMNS} FROM confirmation_receipts WHERE tenant_id = %s AND idempotency_key = %s",
)


async def get_by_key(conn: Conn, *, tenant: str, key: str) -> Row | None:
    cur = await conn.execute(_GET_BY_KEY, (tenant, key))
    return await cur.fetchone()


async def settle(conn: Conn, *, tenant: str, ref: str, status: str, outcome: Any) -> Row | None:
    """pending -> succeeded | failed; None when the receipt is missing or already settled."""
    cur = await conn.execute(
        _SETTLE, {"tenant": tenant, "ref": ref, "status": status, "outcome": Jsonb(outcome)}
    )
    return await cur.fetchone()


# Stale: still pending `older_than` after its claim. Oldest first (the partial index).
_LIST_PENDING = _SQL(
    "list_pending",
    f"""
SELECT {_COLUMNS}, created_at <= statement_timestamp() - %(stale_after)s AS stale
FROM confirmation_receipts
WHERE tenant_id = %(tenant)s AND status = 'pending'
  AND created_at <= statement_timestamp() - %(older_than)s
  AND (%(after_at)s::timestamptz IS NULL
       OR (created_at, outcome_ref) > (%(after_at)s::timestamptz, %(after_ref)s::text))
ORDER BY created_at, outcome_ref
LIMIT %(limit)s
""",
)


async def list_pending(
    conn: Conn,
    *,
    tenant: str,
    older_than: timedelta,
    stale_after: timedelta,
    after: tuple[datetime, str] | None,
    limit: int,
) -> list[Row]:
    """Pending receipts claimed at least `older_than` ago, oldest first, after the cursor;
    `stale` says whether each is past `stale_after`."""
    params = {
        "tenant": tenant,
        "older_than": older_than,
        "stale_after": stale_after,
        "after_at": after[0] if after else None,
        "after_ref": after[1] if after else None,
        "limit": limit,
    }
    cur = await conn.execute(_LIST_PENDING, params)
    return await cur.fetchall()


# An operator's settlement, only of a receipt pending past `stale_after`: a dispatched
# mutation settles as what happened (succeeded or failed), never as cancelled.
_RESOLVE = _SQL(
    "resolve",
    f"""
UPDATE confirmation_receipts
SET status = %(status)s, outcome = %(outcome)s, settled_at = statement_timestamp(),
    settled_by = %(actor)s, settle_reason = %(reason)s
WHERE tenant_id = %(tenant)s AND outcome_ref = %(ref)s AND status = 'pending'
  AND created_at <= statement_timestamp() - %(stale_after)s
RETURNING {_COLUMNS}
""",
)


async def resolve(
    conn: Conn,
    *,
    tenant: str,
    ref: str,
    status: str,
    outcome: Any,
    actor: str,
    reason: str,
    stale_after: timedelta,
) -> Row | None:
    """pending (stale) -> succeeded | failed by an operator; None when not pending or not stale."""
    params = {
        "tenant": tenant,
        "ref": ref,
        "status": status,
        "outcome": Jsonb(outcome),
        "actor": actor,
        "reason": reason,
        "stale_after": stale_after,
    }
    cur = await conn.execute(_RESOLVE, params)
    return await cur.fetchone()
