"""A random graph of dependent items run by several worker processes: every node after all its
dependencies, and a node's failure cancelling exactly its descendants, checked from the
ledgers.

`nodes` items are enqueued in order, each depending on up to three earlier ones (so the
graph has no cycle); a few are poisoned: their worker sends them to dead letters. Four
worker processes then acquire and settle as fast as they can, through an API served by two
processes, until no item is waiting, ready or leased. Checkers, from the database:
`order` (each completed node's first lease came after the completion of each of its
dependencies, by the database's clock), `outcome` (a poisoned node is a dead letter, its
descendants are cancelled, every other node completed once), `ledger` (the tenant's ledgers
fold to their rows).
"""

from __future__ import annotations

import multiprocessing
import random
import time
import uuid
from typing import Any

import httpx

from reliability.checkers import CheckReport, Violation
from reliability.cluster import Cluster, say
from reliability.history import JSONValue
from reliability.scenarios import ScenarioOutcome

TENANT = "dag"
QUEUE = "steps"
WORKERS = 4
UNFINISHED = ("waiting", "ready", "leased")


def _ready(_: int) -> bool:
    time.sleep(0.1)  # long enough that every process of the pool takes one
    return True


def _work(url: str, key: str, worker: str, until: float, stop: Any) -> int:
    """One worker process: acquire (a short long poll), settle: complete, or triage a
    poisoned node to dead letters."""
    settled = 0
    with httpx.Client(
        base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as client:
        while time.time() < until and not stop.is_set():
            answer = client.post(
                f"/v1/tenants/{TENANT}/queues/{QUEUE}/leases",
                json={"worker": worker, "lease_ttl": 30, "max_items": 5, "wait": 0.5},
            )
            if answer.status_code != 200:
                continue
            for lease in answer.json()["leases"]:
                item, fence = lease["item_id"], lease["fence"]
                if lease["payload"].get("poison"):
                    body: dict[str, Any] = {
                        "worker": worker, "fence": fence, "decision": "quarantine",
                        "failure": {"class": "Poisoned", "message": "this node fails"},
                    }  # fmt: skip
                    action = "triage"
                else:
                    body, action = {"worker": worker, "fence": fence, "result": 1}, "complete"
                client.post(
                    f"/v1/tenants/{TENANT}/items/{item}/{action}",
                    json=body,
                    headers={"Idempotency-Key": uuid.uuid4().hex},
                ).raise_for_status()
                settled += 1
    return settled


def graph(nodes: int, poisoned: int, seed: int) -> tuple[list[list[int]], set[int]]:
    """Each node's dependencies (up to three earlier nodes), and the poisoned nodes."""
    rng = random.Random(seed)
    deps = [sorted(set(rng.sample(range(i), min(i, rng.randint(0, 3))))) for i in range(nodes)]
    # Poisoned: nodes past the first third that something depends on, so that each failure
    # has descendants to cancel, and not most of the graph.
    depended = {d for mine in deps for d in mine}
    candidates = [i for i in range(nodes // 3, nodes) if i in depended]
    return deps, set(rng.sample(candidates, min(poisoned, len(candidates))))


def descendants(deps: list[list[int]], roots: set[int]) -> set[int]:
    """Every node that depends, directly or not, on one of `roots`."""
    found: set[int] = set()
    for i, mine in enumerate(deps):  # in order: a node's dependencies come before it
        if any(d in roots or d in found for d in mine):
            found.add(i)
    return found


def workflow_dag(
    *, name: str = "workflow dag", nodes: int = 1000, poisoned: int = 10, seed: int = 46
) -> ScenarioOutcome:
    """A random DAG of `nodes` items run by four worker processes; checked from the ledgers."""
    began = time.monotonic()
    violations: list[Violation] = []
    deps, poison = graph(nodes, poisoned, seed)
    cancelled_expected = descendants(deps, poison) - poison
    metrics: dict[str, JSONValue] = {
        "nodes": nodes,
        "edges": sum(len(d) for d in deps),
        "poisoned": len(poison),
        "descendants_of_poisoned": len(cancelled_expected),
    }
    with Cluster(name="dag", api_args=["--workers", "2"]) as cluster:
        keys = cluster.create_tenant(
            TENANT, backlog_cap=max(10_000, nodes), max_concurrency=50, queues=(QUEUE,)
        )
        say(f"{name}: {nodes} nodes, {metrics['edges']} edges, {len(poison)} poisoned")
        ids: list[str] = []
        with httpx.Client(
            base_url=cluster.base_url,
            headers={"Authorization": f"Bearer {keys.worker}"},
            timeout=30,
        ) as http:
            for i, mine in enumerate(deps):
                body: dict[str, Any] = {"payload": {"node": i, "poison": i in poison}}
                if mine:
                    body["depends_on"] = [ids[d] for d in mine]
                made = http.post(
                    f"/v1/tenants/{TENANT}/queues/{QUEUE}/items",
                    json=body,
                    headers={"Idempotency-Key": uuid.uuid4().hex},
                )
                made.raise_for_status()
                ids.append(made.json()["item_id"])
        node_of = {item_id: i for i, item_id in enumerate(ids)}
        ctx = multiprocessing.get_context("spawn")
        stop = ctx.Manager().Event()
        with ctx.Pool(WORKERS) as pool:
            assert pool.map(_ready, range(WORKERS * 2)) == [True] * (WORKERS * 2)
            started = time.monotonic()
            until = time.time() + 300
            running = pool.starmap_async(
                _work,
                [(cluster.base_url, keys.worker, f"w{n}", until, stop) for n in range(WORKERS)],
            )
            while not running.ready():
                with cluster.db() as conn:
                    row = conn.execute(
                        "SELECT count(*) AS n FROM work_items WHERE tenant_id = %s"
                        " AND state::text = ANY(%s)",
                        (TENANT, list(UNFINISHED)),
                    ).fetchone()
                if row is not None and row["n"] == 0:
                    stop.set()
                time.sleep(0.2)
            settled = sum(running.get())
        metrics["seconds_to_drain"] = round(time.monotonic() - started, 1)
        metrics["settled"] = settled
        with cluster.db() as conn:
            states = {
                str(r["item_id"]): r["state"]
                for r in conn.execute(
                    "SELECT item_id, state::text AS state FROM work_items WHERE tenant_id = %s",
                    (TENANT,),
                ).fetchall()
            }
            events = conn.execute(
                "SELECT item_id, kind, at FROM item_events WHERE tenant_id = %s"
                " AND kind IN ('acquired', 'completed') ORDER BY at, seq",
                (TENANT,),
            ).fetchall()
        first_lease: dict[int, Any] = {}
        completed_at: dict[int, Any] = {}
        completions: dict[int, int] = {}
        for event in events:
            node = node_of[str(event["item_id"])]
            if event["kind"] == "acquired":
                first_lease.setdefault(node, event["at"])
            else:
                completed_at[node] = event["at"]
                completions[node] = completions.get(node, 0) + 1
        wrong_order = [
            (i, d)
            for i in completed_at
            for d in deps[i]
            if d not in completed_at or first_lease[i] < completed_at[d]
        ]
        if wrong_order:
            i, d = wrong_order[0]
            violations.append(
                Violation(
                    "order",
                    f"{len(wrong_order)} leases before a dependency's completion,"
                    f" first: node {i} before node {d}",
                )
            )
        expected = {
            i: "quarantined" if i in poison else "cancelled" if i in cancelled_expected
            else "completed"
            for i in range(nodes)
        }  # fmt: skip
        wrong = [i for i in range(nodes) if states[ids[i]] != expected[i]]
        if wrong:
            i = wrong[0]
            violations.append(
                Violation(
                    "outcome",
                    f"{len(wrong)} nodes in the wrong state, first: node {i}"
                    f" {states[ids[i]]}, expected {expected[i]}",
                )
            )
        twice = [i for i, n in completions.items() if n > 1]
        if twice:
            violations.append(Violation("outcome", f"{len(twice)} nodes completed twice"))
        mismatches = cluster.admin_client().get(f"/v1/tenants/{TENANT}/ledger-verification")
        folded = mismatches.json().get("mismatches", []) if mismatches.is_success else ["?"]
        if folded:
            violations.append(Violation("ledger", f"{len(folded)} ledgers do not fold"))
        metrics["completed"] = sum(1 for s in states.values() if s == "completed")
        metrics["cancelled"] = sum(1 for s in states.values() if s == "cancelled")
    by_checker: dict[str, int] = {}
    for violation in violations:
        by_checker[violation.checker] = by_checker.get(violation.checker, 0) + 1
    report = CheckReport(
        scenario=name,
        operations=nodes,
        faults_injected=len(poison),
        lost=sum(1 for i in range(nodes) if expected[i] == "completed" and i not in completed_at),
        duplicated=len(twice),
        violations=tuple(violations),
        by_checker=by_checker,
    )
    return ScenarioOutcome(report, time.monotonic() - began, metrics)
