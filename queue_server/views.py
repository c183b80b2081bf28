"""Rows as the JSON the API returns (the shapes of queue_server/api/schemas.py); orjson renders
datetimes as RFC 3339 UTC."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson

from queue_server.policy import run_key
from queue_server.store.types import Row

_DUMP_OPTIONS = orjson.OPT_UTC_Z | orjson.OPT_NAIVE_UTC


def dumps(value: Any) -> bytes:
    return orjson.dumps(value, option=_DUMP_OPTIONS)


def item(row: Row) -> dict[str, Any]:
    return {
        "item_id": str(row["item_id"]),
        "tenant": row["tenant_id"],
        "queue": row["queue"],
        "state": row["state"],
        "payload": row["payload"],
        "priority": row["priority"],
        "available_at": row["available_at"],
        "fence": row["fence"],
        "acquisition_count": row["acquisition_count"],
        "max_acquisitions": row["max_acquisitions"],
        "lease_holder": row["lease_holder"],
        "lease_expires_at": row["lease_expires_at"],
        # Only while leased: the column keeps the latest lease's deadline afterwards.
        "lease_deadline_at": row["lease_deadline_at"] if row["state"] == "leased" else None,
        "result": row["result"],
        "last_failure": row["last_failure"],
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
        "unique_key": row.get("unique_key"),
        "ordering_key": row.get("ordering_key"),
        "partition_key": row.get("partition_key"),
    }


def enqueued(
    tenant: str,
    queue: str,
    specs: list[dict[str, Any]],
    written: dict[str, tuple[int, datetime, datetime, str]],
) -> list[dict[str, Any]]:
    """New items as `item` shows them, in the order of `specs` (what was enqueued), from what
    the enqueue sent and what the database decided (`transitions.enqueue_rows`: budget,
    available_at, created_at and state by item id): no row is read back for the answer."""
    shaped = []
    for spec in specs:
        budget, available_at, created_at, state = written[spec["item_id"]]
        row = {
            **_NEW_ROW,
            "state": state,
            "item_id": spec["item_id"],
            "tenant_id": tenant,
            "queue": queue,
            "payload": spec["payload"],
            "priority": spec["priority"],
            "available_at": available_at,
            "max_acquisitions": budget,
            "created_at": created_at,
            "updated_at": created_at,
            "unique_key": spec.get("unique_key"),
            "ordering_key": spec.get("ordering_key"),
            "partition_key": spec.get("partition_key"),
        }
        shaped.append(item(row))
    return shaped


# What every new row holds before its first acquire.
_NEW_ROW: dict[str, Any] = {
    "state": "ready",
    "fence": 0,
    "acquisition_count": 0,
    "lease_holder": None,
    "lease_expires_at": None,
    "lease_deadline_at": None,
    "result": None,
    "last_failure": None,
}


def lease(row: Row) -> dict[str, Any]:
    return {
        "item_id": str(row["item_id"]),
        "fence": row["fence"],
        "acquisition_count": row["acquisition_count"],
        "lease_expires_at": row["lease_expires_at"],
        "lease_deadline_at": row["lease_deadline_at"],
        "payload": row["payload"],
        "priority": row["priority"],
        "queue": row["queue"],
        "trace": _trace(row),
    }


def _trace(row: Row) -> dict[str, Any] | None:
    """The enqueue's trace context, with how long before this acquisition it was enqueued
    (both instants from the database's clock): a worker links to a context too old to
    parent its span."""
    traceparent = row["traceparent"]
    if traceparent is None:
        return None
    trace: dict[str, Any] = {"traceparent": traceparent}
    if row["tracestate"] is not None:
        trace["tracestate"] = row["tracestate"]
    trace["age"] = (row["leased_at"] - row["created_at"]).total_seconds()
    return trace


def event(row: Row) -> dict[str, Any]:
    return {
        "seq": row["seq"],
        "at": row["at"],
        "kind": row["kind"],
        "fence": row["fence"],
        "actor": row["actor"],
        "actor_name": row.get("actor_name"),
        "data": row["data"],
    }


def tenant(row: Row, counts: dict[str, int] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "tenant": row["tenant_id"],
        "backlog_cap": row["backlog_cap"],
        "default_max_acquisitions": row["default_max_acquisitions"],
        "default_lease_ttl": row["default_lease_ttl"].total_seconds(),
        "retention": row["retention"].total_seconds(),
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
    }
    if counts is not None:
        states = ("ready", "leased", "completed", "quarantined", "cancelled")
        body.update({state: counts.get(state, 0) for state in states})
        body["backlog"] = body["ready"] + body["leased"]
    elif "backlog" in row:  # a listing: the admission counters' backlog, no count by state
        body["backlog"] = row["backlog"]
    return body


def api_key(row: Row) -> dict[str, Any]:
    return {
        "key_id": row["key_id"],
        "tenant": row["tenant_id"],
        "role": row["role"],
        "name": row["name"],
        "created_at": row["created_at"],
        "revoked_at": row["revoked_at"],
    }


def policy_version(row: Row, *, current: tuple[str, str]) -> dict[str, Any]:
    return {
        "version": row["version"],
        "sha256": row["sha256"],
        "source": row["source"],
        "first_loaded_at": row["first_loaded_at"],
        "last_loaded_at": row["last_loaded_at"],
        "loads": row["loads"],
        "current": (row["version"], row["sha256"]) == current,
        "published_by": row.get("published_by"),
        "reason": row.get("reason"),
        "published_at": row.get("published_at"),
        "activated_at": row.get("activated_at"),
    }


def spend_approval(row: Row) -> dict[str, Any]:
    return {
        "approval_id": str(row["approval_id"]),
        "tenant": row["tenant_id"],
        "queue": row["queue"],
        "approved_by": row["approved_by"],
        "approved_by_key": row["approved_by_key_id"],
        "approved_by_role": row["approved_by_role"],
        "max_concurrency": row["max_concurrency"],
        "expires_at": row["expires_at"],
        "reason": row["reason"],
        "created_at": row["created_at"],
        "live": row["live"],
        "revoked_at": row["revoked_at"],
        "revoked_by": row["revoked_by"],
    }


def dead_letter(row: Row) -> dict[str, Any]:
    return {
        "dead_letter_id": str(row["dead_letter_id"]),
        "kind": row["kind"],
        "item_id": str(row["item_id"]) if row["item_id"] else None,
        "delivery_id": str(row["delivery_id"]) if row["delivery_id"] else None,
        "queue": row["queue"],
        "reason": row["reason"],
        "last_failure": row["last_failure"],
        "created_at": row["created_at"],
        "closed_at": row["closed_at"],
        "resolution": row["resolution"],
    }


def watcher(row: Row, counts: dict[str, int] | None = None) -> dict[str, Any]:
    """A watcher as the API shows it: never its secret."""
    body = {
        "watcher_id": str(row["watcher_id"]),
        "tenant": row["tenant_id"],
        "url": row["url"],
        "events": list(row["events"]),
        "queues": list(row["queues"]) if row["queues"] is not None else None,
        "state": row["state"],
        "disabled_reason": row["disabled_reason"],
        # Past the outbox cap: its new events wait in the ledger until the backfill.
        "backlogged": row["backlogged_at"] is not None,
        "backlogged_at": row["backlogged_at"],
        "backlog_from": row["backlog_from"],
        "previous_secret_expires_at": row["previous_secret_expires_at"],
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
    }
    if counts is not None:
        body["deliveries"] = {
            state: counts.get(state, 0) for state in ("pending", "delivered", "dead", "cancelled")
        }
    return body


def delivery(row: Row) -> dict[str, Any]:
    return {
        "delivery_id": str(row["delivery_id"]),
        "delivery_key": row["delivery_key"],
        "watcher_id": str(row["watcher_id"]),
        "event": row["event"],
        "item_id": str(row["item_id"]) if row["item_id"] else None,
        "queue": row["queue"],
        "state": row["state"],
        "attempts": row["attempts"],
        "next_attempt_at": row["next_attempt_at"],
        "last_attempt_at": row["last_attempt_at"],
        "last_outcome": row["last_outcome"],
        "receipts": row["receipts"],
        "receipts_omitted": row["receipts_omitted"],
        "created_at": row["created_at"],
        "delivered_at": row["delivered_at"],
    }


def confirmation_receipt(row: Row) -> dict[str, Any]:
    return {
        "outcome_ref": row["outcome_ref"],
        "idempotency_key": row["idempotency_key"],
        "status": row["status"],
        "outcome": row["outcome"],
        "created_at": row["created_at"],
        "settled_at": row["settled_at"],
        # An operator's settlement of a receipt left pending past the class deadline.
        "settled_by": row["settled_by"],
        "settle_reason": row["settle_reason"],
    }


def checkpoint(row: Row) -> dict[str, Any]:
    return {
        "run_id": str(row["run_id"]),
        "item": row["item"],
        "result": row["result"],
        "recorded_at": row["recorded_at"],
    }


def verification_run_summary(row: Row) -> dict[str, Any]:
    """A run in a list: counts of its declared and checkpointed items instead of the lists."""
    return {
        "run_id": str(row["run_id"]),
        "run_key": run_key(row["artifact_version"], row["verifier_version"]),
        "artifact_version": row["artifact_version"],
        "verifier_version": row["verifier_version"],
        "state": row["state"],
        "items": row["item_count"],
        "checkpoints": row["checkpoint_count"],
        "created_at": row["created_at"],
        "completed_at": row["completed_at"],
        "deadline_at": row["deadline_at"],
        "ended": _ended(row),
    }


def _ended(row: Row) -> dict[str, Any] | None:
    """Who ended a run that did not complete, when and why."""
    if row["ended_at"] is None:
        return None
    return {"at": row["ended_at"], "by": row["ended_by"], "reason": row["end_reason"]}


def verification_run(row: Row, checkpoints: list[Row]) -> dict[str, Any]:
    done = {c["item"] for c in checkpoints}
    return {
        "run_id": str(row["run_id"]),
        "run_key": run_key(row["artifact_version"], row["verifier_version"]),
        "artifact_version": row["artifact_version"],
        "verifier_version": row["verifier_version"],
        "state": row["state"],
        "items": row["items"],
        "checkpoints": [checkpoint(c) for c in checkpoints],
        "remaining": [i for i in row["items"] if i not in done],
        "created_at": row["created_at"],
        "completed_at": row["completed_at"],
        "deadline_at": row["deadline_at"],
        "ended": _ended(row),
    }


def schedule(row: Row, next_fires: list[Any]) -> dict[str, Any]:
    return {
        "schedule": row["name"],
        "tenant": row["tenant_id"],
        "schedule_id": str(row["schedule_id"]),
        "queue": row["queue"],
        "payload": row["payload"],
        "priority": row["priority"],
        "max_acquisitions": row["max_acquisitions"],
        "cron": row["cron"],
        "every": row["every_seconds"],
        "timezone": row["timezone"],
        "catch_up": row["catch_up"],
        "catch_up_limit": row["catch_up_limit"],
        "paused": row["paused"],
        "next_fires": next_fires,
        "fires": row["fires"],
        "refusals": row["refusals"],
        "skipped": row["skipped"],
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
    }


def schedule_fire(row: Row) -> dict[str, Any]:
    return {
        "tick_at": row["tick_at"],
        "kind": row["kind"],
        "outcome": row["outcome"],
        "item_id": str(row["item_id"]) if row["item_id"] is not None else None,
        "attempts": row["attempts"],
        "at": row["at"],
        "detail": row["detail"],
    }


def queue_event_text(event: dict[str, Any]) -> str:
    """One event of the queue's ledger in words: a pause or resume, its settings, its
    concurrency, an approval that expired."""
    data = event.get("data") or {}
    kind = str(event["kind"])
    if kind in ("paused", "resumed"):
        return f"{kind}" + (f": {data['reason']}" if data.get("reason") else "")
    if kind == "concurrency":

        def shown(value: object) -> str:
            return "the approved limit" if value is None else str(value)

        text = (
            f"concurrency {shown(data.get('before'))} -> {shown(data.get('after'))}"
            f" (approved {data.get('approved_limit')})"
        )
        return text + (f": {data['reason']}" if data.get("reason") else "")
    if kind == "approval-expired":
        return (
            f"spend approval {str(data.get('approval_id', ''))[:8]} of"
            f" {data.get('max_concurrency')} expired: the queue leases at most"
            f" {data.get('limit')} at a time"
        )
    if kind == "settings":
        before, after = data.get("before") or {}, data.get("after") or {}
        changed = [k for k in after if before.get(k) != after.get(k)]
        return "settings: " + (
            ", ".join(f"{k} {before.get(k)} -> {after.get(k)}" for k in changed) or "unchanged"
        )
    return kind
