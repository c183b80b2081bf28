"""A fan-in whose last completions race each other, and one whose last completion is cut by
a killed API: the callback is released exactly once, and reads every item's outcome.

Each round enqueues a batch of `items` with a callback. A worker completes all but the last
two. Then either both are completed at the same instant on two connections (even rounds),
or the API is SIGKILLed while the second's completion is in flight and restarted, and that
completion is sent again under its own Idempotency-Key until it is answered (odd rounds).
Checkers: `release` (the callback is ready, with exactly one `unblocked` ledger event, and
was not ready before the last completion), `outcomes` (its worker reads every item of the
batch, each completed exactly once), `ledger` (the tenant's ledgers fold to their rows).
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import httpx

from reliability.checkers import CheckReport, Violation
from reliability.cluster import Cluster, say
from reliability.history import JSONValue
from reliability.scenarios import ScenarioOutcome

TENANT = "fanin"


def _complete(client: httpx.Client, lease: dict[str, Any], key: str) -> httpx.Response:
    return client.post(
        f"/v1/tenants/{TENANT}/items/{lease['item_id']}/complete",
        json={"worker": "w", "fence": lease["fence"], "result": lease["payload"]},
        headers={"Idempotency-Key": key},
    )


def _until_answered(cluster: Cluster, lease: dict[str, Any], key: str, worker: str) -> int:
    """The completion sent again, under its key, until the restarted API answers it."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with httpx.Client(
                base_url=cluster.base_url,
                headers={"Authorization": f"Bearer {worker}"},
                timeout=10,
            ) as client:
                return _complete(client, lease, key).status_code
        except httpx.TransportError:
            time.sleep(0.2)
    return 0


def fan_in_under_kills(
    *, name: str = "fan-in", rounds: int = 6, items: int = 500
) -> ScenarioOutcome:
    """Fan-ins of `items` whose last two completions race or are cut by a killed API."""
    began = time.monotonic()
    violations: list[Violation] = []
    metrics: dict[str, JSONValue] = {"rounds": rounds, "items": items}
    kills = 0
    with Cluster(name="fanin") as cluster:
        keys = cluster.create_tenant(
            TENANT, backlog_cap=10_000, max_concurrency=1000, queues=("parts", "sums")
        )
        headers = {"Authorization": f"Bearer {keys.worker}"}
        for n in range(rounds):
            cut = n % 2 == 1
            say(
                f"{name}: round {n + 1}/{rounds}, {items} items, last two {'cut' if cut else 'racing'}"
            )
            with httpx.Client(base_url=cluster.base_url, headers=headers, timeout=30) as client:
                made = client.post(
                    f"/v1/tenants/{TENANT}/queues/parts/items:batch",
                    json={
                        "items": [{"payload": i} for i in range(items)],
                        "callback": {"queue": "sums", "payload": {"round": n}},
                    },
                    headers={"Idempotency-Key": uuid.uuid4().hex},
                )
                made.raise_for_status()
                callback = made.json()["callback"]["item_id"]
                leases: list[dict[str, Any]] = []
                while len(leases) < items:
                    got = client.post(
                        f"/v1/tenants/{TENANT}/queues/parts/leases",
                        json={"worker": "w", "lease_ttl": 30, "max_items": 100},
                    )
                    got.raise_for_status()
                    leases += got.json()["leases"]
                for lease in leases[:-2]:
                    _complete(client, lease, uuid.uuid4().hex).raise_for_status()
                early = client.get(f"/v1/tenants/{TENANT}/items/{callback}").json()["state"]
                if early != "waiting":
                    violations.append(
                        Violation("release", f"round {n}: the callback was {early} early")
                    )
            last = leases[-2:]
            if not cut:
                start = threading.Barrier(2)
                answers: list[int] = []

                def finish(
                    lease: dict[str, Any],
                    start: threading.Barrier = start,
                    answers: list[int] = answers,
                ) -> None:
                    with httpx.Client(
                        base_url=cluster.base_url, headers=headers, timeout=30
                    ) as own:
                        start.wait()
                        answers.append(_complete(own, lease, uuid.uuid4().hex).status_code)

                threads = [threading.Thread(target=finish, args=(lease,)) for lease in last]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join(timeout=60)
                if answers != [200, 200]:
                    violations.append(Violation("release", f"round {n}: answered {answers}"))
            else:
                with httpx.Client(base_url=cluster.base_url, headers=headers, timeout=30) as c:
                    _complete(c, last[0], uuid.uuid4().hex).raise_for_status()
                key = uuid.uuid4().hex
                in_flight = threading.Thread(
                    target=_until_answered, args=(cluster, last[1], key, keys.worker)
                )
                in_flight.start()
                time.sleep(0.005)  # the request on its way, perhaps committed, perhaps not
                cluster.kill_api()
                kills += 1
                cluster.start_api()
                in_flight.join(timeout=90)
                status = _until_answered(cluster, last[1], key, keys.worker)
                if status != 200:
                    violations.append(Violation("release", f"round {n}: answered {status}"))
            with httpx.Client(base_url=cluster.base_url, headers=headers, timeout=30) as client:
                ledger = client.get(f"/v1/tenants/{TENANT}/items/{callback}/ledger").json()
                kinds = [e["kind"] for e in ledger["events"]]
                if kinds != ["enqueued", "unblocked"]:
                    violations.append(Violation("release", f"round {n}: the callback's {kinds}"))
                seen: dict[str, dict[str, Any]] = {}
                cursor = None
                while True:
                    page = client.get(
                        f"/v1/tenants/{TENANT}/items/{callback}/dependencies",
                        params={"limit": 200, **({"cursor": cursor} if cursor else {})},
                    ).json()
                    seen |= {i["item_id"]: i for i in page["items"]}
                    cursor = page["next_cursor"]
                    if cursor is None:
                        break
                outcomes = sorted(i["result"] for i in seen.values() if i["state"] == "completed")
                if outcomes != list(range(items)):
                    violations.append(
                        Violation("outcomes", f"round {n}: read {len(outcomes)} of {items} results")
                    )
        with cluster.db() as conn:
            twice = conn.execute(
                "SELECT count(*) AS n FROM (SELECT item_id FROM item_events WHERE tenant_id = %s"
                " AND kind = 'completed' GROUP BY item_id HAVING count(*) > 1) AS d",
                (TENANT,),
            ).fetchone()
        duplicated = int(twice["n"]) if twice is not None else 0
        if duplicated:
            violations.append(Violation("outcomes", f"{duplicated} items completed twice"))
        folded = cluster.admin_client().get(f"/v1/tenants/{TENANT}/ledger-verification")
        mismatches = folded.json().get("mismatches", []) if folded.is_success else ["?"]
        if mismatches:
            violations.append(Violation("ledger", f"{len(mismatches)} ledgers do not fold"))
    metrics["api_kills"] = kills
    by_checker: dict[str, int] = {}
    for violation in violations:
        by_checker[violation.checker] = by_checker.get(violation.checker, 0) + 1
    report = CheckReport(
        scenario=name,
        operations=rounds * items,
        faults_injected=kills,
        lost=0,
        duplicated=duplicated,
        violations=tuple(violations),
        by_checker=by_checker,
    )
    return ScenarioOutcome(report, time.monotonic() - began, metrics)
