"""Leases in every condition a holder operation must refuse, and what a refusal leaves as it was.

Every case is presented by the worker name `w1`, each on an item in a queue of its own (one
lease per queue without an approval), so exactly one guard tells each case apart from the
accepted one: the holder (another name holds it), the fence (stale: the same name holds a
newer lease; ahead: never handed out), the expiry, the deadline, the state.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import psycopg

from tests.helpers.api import Api, setup_tenant
from tests.helpers.items import expire

Db = psycopg.Connection[dict[str, object]]

WORKER = "w1"
FAILURE = {"class": "Boom", "message": "it broke", "transient": False}


@dataclass(frozen=True)
class Presented:
    """What `w1` presents for one item, and the problem code a holder operation answers."""

    case: str
    item_id: str
    fence: int
    code: str  # "" for the accepted case

    @property
    def entry(self) -> dict[str, object]:
        return {"item_id": self.item_id, "fence": self.fence}


# Each refused case and its 409 problem code.
REFUSED = {
    "another-holder": "not-lease-holder",
    "stale-fence": "stale-fence",
    "fence-ahead": "fence-ahead",
    "expired": "lease-expired",
    "past-deadline": "lease-deadline-exceeded",
    "never-leased": "item-not-leased",
    "completed": "item-not-leased",
    "cancelled": "item-cancelled",
}


def _lease(api: Api, queue: str, worker: str = WORKER) -> tuple[str, int]:
    (lease,) = api.acquire(queue, worker=worker, ttl=10)
    return str(lease["item_id"]), int(str(lease["fence"]))


def presentations(api: Api, db: Db, prefix: str) -> dict[str, Presented]:
    """One item per case of `REFUSED` and one `accepted`, in queues named `prefix-CASE`."""
    out: dict[str, Presented] = {}

    def queue(case: str) -> str:
        api.enqueue(f"{prefix}-{case}", payload=case)
        return f"{prefix}-{case}"

    def add(case: str, item_id: str, fence: int) -> None:
        out[case] = Presented(case, item_id, fence, REFUSED.get(case, ""))

    add("accepted", *_lease(api, queue("accepted")))
    add("another-holder", *_lease(api, queue("another-holder"), worker="w2"))
    q = queue("stale-fence")
    item_id, first = _lease(api, q)
    expire(db, item_id)
    again, second = _lease(api, q)  # the same name, a newer lease
    assert (again, second) == (item_id, first + 1)
    add("stale-fence", item_id, first)
    item_id, fence = _lease(api, queue("fence-ahead"))
    add("fence-ahead", item_id, fence + 1)
    item_id, fence = _lease(api, queue("expired"))
    expire(db, item_id)
    add("expired", item_id, fence)
    item_id, fence = _lease(api, queue("past-deadline"))
    db.execute(
        "UPDATE work_items SET lease_expires_at = now() - interval '1 second',"
        " lease_deadline_at = now() - interval '1 second' WHERE item_id = %s",
        (item_id,),
    )
    add("past-deadline", item_id, fence)
    never = api.enqueue(f"{prefix}-never-leased")
    add("never-leased", str(never["item_id"]), int(str(never["fence"])))
    item_id, fence = _lease(api, queue("completed"))
    done = api.holder("complete", item_id, worker=WORKER, fence=fence)
    assert done.status_code == 200, done.text
    add("completed", item_id, fence)
    item_id, fence = _lease(api, queue("cancelled"))
    cancelled = api.operator.post(
        f"/v1/tenants/{api.tenant}/items/{item_id}/cancel",
        json={"reason": "not wanted"},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert cancelled.status_code == 200, cancelled.text
    add("cancelled", item_id, fence)
    return out


# What a refusal must leave unchanged (event_seq aside: a refused triage appends its event).
COLUMNS = (
    "state, fence, lease_holder, lease_expires_at, lease_deadline_at, acquisition_count,"
    " available_at, result, last_failure, updated_at"
)


def stored(db: Db, item_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Each item's row and its ledger (`events`), as stored."""
    rows = db.execute(
        f"SELECT item_id::text AS item_id, {COLUMNS} FROM work_items"
        " WHERE item_id = ANY(%s::uuid[])",
        (item_ids,),
    ).fetchall()
    events = db.execute(
        "SELECT item_id::text AS item_id, seq, kind, fence, actor, data FROM item_events"
        " WHERE item_id = ANY(%s::uuid[]) ORDER BY item_id, seq",
        (item_ids,),
    ).fetchall()
    out: dict[str, dict[str, Any]] = {str(r["item_id"]): {**r, "events": []} for r in rows}
    for event in events:
        out[str(event["item_id"])]["events"].append(
            {k: v for k, v in event.items() if k != "item_id"}
        )
    return out


def codes(results: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """(status, problem code) of each entry of a batch answer; code "" for an accepted one."""
    return [(r["status"], (r.get("problem") or {}).get("code", "")) for r in results]


def foreign_lease(api: Api, tenant: str = "globex", db: Db | None = None) -> tuple[Api, str, int]:
    """Another tenant, an item of it leased by `w1`: (its clients, the item id, the fence).
    With `db`, the lease is one taken before leases kept their key (lease_key_id NULL), which
    any key that names its holder and fence may act on: only the tenant guard refuses ours."""
    other = setup_tenant(api.url, api.admin, tenant)
    other.enqueue("q", payload="theirs")
    item_id, fence = _lease(other, "q")
    if db is not None:
        db.execute("UPDATE work_items SET lease_key_id = NULL WHERE item_id = %s", (item_id,))
    return other, item_id, fence
