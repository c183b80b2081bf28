"""What every service shares: the roles of queue work, the first checks, and page cursors."""

from __future__ import annotations

import base64
import re
import uuid
from typing import TYPE_CHECKING

import orjson

from queue_server import errors
from queue_server.db import admission_refusals
from queue_server.models import Role, is_uuid
from queue_server.store import tenants
from queue_server.store.types import Conn, Row

if TYPE_CHECKING:
    from queue_server.services.envelope import LeaseEnvelope

WORKER_OR_OPERATOR = (Role.WORKER, Role.OPERATOR)


async def require_tenant(conn: Conn, tenant: str) -> Row:
    """The tenant's row, or 404 `tenant-not-found`."""
    row = await tenants.get_tenant(conn, tenant)
    if row is None:
        raise errors.TenantNotFoundError(tenant=tenant)
    return row


def require_item_id(item_id: str) -> None:
    """Item ids are UUIDs: anything else names no item (404, without a query)."""
    if not is_uuid(item_id):
        raise errors.ItemNotFoundError(item_id=item_id)


def foreign_cursor() -> errors.InvalidRequestError:
    """The refusal of a page cursor this server did not issue (422)."""
    return errors.InvalidRequestError("The cursor is not one this server issued.")


_HEX_PREFIX = re.compile(r"[0-9a-f]{4,31}")


def uuid_range(prefix: str) -> tuple[str, str] | None:
    """The lowest and highest UUID starting with `prefix` (4 to 31 hex digits, dashes
    ignored), or None when it is no such prefix."""
    digits = prefix.lower().replace("-", "")
    if not _HEX_PREFIX.fullmatch(digits):
        return None

    def as_uuid(hex32: str) -> str:
        return str(uuid.UUID(hex32))

    return as_uuid(digits.ljust(32, "0")), as_uuid(digits.ljust(32, "f"))


def encode_cursor(parts: list[str]) -> str:
    """An opaque page cursor made of `parts`."""
    return base64.urlsafe_b64encode(orjson.dumps(parts)).decode().rstrip("=")


def decode_cursor(cursor: str, size: int) -> list[str]:
    """An opaque cursor back into its parts; a cursor we did not make is a 422."""
    try:
        parts = orjson.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, orjson.JSONDecodeError):
        parts = None
    if (
        not isinstance(parts, list)
        or len(parts) != size
        or not all(isinstance(p, str) and "\x00" not in p for p in parts)
    ):
        raise foreign_cursor()
    return parts


async def admission_room(
    conn: Conn, tenant: str, wanted: int, envelope: LeaseEnvelope, verb: str
) -> tuple[list[int], int]:
    """Take room in the tenant's backlog for up to `wanted` items going back into it (a
    replay or a retry: `verb`), as enqueue does: the admission shards of as many as the
    cap still takes, one per item, each locked until the transaction ends, and the cap.
    Leased items count in the backlog, so the room kept for active leases is never handed
    out. No room at all for `wanted` items is 429 backlog-cap-reached."""
    row = await tenants.room(conn, tenant=tenant)
    if row is None:
        raise errors.TenantNotFoundError(tenant=tenant)
    cap = envelope.held_backlog_cap(int(row["backlog_cap"]))
    backlog = int(row["backlog"])
    room = max(0, cap - backlog)
    if room == 0 and wanted > 0:
        raise errors.BacklogCapReachedError(
            f"Backlog {backlog} + {wanted} {verb} would exceed the cap of {cap}.",
            backlog=backlog,
            backlog_cap=cap,
            requested=wanted,
        )
    with admission_refusals(tenant):
        shards = await tenants.take_admission(conn, tenant=tenant, n=min(room, wanted), cap=cap)
    return shards, cap
