"""Rows as the JSON the API returns (API.md); orjson renders datetimes as RFC 3339 UTC."""

from __future__ import annotations

from typing import Any

import orjson

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
        "result": row["result"],
        "last_failure": row["last_failure"],
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
    }


def lease(row: Row) -> dict[str, Any]:
    return {
        "item_id": str(row["item_id"]),
        "fence": row["fence"],
        "acquisition_count": row["acquisition_count"],
        "lease_expires_at": row["lease_expires_at"],
        "payload": row["payload"],
        "priority": row["priority"],
        "queue": row["queue"],
    }


def event(row: Row) -> dict[str, Any]:
    return {
        "seq": row["seq"],
        "at": row["at"],
        "kind": row["kind"],
        "fence": row["fence"],
        "actor": row["actor"],
        "data": row["data"],
    }


def tenant(row: Row, counts: dict[str, int] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "tenant": row["tenant_id"],
        "backlog_cap": row["backlog_cap"],
        "default_max_acquisitions": row["default_max_acquisitions"],
        "default_lease_ttl": row["default_lease_ttl"].total_seconds(),
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
    }
    if counts is not None:
        states = ("ready", "leased", "completed", "quarantined", "cancelled")
        body.update({state: counts.get(state, 0) for state in states})
        body["backlog"] = body["ready"] + body["leased"]
    return body


def spend_approval(row: Row) -> dict[str, Any]:
    return {
        "approval_id": str(row["approval_id"]),
        "tenant": row["tenant_id"],
        "queue": row["queue"],
        "approved_by": row["approved_by"],
        "max_concurrency": row["max_concurrency"],
        "expires_at": row["expires_at"],
        "reason": row["reason"],
        "created_at": row["created_at"],
    }
