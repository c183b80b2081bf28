"""Folding an item's ledger: replaying its events must reproduce the item's row."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from queue_server.store.types import Row

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
                "state": "ready",
                "available_at": _time(data["available_at"]),
                "fence": 0,
                "acquisition_count": 0,
                "max_acquisitions": data["max_acquisitions"],
                "lease_holder": None,
                "lease_expires_at": None,
                "result": None,
                "last_failure": None,
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
        elif kind == "replayed":
            _release(item, "ready")
            item.update(
                acquisition_count=0,
                max_acquisitions=data["max_acquisitions"],
                available_at=_time(data["available_at"]),
            )
        elif kind == "cancelled":
            _release(item, "cancelled")
        elif kind != "triage_rejected":
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
