"""Application clock skew: the API process runs under ``faketime`` (its wall clock
hours ahead or behind; its monotonic clock left alone, as on a real machine whose
clock is wrong) and no lease decision changes, because time comes from the
database.

Per skew: the API's own ``Date`` header proves the skew took effect; a lease
acquired with a 2 s TTL expires after 2 s of real time (a completion after 2.5 s
is refused, and another worker can take the item with a higher fence); a
heartbeat within the TTL is accepted and keeps the lease; a delayed item is not
handed out early; and the times in answers (``lease_expires_at``,
``created_at``) are the database's, not the skewed clock's.
"""

from __future__ import annotations

import shutil
import time
import uuid
from datetime import datetime
from email.utils import parsedate_to_datetime

import httpx

from reliability.checkers import CheckReport, Violation
from reliability.cluster import Cluster, say
from reliability.debian import ensure_packages
from reliability.history import JSONValue
from reliability.scenarios import FAST_API_ENV, ScenarioOutcome

__all__ = ["clock_skew", "faketime_available"]

#: A time in an answer may differ from the real clock by this much.
TOLERANCE = 1.5


def faketime_available() -> bool:
    return shutil.which("faketime") is not None


def _parse(value: object) -> float | None:
    if not isinstance(value, str):
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _one_skew(
    cluster: Cluster, skew: str, worker_key: str
) -> tuple[dict[str, JSONValue], list[str]]:
    problems: list[str] = []
    seen: dict[str, JSONValue] = {}
    base = "/v1/tenants/skew/queues/q"
    with httpx.Client(
        base_url=cluster.base_url,
        headers={"Authorization": f"Bearer {worker_key}"},
        timeout=10,
    ) as http:

        def enqueue(payload: JSONValue, delay: float = 0) -> str:
            answer = http.post(
                f"{base}/items",
                json={"payload": payload, "delay": delay},
                headers={"Idempotency-Key": uuid.uuid4().hex},
            )
            answer.raise_for_status()
            created = _parse(answer.json().get("created_at"))
            if created is None or abs(created - time.time()) > TOLERANCE:
                problems.append(f"created_at {answer.json().get('created_at')} is not now")
            return str(answer.json()["item_id"])

        def acquire(worker: str, ttl: float = 2) -> list[dict[str, JSONValue]]:
            answer = http.post(f"{base}/leases", json={"worker": worker, "lease_ttl": ttl})
            answer.raise_for_status()
            leases: list[dict[str, JSONValue]] = answer.json()["leases"]
            return leases

        def holder(item: str, action: str, body: dict[str, JSONValue]) -> httpx.Response:
            headers = {} if action == "heartbeat" else {"Idempotency-Key": uuid.uuid4().hex}
            return http.post(f"/v1/tenants/skew/items/{item}/{action}", json=body, headers=headers)

        probe = http.get("/v1/tenants/skew/queues")
        api_date = parsedate_to_datetime(probe.headers["date"]).timestamp()
        seen["api_clock_offset_s"] = round(api_date - time.time())

        # A: a 2 s lease, left alone for 2.5 s of real time, then completed: refused.
        item_a = enqueue({"case": "expires"})
        lease_a = acquire("wA")
        granted = time.time()
        if len(lease_a) != 1 or lease_a[0]["item_id"] != item_a:
            problems.append(f"acquire A: {lease_a}")
            return seen, problems
        expires = _parse(lease_a[0].get("lease_expires_at"))
        if expires is None or abs(expires - (granted + 2)) > TOLERANCE:
            problems.append(
                f"lease_expires_at {lease_a[0].get('lease_expires_at')} is not now + 2 s"
            )
        seen["lease_expires_in_s"] = None if expires is None else round(expires - granted, 2)
        fence_a = int(str(lease_a[0]["fence"]))
        time.sleep(2.5)
        late = holder(item_a, "complete", {"worker": "wA", "fence": fence_a, "result": {}})
        seen["complete_after_2_5s"] = f"{late.status_code} {late.json().get('code', '')}".strip()
        if late.status_code != 409:
            problems.append(f"a completion 2.5 s into a 2 s lease got {late.status_code}")
        again = acquire("wB", ttl=30)
        refenced = [lease for lease in again if lease["item_id"] == item_a]
        seen["reacquired_with_fence"] = int(str(refenced[0]["fence"])) if refenced else None
        if not refenced or int(str(refenced[0]["fence"])) <= fence_a:
            problems.append(
                f"the expired item was not handed out again with a higher fence: {again}"
            )
        for lease in again:
            holder(
                str(lease["item_id"]),
                "complete",
                {"worker": "wB", "fence": lease["fence"], "result": {}},
            )

        # B: a heartbeat within the TTL is accepted and keeps the lease past the first TTL.
        item_b = enqueue({"case": "heartbeat"})
        lease_b = acquire("wC")
        if len(lease_b) != 1 or lease_b[0]["item_id"] != item_b:
            problems.append(f"acquire B: {lease_b}")
            return seen, problems
        fence_b = int(str(lease_b[0]["fence"]))
        time.sleep(1.0)
        beat = holder(item_b, "heartbeat", {"worker": "wC", "fence": fence_b, "lease_ttl": 2})
        seen["heartbeat_at_1s"] = beat.status_code
        if beat.status_code != 200:
            problems.append(f"a heartbeat 1 s into a 2 s lease got {beat.status_code}")
        time.sleep(1.5)  # 2.5 s after the acquire, 1.5 s after the heartbeat
        done = holder(item_b, "complete", {"worker": "wC", "fence": fence_b, "result": {}})
        seen["complete_after_heartbeat"] = done.status_code
        if done.status_code != 200:
            problems.append(f"a completion within the heartbeat's TTL got {done.status_code}")

        # C: a delayed item is not handed out before its delay (in real time).
        item_c = enqueue({"case": "delayed"}, delay=2)
        early = [lease for lease in acquire("wD") if lease["item_id"] == item_c]
        time.sleep(2.5)
        later = [lease for lease in acquire("wD") if lease["item_id"] == item_c]
        seen["delayed_item_early_then_later"] = [len(early), len(later)]
        if early or not later:
            problems.append(f"a 2 s delay: {len(early)} early, {len(later)} after 2.5 s")
        for lease in later:
            holder(item_c, "complete", {"worker": "wD", "fence": lease["fence"], "result": {}})
    return seen, problems


def clock_skew(
    *, skews: tuple[str, ...] = ("+2h", "-1h"), name: str = "clock skew (faketime)"
) -> ScenarioOutcome:
    """The API under faketime (hours ahead, then behind): no lease decision changes."""
    began = time.monotonic()
    violations: list[Violation] = []
    metrics: dict[str, JSONValue] = {}
    missing = ensure_packages("faketime")
    if missing is not None or not faketime_available():
        why = missing or "not on PATH after installing it"
        violations.append(Violation("harness", f"faketime is not available: {why}"))
        metrics["faketime"] = "not installed"
    else:
        env = {**FAST_API_ENV, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
        with Cluster(name="skew", api_env=env) as cluster:
            keys = cluster.create_tenant("skew", max_concurrency=4)
            for skew in skews:
                cluster.stop_api()
                cluster.api_prefix = ["faketime", "-f", skew]
                cluster.start_api()
                seen, problems = _one_skew(cluster, skew, keys.worker)
                metrics[f"skew {skew}"] = seen
                say(f"{name}: {skew}: {seen}")
                offset = seen.get("api_clock_offset_s")
                wanted = int(skew[:-1]) * {"h": 3600, "m": 60, "s": 1}[skew[-1]]
                if not isinstance(offset, int) or abs(offset - wanted) > 5:
                    problems.append(f"the API's clock is off by {offset} s, not {wanted} s")
                violations += [Violation("clock-skew", f"{skew}: {p}") for p in problems]
    by_checker: dict[str, int] = {"clock-skew": 0}
    for violation in violations:
        by_checker[violation.checker] = by_checker.get(violation.checker, 0) + 1
    report = CheckReport(
        scenario=name,
        operations=sum(10 for _ in skews),
        faults_injected=len(skews),
        lost=0,
        duplicated=0,
        violations=tuple(violations),
        by_checker=by_checker,
    )
    return ScenarioOutcome(report, time.monotonic() - began, metrics)
