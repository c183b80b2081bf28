"""Probes of a live deployment's envelope: `queue-server policy verify --server URL`.

With an admin key, on scratch tenants it creates and deletes again, each probe asks the
server for something just above a cell of the policy it serves (GET /v1/policy) and
checks the refusal names the cell, then asks for the cell's value and checks it is
granted within it. The authority probes present a stale fence, another worker's name and
an expired lease to complete, batch complete and triage, and expect each refused with its
code (then the holder's own call accepted); the backlog cap, the outbox cap and the spend
approval ceiling are probed on tenants of their own. A probe the server cannot answer
(it predates the mechanism) is reported skipped, with the reason. No test files: it runs
from an installed package.
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from queue_server.client.connection import HttpClient, Response, connect
from queue_server.policy import PolicyError, ReliabilityPolicy, load_policy
from queue_server.policy.model import Dimension, OperationClass, cell_name

# The server's and this machine's clocks may differ a little; deadlines are compared
# on the server's own timestamps, so only rounding needs room.
SLACK = 1.0


# Long enough to read a refusal in, short enough to wait out: the shortest TTL the API takes.
SHORT_TTL = 1.0
LW = OperationClass.DURABLE_LEASED_WORK
FENCING = cell_name(LW, Dimension.IDEMPOTENCY_AND_FENCING)
EXPIRY = cell_name(LW, Dimension.ATTEMPT_TIMEOUT)
OUTBOX = cell_name(OperationClass.WATCHER_DELIVERY, Dimension.BACKPRESSURE)


@dataclass(frozen=True)
class Probe:
    name: str
    cell: str
    ok: bool
    detail: str
    # Not run: the server cannot answer it (`detail` says why); it fails nothing.
    skipped: bool = False


@dataclass
class ProbeReport:
    server: str
    version: str = ""
    digest: str = ""
    probes: list[Probe] = field(default_factory=list)
    # The first scratch tenant; `tenants` has every one, and whether it was deleted.
    tenant: str = ""
    tenants: dict[str, bool] = field(default_factory=dict)

    @property
    def cleaned_up(self) -> bool:
        return all(self.tenants.values())

    @property
    def passed(self) -> bool:
        return bool(self.probes) and all(p.ok or p.skipped for p in self.probes) and self.cleaned_up

    def as_dict(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "passed": self.passed,
            "version": self.version,
            "digest": self.digest,
            "tenant": self.tenant,
            "tenants": sorted(self.tenants),
            "cleaned_up": self.cleaned_up,
            "probes": [p.__dict__ for p in self.probes],
        }


def _time(value: Any) -> datetime:
    return datetime.fromisoformat(str(value))


class _Session:
    def __init__(self, http: HttpClient, tenant: str, report: ProbeReport) -> None:
        self.http = http
        self.tenant = tenant
        self.report = report
        self.worker: dict[str, str] = {}
        self.operator: dict[str, str] = {}

    def check(self, name: str, cell: str, ok: bool, detail: str) -> None:
        self.report.probes.append(Probe(name, cell, ok, detail))

    def skip(self, name: str, cell: str, reason: str) -> None:
        self.report.probes.append(Probe(name, cell, False, reason, skipped=True))

    def problem(self, name: str, cell: str, response: Response, status: int, code: str) -> None:
        """The answer is `status` with the problem `code`."""
        self.check(name, cell, _code(response) == (status, code), _expected(status, code, response))

    def refused(self, name: str, cell: str, response: Response, field_name: str) -> None:
        """A 422 invalid-request whose errors name `field_name` and `cell`."""
        try:
            body = response.json()
        except ValueError:
            body = {}
        errors = body.get("errors") or []
        named = any(
            e.get("cell") == cell and e.get("loc", [None])[-1] == field_name for e in errors
        )
        ok = response.status_code == 422 and body.get("code") == "invalid-request" and named
        got = f"{response.status_code} {body.get('code', '')}".strip()
        self.check(name, cell, ok, f"expected 422 invalid-request naming {cell}, got {got}")

    def post(self, path: str, role: str, body: Any, *, key: bool = True) -> Response:
        headers = dict(self.worker if role == "worker" else self.operator)
        if key:
            headers["Idempotency-Key"] = uuid.uuid4().hex
        return self.http.post(f"/v1/tenants/{self.tenant}{path}", json=body, headers=headers)

    def get(self, path: str) -> Response:
        return self.http.get(f"/v1/tenants/{self.tenant}{path}", headers=self.operator)


def _body(response: Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _code(response: Response) -> tuple[int, str]:
    return response.status_code, str(_body(response).get("code", ""))


def _expected(status: int, code: str, response: Response) -> str:
    got = " ".join(str(part) for part in _code(response) if part)
    return f"expected {status} {code}, got {got}"


def _probes(s: _Session, policy: ReliabilityPolicy) -> None:
    leased = policy.leased_work
    retry, ttl_cell = leased.cell("attempt_cap"), leased.cell("attempt_timeout")
    cap, ttl_max = leased.attempt_cap, leased.attempt_timeout
    tenant_path = f"/v1/tenants/{s.tenant}"
    s.refused(
        "tenant default budget above the attempt cap",
        retry,
        s.http.put(tenant_path, json={"backlog_cap": 10, "default_max_acquisitions": cap + 1}),
        "default_max_acquisitions",
    )
    s.refused(
        "tenant default lease TTL above the attempt timeout",
        ttl_cell,
        s.http.put(tenant_path, json={"backlog_cap": 10, "default_lease_ttl": ttl_max + 1}),
        "default_lease_ttl",
    )
    s.refused(
        "an item's budget above the attempt cap",
        retry,
        s.post("/queues/probe/items", "worker", {"payload": 1, "max_acquisitions": cap + 1}),
        "max_acquisitions",
    )
    item = s.post("/queues/probe/items", "worker", {"payload": 1, "max_acquisitions": cap})
    s.check(
        "an item's budget at the attempt cap is admitted",
        retry,
        item.status_code == 201,
        f"got {item.status_code}",
    )
    leases = "/queues/probe/leases"
    s.refused(
        "a lease TTL above the attempt timeout",
        ttl_cell,
        s.post(leases, "worker", {"worker": "probe", "lease_ttl": ttl_max + 1}, key=False),
        "lease_ttl",
    )
    got = s.post(leases, "worker", {"worker": "probe", "lease_ttl": ttl_max}, key=False)
    handed = got.json().get("leases", []) if got.status_code == 200 else []
    if not handed:
        s.check("a lease at the attempt timeout", ttl_cell, False, f"got {got.status_code}")
        return
    lease = handed[0]
    item_id, fence = lease["item_id"], lease["fence"]
    # The server's own clock: the lease began at expiry - TTL.
    began = _time(lease["lease_expires_at"]).timestamp() - min(ttl_max, leased.deadline)
    life = _time(lease["lease_deadline_at"]).timestamp() - began
    s.check(
        "a lease lives at most the class deadline from its acquisition",
        leased.cell("deadline"),
        life <= leased.deadline + SLACK,
        f"lease_deadline_at is {life:.0f}s after the acquisition (deadline {leased.deadline:g}s)",
    )
    beat = s.post(
        f"/items/{item_id}/heartbeat",
        "worker",
        {"worker": "probe", "fence": fence, "lease_ttl": ttl_max + 1},
        key=False,
    )
    s.refused("a heartbeat TTL above the attempt timeout", ttl_cell, beat, "lease_ttl")
    s.refused(
        "a requeue delay above the backoff cap",
        leased.cell("backoff_cap"),
        s.post(
            f"/items/{item_id}/requeue",
            "worker",
            {"worker": "probe", "fence": fence, "delay": leased.backoff_cap + 1},
        ),
        "delay",
    )
    _verification_probes(s, policy)
    _approval_probes(s, policy)
    _authority_probes(s, policy)
    receipts = s.http.get(
        f"{tenant_path}/receipts", params={"state": "pending"}, headers=s.operator
    )
    stale_after = receipts.json().get("stale_after") if receipts.status_code == 200 else None
    s.check(
        "a pending receipt is stale after the confirmed-mutation deadline",
        policy.mutation.cell("deadline"),
        stale_after == policy.mutation.deadline,
        f"stale_after {stale_after} (deadline {policy.mutation.deadline:g}s)",
    )


def _verification_probes(s: _Session, policy: ReliabilityPolicy) -> None:
    runs = "/verification-runs"
    verification = policy.verification
    first = s.post(
        runs, "worker", {"artifact_version": "a", "verifier_version": "probe", "items": ["x"]}
    )
    if first.status_code != 201:
        s.check("a verification run starts", verification.cell("deadline"), False, first.text)
        return
    run = first.json()
    life = _time(run["deadline_at"]).timestamp() - _time(run["created_at"]).timestamp()
    s.check(
        "a verification run ends at most the class deadline after its start",
        verification.cell("deadline"),
        life <= verification.deadline + SLACK,
        f"deadline_at is {life:.0f}s after the start (deadline {verification.deadline:g}s)",
    )
    second_body = {"artifact_version": "b", "verifier_version": "probe", "items": ["x"]}
    busy = s.post(runs, "worker", second_body)
    s.check(
        "a second verification run waits for the first",
        verification.cell("concurrency"),
        busy.status_code == 409 and busy.json().get("code") == "verification-run-busy",
        f"got {busy.status_code}",
    )
    abandoned = s.post(f"{runs}/{run['run_id']}:abandon", "operator", {"reason": "probe"})
    after = s.post(runs, "worker", second_body)
    s.check(
        "an abandoned run blocks nothing",
        verification.cell("concurrency"),
        abandoned.status_code == 200 and after.status_code == 201,
        f"abandon {abandoned.status_code}, next run {after.status_code}",
    )


def _approval_probes(s: _Session, policy: ReliabilityPolicy) -> None:
    leased = policy.leased_work
    cell = leased.cell("max_approved")
    path = "/queues/approvals/spend-approvals"
    expires = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    body = {"expires_at": expires, "reason": "policy verify probe"}
    s.refused(
        "a spend approval above max-approved",
        cell,
        s.post(path, "operator", {**body, "max_concurrency": leased.max_approved + 1}),
        "max_concurrency",
    )
    if leased.max_approved >= 2:  # an approval raises the limit from 1: it asks for 2 or more
        at = s.post(path, "operator", {**body, "max_concurrency": leased.max_approved})
        s.check(
            "a spend approval at max-approved is granted",
            cell,
            at.status_code == 201,
            f"got {at.status_code}",
        )


# Each holder route the authority probes present a lease to, by its name in the report.
_ROUTES = ("complete", "batch complete", "triage")


def _holder_call(s: _Session, route: str, item_id: str, worker: str, fence: int) -> tuple[int, str]:
    """The answer to one holder operation: its status and problem code (batch: its entry's)."""
    if route == "complete":
        body: dict[str, Any] = {"worker": worker, "fence": fence, "result": {"probe": True}}
        return _code(s.post(f"/items/{item_id}/complete", "worker", body))
    if route == "batch complete":
        entry = {"item_id": item_id, "fence": fence, "result": {"probe": True}}
        answer = s.post("/completions", "worker", {"worker": worker, "completions": [entry]})
        results = _body(answer).get("results") or []
        if answer.status_code != 200 or not results:
            return _code(answer)
        problem = results[0].get("problem") or {}
        return int(results[0].get("status", 0)), str(problem.get("code", ""))
    failure = {"class": "PolicyVerifyProbe", "message": "a probe", "transient": True}
    body = {"worker": worker, "fence": fence, "failure": failure, "decision": "requeue"}
    return _code(s.post(f"/items/{item_id}/triage", "worker", body))


def _acquire(s: _Session, queue: str, ttl: float) -> dict[str, Any] | None:
    got = s.post(
        f"/queues/{queue}/leases", "worker", {"worker": "probe", "lease_ttl": ttl}, key=False
    )
    handed = _body(got).get("leases") or []
    return handed[0] if got.status_code == 200 and handed else None


def _authority_probes(s: _Session, policy: ReliabilityPolicy) -> None:
    """On each holder route: an expired lease, a stale fence and another worker's name are
    refused with their codes; the holder with its current fence is then accepted."""
    ttl = min(SHORT_TTL, policy.leased_work.attempt_timeout)
    first: dict[str, dict[str, Any]] = {}
    for route in _ROUTES:  # one queue each: without an approval a queue leases one at a time
        queue = "authority-" + route.replace(" ", "-")
        made = s.post(f"/queues/{queue}/items", "worker", {"payload": {"probe": route}})
        lease = _acquire(s, queue, ttl) if made.status_code == 201 else None
        if lease is None:
            s.check(
                f"{route}: a lease to probe with", FENCING, False, f"enqueue {made.status_code}"
            )
            return
        first[route] = {**lease, "queue": queue}
    # Past every expiry by the server's clock: each lease began before its answer arrived.
    time.sleep(ttl + 0.25)
    for route, lease in first.items():
        got = _holder_call(s, route, lease["item_id"], "probe", lease["fence"])
        s.check(
            f"{route} by the holder of an expired lease is refused",
            EXPIRY,
            got == (409, "lease-expired"),
            f"expected 409 lease-expired, got {' '.join(map(str, got))}",
        )
    for route, old in first.items():
        lease = _acquire(s, old["queue"], policy.leased_work.attempt_timeout)
        if lease is None or lease["fence"] <= old["fence"]:
            s.check(f"{route}: an expired lease is taken over", FENCING, False, f"got {lease}")
            continue
        answers = {
            "a stale fence": (
                _holder_call(s, route, old["item_id"], "probe", old["fence"]),
                "stale-fence",
            ),
            "another worker's name": (
                _holder_call(s, route, lease["item_id"], "probe-other", lease["fence"]),
                "not-lease-holder",
            ),
        }
        for what, (got, code) in answers.items():
            s.check(
                f"{route} with {what} is refused",
                FENCING,
                got == (409, code),
                f"expected 409 {code}, got {' '.join(map(str, got))}",
            )
        got = _holder_call(s, route, lease["item_id"], "probe", lease["fence"])
        s.check(
            f"{route} by the holder with its current fence is accepted",
            FENCING,
            got[0] == 200,
            f"expected 200, got {' '.join(map(str, got))}",
        )


def _backlog_probes(http: HttpClient, report: ProbeReport, policy: ReliabilityPolicy) -> None:
    leased = policy.leased_work
    cell = leased.cell("backlog_cap")
    with _scratch_tenant(http, report, backlog_cap=2) as s:
        admitted = [s.post("/queues/backlog/items", "worker", {"payload": n}) for n in range(2)]
        over = s.post("/queues/backlog/items", "worker", {"payload": 2})
        s.check(
            "an enqueue past the tenant's backlog cap is refused",
            cell,
            [a.status_code for a in admitted] == [201, 201]
            and _code(over) == (429, "backlog-cap-reached"),
            f"at a cap of 2: {[a.status_code for a in admitted]}, then"
            f" {_expected(429, 'backlog-cap-reached', over)}",
        )
        s.refused(
            "a tenant backlog cap above max-queued",
            cell,
            http.put(f"/v1/tenants/{s.tenant}", json={"backlog_cap": leased.backlog_cap + 1}),
            "backlog_cap",
        )


def _backlogged(watcher: dict[str, Any]) -> bool:
    return watcher.get("backlogged") is True or watcher.get("state") == "backlogged"


def _outbox_cap_probe(
    http: HttpClient, report: ProbeReport, policy: ReliabilityPolicy, url: str
) -> None:
    """At most watcher-delivery/backpressure max-queued pending deliveries per watcher; the
    watcher flooded past it shows `backlogged`."""
    name = "a watcher flooded past the outbox cap keeps at most the cap pending, backlogged"
    cap = policy.delivery.outbox_cap
    flood = cap + 50
    schemas = _body(http.get("/openapi.json")).get("components", {}).get("schemas", {})
    if "backlogged" not in json.dumps(schemas.get("WatcherOut", {})):
        why = "this server's watchers carry no `backlogged` mark: it predates the outbox cap"
        report.probes.append(Probe(name, OUTBOX, False, why, skipped=True))
        return
    if flood > policy.leased_work.backlog_cap:
        why = f"a flood of {flood} events does not fit a tenant's backlog cap"
        report.probes.append(Probe(name, OUTBOX, False, why, skipped=True))
        return
    # The discard port of the server's own host: an attempt fails and waits out its backoff.
    target = f"http://{urlsplit(url).hostname}:9/policy-verify-outbox-probe"
    with _scratch_tenant(http, report, backlog_cap=flood) as s:
        events = {"url": target, "events": ["item.enqueued"], "queues": ["outbox"]}
        created = s.post("/watchers", "operator", events)
        if _code(created) == (422, "target-refused"):
            s.skip(
                name,
                OUTBOX,
                f"the server refuses a watcher at {target} (its SSRF policy);"
                " allow the host with QUEUE_SERVER_TRANSPORT_ALLOW to probe the outbox cap",
            )
            return
        if created.status_code != 201:
            s.check(name, OUTBOX, False, f"registering the watcher: {created.status_code}")
            return
        watcher_id = _body(created)["watcher_id"]
        for start in range(0, flood, 500):
            items = [{"payload": n} for n in range(start, min(flood, start + 500))]
            s.post("/queues/outbox/items:batch", "worker", {"items": items})
        watcher = _body(s.get(f"/watchers/{watcher_id}"))
        pending = (watcher.get("deliveries") or {}).get("pending")
        s.check(
            name,
            OUTBOX,
            isinstance(pending, int) and pending <= cap and _backlogged(watcher),
            f"{flood} events: {pending} pending (cap {cap}),"
            f" {'' if _backlogged(watcher) else 'not '}backlogged",
        )


@contextmanager
def _scratch_tenant(
    http: HttpClient, report: ProbeReport, *, backlog_cap: int = 10
) -> Iterator[_Session]:
    tenant = f"policy-verify-{secrets.token_hex(4)}"
    report.tenant = report.tenant or tenant
    created = http.put(f"/v1/tenants/{tenant}", json={"backlog_cap": backlog_cap})
    created.raise_for_status()
    report.tenants[tenant] = False
    session = _Session(http, tenant, report)
    try:
        for role in ("worker", "operator"):
            key = http.post(f"/v1/tenants/{tenant}/keys", json={"role": role})
            key.raise_for_status()
            headers = {"Authorization": f"Bearer {key.json()['secret']}"}
            if role == "worker":
                session.worker = headers
            else:
                session.operator = headers
        yield session
    finally:
        deleted = http.delete(f"/v1/tenants/{tenant}")
        report.tenants[tenant] = deleted.status_code == 204


def probe_server(
    url: str,
    admin_key: str,
    *,
    timeout: float = 10.0,
) -> ProbeReport:
    """Probe the server at `url` against the policy it serves; the scratch tenant is deleted."""
    report = ProbeReport(server=url)
    headers = {"Authorization": f"Bearer {admin_key}", "User-Agent": "queue-server-policy-verify"}
    http = connect(url.rstrip("/"), timeout=timeout)
    http.headers.update(headers)
    with http:
        served = http.get("/v1/policy")
        served.raise_for_status()
        document = served.json()
        loaded = document.pop("loaded", {})
        report.version = str(loaded.get("version", document.get("policy", "")))
        report.digest = str(loaded.get("digest", ""))
        try:
            policy = load_policy(document)
        except PolicyError as error:
            for cell, reason in error.problems:
                report.probes.append(Probe("the served policy", cell, False, reason))
            return report
        report.probes.append(
            Probe("the served policy is total and inside the envelope", "policy", True, "")
        )
        with _scratch_tenant(http, report) as session:
            _probes(session, policy)
        _backlog_probes(http, report, policy)
        _outbox_cap_probe(http, report, policy, url)
    return report
