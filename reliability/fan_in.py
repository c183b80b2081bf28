"""A fan-in whose last completions race each other, and one whose last completion is cut by
a killed API: the callback is released exactly once, and reads every item's outcome.

Each round enqueues `items` (up to 10,000) with a callback: batches of 500, the last one's
callback naming the items of the others. Workers complete all but two, a hundred at a time
(`completions`). Then either both are completed at the same instant on two connections
(even rounds), or the API is SIGKILLed while the second's completion is in flight and
restarted, and that completion is sent again under its own Idempotency-Key until it is
answered (odd rounds). Checkers: `release` (the callback is ready, with exactly one
`unblocked` ledger event, and was not ready before the last completion), `outcomes` (its
worker reads every item, each completed exactly once), `ledger` (the tenant's ledgers fold
to their rows). The last round runs under a REPEATABLE READ snapshot held by another
session. The metrics give the rate at which each round's items were completed, and that of
its first and last tenth: flat when the ten-thousandth costs what the first did (the
callback's count is appended, never rewritten: migration 0038).
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import httpx
import psycopg

from reliability.checkers import CheckReport, Violation
from reliability.cluster import HARNESS_APP, Cluster, say
from reliability.history import JSONValue
from reliability.scenarios import ScenarioOutcome

TENANT = "fanin"


def _complete_one(client: httpx.Client, lease: dict[str, Any], key: str) -> httpx.Response:
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
                return _complete_one(client, lease, key).status_code
        except httpx.TransportError:
            time.sleep(0.2)
    return 0


def _batch(client: httpx.Client, payloads: range, callback: dict[str, Any] | None) -> Any:
    body: dict[str, Any] = {"items": [{"payload": i} for i in payloads]}
    if callback is not None:
        body["callback"] = callback
    made = client.post(
        f"/v1/tenants/{TENANT}/queues/parts/items:batch",
        json=body,
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    made.raise_for_status()
    return made.json()


def _complete(
    client: httpx.Client,
    held: list[dict[str, Any]],
    limit: int | None = None,
    marks: list[tuple[float, int]] | None = None,
) -> int:
    """Leases taken a hundred at a time and completed, but for the first two, held (in
    `held`, their leases extended every 5 s), until none is left or `limit` are completed:
    how many were."""
    completed = 0
    beat = time.monotonic()
    while limit is None or completed < limit:
        if time.monotonic() - beat > 5:
            beat = time.monotonic()
            for lease in held:  # kept for the end: their leases extended
                client.post(
                    f"/v1/tenants/{TENANT}/items/{lease['item_id']}/heartbeat",
                    json={"worker": "w", "fence": lease["fence"], "lease_ttl": 30},
                    headers={"Idempotency-Key": uuid.uuid4().hex},
                ).raise_for_status()
        got = client.post(
            f"/v1/tenants/{TENANT}/queues/parts/leases",
            json={
                "worker": "w",
                "lease_ttl": 30,
                "max_items": 100 if limit is None else min(100, limit - completed + 2),
            },
        )
        if got.status_code != 200:
            raise AssertionError(f"acquire answered {got.status_code}: {got.text[:300]}")
        leases = got.json()["leases"]
        if not leases:
            break
        while len(held) < 2 and leases:
            held.append(leases.pop())
        if not leases:
            continue
        done = client.post(
            f"/v1/tenants/{TENANT}/completions",
            json={
                "worker": "w",
                "completions": [
                    {
                        "item_id": lease["item_id"],
                        "fence": lease["fence"],
                        "result": lease["payload"],
                    }
                    for lease in leases
                ],
            },
            headers={"Idempotency-Key": uuid.uuid4().hex},
        )
        done.raise_for_status()
        refused = [r for r in done.json()["results"] if r["status"] != 200]
        if refused:
            raise AssertionError(f"completions refused: {refused[:3]}")
        completed += len(leases)
        if marks is not None:
            marks.append((time.monotonic(), len(leases)))
    return completed


def _rate(marks: list[tuple[float, int]]) -> float:
    """Completions per second between the first and the last mark."""
    seconds = marks[-1][0] - marks[0][0]
    return round(sum(n for _, n in marks[1:]) / seconds, 1) if seconds > 0 else 0.0


def _held_snapshot(cluster: Cluster) -> psycopg.Connection[Any]:
    """A session holding a REPEATABLE READ snapshot (a report, a pg_dump) until closed."""
    snap = psycopg.connect(cluster.db_url, application_name=HARNESS_APP)
    snap.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    snap.execute("SELECT count(*) FROM work_items").fetchone()
    return snap


def fan_in_under_kills(
    *, name: str = "fan-in", rounds: int = 4, items: int = 10_000, hold_snapshot: bool = True
) -> ScenarioOutcome:
    """Fan-ins of `items` whose last two completions race or are cut by a killed API; the
    last round's completions run under a held snapshot (`hold_snapshot`)."""
    began = time.monotonic()
    violations: list[Violation] = []
    metrics: dict[str, JSONValue] = {"rounds": rounds, "items": items}
    rates: list[JSONValue] = []
    ends: list[JSONValue] = []
    kills = 0
    with Cluster(name="fanin") as cluster:
        keys = cluster.create_tenant(
            TENANT, backlog_cap=10_000, max_concurrency=1000, queues=("parts", "sums")
        )
        headers = {"Authorization": f"Bearer {keys.worker}"}
        for n in range(rounds):
            cut = n % 2 == 1
            held = hold_snapshot and n == rounds - 1
            say(
                f"{name}: round {n + 1}/{rounds}, {items} items, last two {'cut' if cut else 'racing'}"
                + (", a REPEATABLE READ snapshot held" if held else "")
            )
            snapshot = _held_snapshot(cluster) if held else None
            with httpx.Client(base_url=cluster.base_url, headers=headers, timeout=30) as client:
                # All but the last batch; a tenth of the round completed (so that the
                # backlog, the callback's waiting included, stays within the tenant's cap of
                # 10,000); then the last batch, whose callback names every earlier item,
                # completed ones included; then the rest, two held for the end.
                chunks = [range(at, min(at + 500, items)) for at in range(0, items, 500)]
                earlier = [
                    str(i["item_id"])
                    for chunk in chunks[:-1]
                    for i in _batch(client, chunk, None)["items"]
                ]
                last: list[dict[str, Any]] = []
                began_completing = time.monotonic()
                completed = _complete(client, last, limit=max(0, min(1_000, len(earlier) - 2)))
                callback = str(
                    _batch(
                        client,
                        chunks[-1],
                        {"queue": "sums", "payload": {"round": n}}
                        | ({"depends_on": earlier} if earlier else {}),
                    )["callback"]["item_id"]
                )
                marks: list[tuple[float, int]] = [(time.monotonic(), 0)]
                completed += _complete(client, last, marks=marks)
                rates.append(round(completed / (time.monotonic() - began_completing), 1))
                # The first and the last tenth of the completions after the callback was
                # enqueued: flat when each costs the same however many came before.
                tenth = max(1, len(marks) // 10)
                ends.append([_rate(marks[: tenth + 1]), _rate(marks[-tenth - 1 :])])
                if snapshot is not None:
                    snapshot.close()
                early = client.get(f"/v1/tenants/{TENANT}/items/{callback}").json()["state"]
                if early != "waiting" or completed != items - 2:
                    violations.append(
                        Violation(
                            "release",
                            f"round {n}: the callback was {early} after {completed} of"
                            f" {items - 2} completions",
                        )
                    )
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
                        answers.append(_complete_one(own, lease, uuid.uuid4().hex).status_code)

                threads = [threading.Thread(target=finish, args=(lease,)) for lease in last]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join(timeout=60)
                if answers != [200, 200]:
                    violations.append(Violation("release", f"round {n}: answered {answers}"))
            else:
                with httpx.Client(base_url=cluster.base_url, headers=headers, timeout=30) as c:
                    _complete_one(c, last[0], uuid.uuid4().hex).raise_for_status()
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
    metrics["completions_per_s"] = rates
    metrics["first_and_last_tenth_per_s"] = ends
    metrics["held_snapshot_round"] = rounds if hold_snapshot else None
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
