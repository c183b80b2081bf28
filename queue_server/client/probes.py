"""Probes of a live deployment's envelope: `queue-server policy verify --server URL`.

With an admin key, on a scratch tenant it creates and deletes again, each probe asks the
server for something just above a cell of the policy it serves (GET /v1/policy) and
checks the refusal names the cell, then asks for the cell's value and checks it is
granted within it. No test files: it runs from an installed package.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from queue_server.client.transport import HttpClient, Response, connect
from queue_server.policy import PolicyError, ReliabilityPolicy, load_policy

# The server's and this machine's clocks may differ a little; deadlines are compared
# on the server's own timestamps, so only rounding needs room.
SLACK = 1.0


@dataclass(frozen=True)
class Probe:
    name: str
    cell: str
    ok: bool
    detail: str


@dataclass
class ProbeReport:
    server: str
    version: str = ""
    digest: str = ""
    probes: list[Probe] = field(default_factory=list)
    tenant: str = ""
    cleaned_up: bool = False

    @property
    def passed(self) -> bool:
        return bool(self.probes) and all(p.ok for p in self.probes) and self.cleaned_up

    def as_dict(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "passed": self.passed,
            "version": self.version,
            "digest": self.digest,
            "tenant": self.tenant,
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


@contextmanager
def _scratch_tenant(http: HttpClient, report: ProbeReport) -> Iterator[_Session]:
    tenant = f"policy-verify-{secrets.token_hex(4)}"
    report.tenant = tenant
    created = http.put(f"/v1/tenants/{tenant}", json={"backlog_cap": 10})
    created.raise_for_status()
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
        report.cleaned_up = deleted.status_code == 204


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
            report.cleaned_up = True
            return report
        report.probes.append(
            Probe("the served policy is total and inside the envelope", "policy", True, "")
        )
        with _scratch_tenant(http, report) as session:
            _probes(session, policy)
    return report
