"""SQL of confirmed-mutation receipts: a one-shot claim (-> pending) and one settlement.

    (none) --claim--> pending --settle--> succeeded | failed

The claim is the mutation's exclusive grant (policy ADR Decision 5): a second
claim of the same (idempotency key, outcome reference) finds the first receipt.
Each function takes the caller's connection and never commits.
"""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from queue_server.store.sql import Statements
from queue_server.store.types import Conn, Row

_SQL = Statements(__name__)

_COLUMNS = (
    "tenant_id, outcome_ref, idempotency_key, claim_token, status, outcome, created_at, settled_at"
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
