"""Steps many tests take on items: expire a lease, quarantine, replay, read metrics."""

from __future__ import annotations

import asyncio
import re
import uuid
from datetime import timedelta
from typing import Any

import httpx
import psycopg
from psycopg.rows import dict_row

from queue_server.store import queues
from tests.helpers.api import Api

Db = psycopg.Connection[dict[str, object]]


def expire(db: Db, item_id: object) -> None:
    """Move the lease's expiry into the past (the database clock decides expiry)."""
    db.execute(
        "UPDATE work_items SET lease_expires_at = now() - interval '1 second' WHERE item_id = %s",
        (item_id,),
    )


def quarantine(api: Api, queue: str = "q", payload: object = "poison") -> str:
    """Enqueue, lease and triage one item into quarantine; returns its item id."""
    item = api.enqueue(queue, payload)
    leases = api.acquire(queue, worker="w1")
    (lease,) = [lease for lease in leases if lease["item_id"] == item["item_id"]]
    response = api.holder(
        "triage",
        item["item_id"],
        worker="w1",
        fence=lease["fence"],
        failure={"class": "Boom", "message": "poisoned", "transient": False},
        decision="quarantine",
    )
    assert response.status_code == 200, response.text
    assert response.json()["state"] == "quarantined"
    return str(item["item_id"])


def dead_letters(client: httpx.Client, tenant: str = "acme", **params: Any) -> dict[str, Any]:
    response = client.get(f"/v1/tenants/{tenant}/dead-letters", params=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def dead_letter_of(api: Api, item_id: str) -> str:
    listed = dead_letters(api.operator, limit=500)["dead_letters"]
    (found,) = [d for d in listed if d["item_id"] == item_id]
    return str(found["dead_letter_id"])


def replay(api: Api, dead_letter_id: str, key: str | None = None, **body: Any) -> httpx.Response:
    return api.operator.post(
        f"/v1/tenants/acme/dead-letters/{dead_letter_id}/replay",
        json=body,
        headers={"Idempotency-Key": key or uuid.uuid4().hex},
    )


def requests_to(api: Api, route: str) -> int:
    """Requests the server answered on `route` (a route template), summed over statuses."""
    text = api.admin.get("/metrics").text
    pattern = re.compile(r"^queue_server_requests_total\{(.*)\} (\S+)$", flags=re.MULTILINE)
    total = 0.0
    for labels, value in pattern.findall(text):
        if f'route="{route}"' in labels:
            total += float(value)
    return int(total)


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of the series `name{labels}` in a scrape, or None when absent."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        series, _, value = line.rpartition(" ")
        found = dict(re.findall(r'(\w+)="([^"]*)"', series))
        if series.split("{")[0] == name and found == labels:
            return float(value)
    return None


def enqueue_graph(api: Api, queue: str = "q") -> tuple[str, str, str, str]:
    """A workflow in one batch: fetch, then parse and index (each after fetch), then publish
    (after both); their ids in that order."""
    made = api.worker.post(
        f"/v1/tenants/{api.tenant}/queues/{queue}/items:batch",
        json={
            "items": [
                {"payload": "fetch", "ref": "fetch"},
                {"payload": "parse", "ref": "parse", "depends_on": ["fetch"]},
                {"payload": "index", "ref": "index", "depends_on": ["fetch"]},
                {"payload": "publish", "depends_on": ["parse", "index"]},
            ]
        },
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert made.status_code == 201, made.text
    fetch, parse, index, publish = (str(i["item_id"]) for i in made.json()["items"])
    return fetch, parse, index, publish


def put_settings(api: Api, queue: str = "q", **settings: Any) -> httpx.Response:
    """The queue's settings replaced with `settings` (an operator's PUT)."""
    return api.operator.put(
        f"/v1/tenants/{api.tenant}/queues/{queue}/settings",
        json=settings,
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )


def enqueue_many(api: Api, items: list[dict[str, Any]], queue: str = "q") -> None:
    """`items` enqueued on the queue in batches of 500 (the most one batch takes)."""
    for start in range(0, len(items), 500):
        answer = api.worker.post(
            f"/v1/tenants/{api.tenant}/queues/{queue}/items:batch",
            json={"items": items[start : start + 500]},
            headers={"Idempotency-Key": uuid.uuid4().hex},
        )
        assert answer.status_code == 201, answer.text


def complete_leases(api: Api, leases: list[dict[str, Any]]) -> None:
    """Their holder `w1` completes the leases in one request (POST .../completions)."""
    done = api.worker.post(
        f"/v1/tenants/{api.tenant}/completions",
        json={
            "worker": "w1",
            "completions": [{"item_id": x["item_id"], "fence": x["fence"]} for x in leases],
        },
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert done.status_code == 200, done.text
    refused = [r for r in done.json()["results"] if r["status"] != 200]
    assert refused == [], refused


def quarantine_lease(api: Api, lease: dict[str, Any]) -> None:
    """Its holder triages the leased item to quarantine (a dead letter)."""
    triage_lease(api, lease, "quarantine", {"class": "Boom"})


def triage_lease(
    api: Api, lease: dict[str, Any], decision: str, failure: dict[str, Any]
) -> dict[str, Any]:
    """Its holder (worker w1) triages the leased item with `failure`; the item answered."""
    response = api.holder(
        "triage",
        lease["item_id"],
        worker="w1",
        fence=lease["fence"],
        failure=failure,
        decision=decision,
    )
    assert response.is_success, response.text
    item: dict[str, Any] = response.json()
    return item


def ledger_mismatches(api: Api) -> list[Any]:
    """The tenant's ledgers that do not fold to their rows (none, when all is well)."""
    answer = api.operator.get(f"/v1/tenants/{api.tenant}/ledger-verification")
    assert answer.status_code == 200, answer.text
    mismatches: list[Any] = answer.json()["mismatches"]
    return mismatches


def sample_queues(url: str) -> None:
    """One round of the sweeper's sampling of the queues' counters, whenever the last was."""

    async def run() -> None:
        async with await psycopg.AsyncConnection.connect(
            url, autocommit=True, row_factory=dict_row
        ) as conn:
            await queues.sample(conn, min_gap=timedelta(0))

    asyncio.run(run())
