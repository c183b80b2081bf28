"""Ledger verification: folding an item's events must reproduce the item's row.

Every transition appends its ledger event in the statement that changes the row
(`store.transitions`); `verify` folds pages of items and names every disagreement.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from queue_server import auth
from queue_server.db import Database
from queue_server.idempotency import Answer
from queue_server.models import Role, is_uuid
from queue_server.services import common
from queue_server.services.common import require_tenant
from queue_server.store import reads
from queue_server.store.types import Row

MAX_VERIFY_PAGE = 1000

# The columns a fold reproduces; the rest (timestamps of the row itself) are bookkeeping.
FOLDED = (
    "queue",
    "payload",
    "priority",
    "state",
    "available_at",
    "fence",
    "acquisition_count",
    "max_acquisitions",
    "lease_holder",
    "lease_expires_at",
    "result",
    "last_failure",
    "traceparent",
    "tracestate",
)


def _time(value: Any) -> Any:
    return datetime.fromisoformat(value) if isinstance(value, str) else value


def _release(state: Row, new_state: str) -> None:
    state.update(state=new_state, lease_holder=None, lease_expires_at=None)


def fold(events: list[Row]) -> Row:
    """The item as its events say it is."""
    item: Row = {}
    for expected_seq, event in enumerate(events):
        if event["seq"] != expected_seq:
            raise ValueError(f"ledger gap: expected seq {expected_seq}, found {event['seq']}")
        kind, data = event["kind"], event["data"]
        if kind == "enqueued":
            item = {
                "queue": data["queue"],
                "payload": data["payload"],
                "priority": data["priority"],
                # `waiting` behind an item of its ordering key not finished (0031).
                "state": data.get("state", "ready"),
                "available_at": _time(data["available_at"]),
                "fence": 0,
                "acquisition_count": 0,
                "max_acquisitions": data["max_acquisitions"],
                "lease_holder": None,
                "lease_expires_at": None,
                "result": None,
                "last_failure": None,
                "traceparent": data.get("trace", {}).get("traceparent"),
                "tracestate": data.get("trace", {}).get("tracestate"),
            }
        elif kind == "acquired":
            item.update(
                state="leased",
                fence=event["fence"],
                acquisition_count=data["acquisition_count"],
                lease_holder=data["lease_holder"],
                lease_expires_at=_time(data["lease_expires_at"]),
            )
        elif kind == "heartbeat":
            item["lease_expires_at"] = _time(data["lease_expires_at"])
        elif kind == "completed":
            _release(item, "completed")
            item["result"] = data["result"]
        elif kind == "requeued":
            _release(item, "ready")
            item["available_at"] = _time(data["available_at"])
            if "failure" in data:  # the failure the holder gave it back for, if it said
                item["last_failure"] = data["failure"]
        elif kind == "triaged":
            item["last_failure"] = data["failure"]
            if data["decision"] == "quarantine":
                _release(item, "quarantined")
            else:
                _release(item, "ready")
                item["available_at"] = _time(data["available_at"])
        elif kind == "released":
            _release(item, "ready")
            item.update(
                acquisition_count=data["acquisition_count"],
                available_at=_time(data["available_at"]),
            )
        elif kind == "quarantined":
            _release(item, "quarantined")
        elif kind in ("replayed", "retried"):  # from its dead letter; in bulk
            # Waiting for a dependency not completed (a descendant of a replayed step).
            _release(item, data.get("state", "ready"))
            item.update(
                acquisition_count=0,
                max_acquisitions=data["max_acquisitions"],
                available_at=_time(data["available_at"]),
            )
        elif kind == "cancelled":
            _release(item, "cancelled")
        elif kind == "unblocked":  # the item before it in its ordering key's line finished
            item["state"] = "ready"
        elif kind == "held":  # back from its dead letter behind others of its ordering key
            item["state"] = "waiting"
        elif kind == "deadline_exceeded":
            if "failure" in data:  # the attempt's failure (kept since this event carried it)
                item["last_failure"] = data["failure"]
        elif kind not in ("triage_rejected", "scheduled"):
            raise ValueError(f"unknown ledger event kind {kind!r} at seq {event['seq']}")
    return item


def mismatches(row: Row, events: list[Row]) -> list[str]:
    """Where the row and its folded ledger disagree (empty when they agree)."""
    try:
        folded = fold(events)
    except ValueError as exc:
        return [str(exc)]
    if not folded:
        return ["ledger has no enqueued event"]
    problems = []
    for column in FOLDED:
        actual = row[column]
        if column == "state":
            actual = str(actual)
        if folded.get(column) != actual:
            problems.append(f"{column}: row has {actual!r}, ledger folds to {folded.get(column)!r}")
    if row.get("event_seq") is not None and row["event_seq"] != len(events):
        problems.append(f"event_seq: row has {row['event_seq']}, ledger has {len(events)} events")
    return problems


@dataclass(frozen=True, slots=True)
class Mismatch:
    tenant: str
    item_id: str
    problems: list[str]


def verify_rows(rows: list[Row]) -> list[Mismatch]:
    """Fold each item's ledger (rows carry it as `events`) and compare it with the row."""
    found = []
    for row in rows:
        problems = mismatches(row, row["events"])
        if problems:
            found.append(Mismatch(row["tenant_id"], str(row["item_id"]), problems))
    return found


class Ledgers:
    """Ledger verification, a page at a time."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def verify(
        self,
        principal: auth.Principal,
        tenant: str | None,
        *,
        limit: int,
        cursor: str | None,
    ) -> Answer:
        """Fold the ledgers of one page of items (of a tenant, or of all tenants for an admin)."""
        if tenant is None:
            principal.require_admin()
        else:
            principal.require(tenant, Role.OPERATOR)
        after: tuple[str, str] | None = None
        if cursor:
            after_tenant, after_item = common.decode_cursor(cursor, 2)
            if not is_uuid(after_item):
                raise common.foreign_cursor()
            after = (after_tenant, after_item)
        async with self.db.conn() as conn:
            if tenant is not None:
                await require_tenant(conn, tenant)
            rows = await reads.ledger_page(conn, tenant=tenant, after=after, limit=limit)
        found = verify_rows(rows)
        next_cursor = None
        if len(rows) == limit:
            last = rows[-1]
            next_cursor = common.encode_cursor([last["tenant_id"], str(last["item_id"])])
        return Answer.of(
            200,
            {
                "checked": len(rows),
                "mismatches": [
                    {"tenant": m.tenant, "item_id": m.item_id, "problems": m.problems}
                    for m in found
                ],
                "next_cursor": next_cursor,
            },
        )
