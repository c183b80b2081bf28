"""Hostile input against the real server process: bodies far past the limit (with
and without a Content-Length), JSON nested 10,000 deep, NUL characters, lone
surrogates, bytes that are not UTF-8, 100 KB headers, absurd page sizes, cursors
and numbers.

Every case must get a fast 4xx ``application/problem+json`` answer (never a
5xx, never a hang; a body that never fully arrived may get no answer at all),
change no table (a digest of every table before and after
each case), and the API's resident memory must stay bounded (sampled every
20 ms while the cases run). The API must still answer afterwards.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from reliability.checkers import CheckReport, Violation
from reliability.cluster import HOST, SOON, Cluster, say
from reliability.history import JSONValue
from reliability.rawhttp import RawAnswer, chunked, raw_request, repeat_bytes
from reliability.scenarios import FAST_API_ENV, ScenarioOutcome

__all__ = ["HostileCase", "hostile_cases", "hostile_input"]

MB = 1024 * 1024
#: An answer slower than this is not "fast".
FAST_SECONDS = 2.0
#: The API's resident memory may grow by at most this much over its starting size.
RSS_BOUND = 64 * MB
#: After a truncated body, how long to wait before comparing the tables.
TRUNCATED_SETTLE = 0.5


@dataclass(frozen=True)
class HostileCase:
    name: str
    method: str
    #: May contain {tenant}, {item} and {watcher}.
    path: str
    body: bytes | None = None
    #: Wire pieces of a streamed body (chunked or with ``content_length``); built lazily.
    stream: tuple[str, int] | None = None
    content_length: int | None = None
    is_chunked: bool = False
    #: "worker", "operator" or "admin": whose key is sent (unless headers carry one).
    role: str = "worker"
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json"
    idempotent: bool = True
    #: Acceptable statuses (default: any 4xx).
    expect: frozenset[int] | None = None
    #: The client closes its side after the body, which is shorter than it announced:
    #: no answer is acceptable (nobody is left to answer), and so is a 400 problem.
    truncated: bool = False

    def pieces(self) -> bytes | Iterable[bytes]:
        if self.stream is None:
            return self.body or b""
        kind, size = self.stream
        raw = repeat_bytes(size, b'{"payload": "' if kind == "json" else b"x")
        return chunked(raw) if self.is_chunked else raw


def _json(value: object) -> bytes:
    return json.dumps(value).encode()


def _nested(depth: int) -> bytes:
    return b'{"payload": ' + b"[" * depth + b"]" * depth + b"}"


def _nested_objects(depth: int) -> bytes:
    return b'{"payload": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b"}"


def _cursor(parts: list[str]) -> str:
    """A page cursor as the server makes them (base64url of a JSON list), of any parts."""
    return base64.urlsafe_b64encode(json.dumps(parts).encode()).decode().rstrip("=")


def hostile_cases() -> list[HostileCase]:
    enqueue = "/v1/tenants/{tenant}/queues/q/items"
    batch = "/v1/tenants/{tenant}/queues/q/items:batch"
    leases = "/v1/tenants/{tenant}/queues/q/leases"
    complete = "/v1/tenants/{tenant}/items/{item}/complete"
    heartbeat = "/v1/tenants/{tenant}/items/{item}/heartbeat"
    letters = "/v1/tenants/{tenant}/dead-letters"
    big = 10 * MB
    return [
        # -- bodies past the limit
        HostileCase(
            "10 MB body with Content-Length",
            "POST",
            enqueue,
            stream=("json", big),
            content_length=big,
            expect=frozenset({413}),
        ),
        HostileCase(
            "10 MB body, chunked (no length)",
            "POST",
            enqueue,
            stream=("json", big),
            is_chunked=True,
            expect=frozenset({413}),
        ),
        HostileCase(
            "10 MB batch, chunked",
            "POST",
            batch,
            stream=("json", big),
            is_chunked=True,
            expect=frozenset({413}),
        ),
        HostileCase(
            "Content-Length of 10**18 and no body",
            "POST",
            enqueue,
            body=b"",
            content_length=10**18,
            expect=frozenset({413}),
        ),
        HostileCase(
            "10 MB body to a route without a body",
            "GET",
            "/v1/tenants/{tenant}",
            stream=("raw", big),
            content_length=big,
            idempotent=False,
            expect=frozenset({413}),
        ),
        # -- deep nesting
        HostileCase("JSON arrays nested 10,000 deep", "POST", enqueue, body=_nested(10_000)),
        HostileCase(
            "JSON objects nested 10,000 deep", "POST", enqueue, body=_nested_objects(10_000)
        ),
        HostileCase("JSON arrays nested 100,000 deep", "POST", enqueue, body=_nested(100_000)),
        HostileCase(
            "JSON nested 10,000 deep in a completion result",
            "POST",
            complete,
            body=b'{"worker": "w-held", "fence": 1, "result": '
            + b"[" * 10_000
            + b"]" * 10_000
            + b"}",
        ),
        # -- NUL, surrogates, bad bytes
        HostileCase("NUL in a payload string", "POST", enqueue, body=b'{"payload": "a\\u0000b"}'),
        HostileCase("NUL in a payload key", "POST", enqueue, body=b'{"payload": {"a\\u0000": 1}}'),
        HostileCase("raw NUL byte in the body", "POST", enqueue, body=b'{"payload": "a\x00b"}'),
        HostileCase(
            "NUL in a worker name",
            "POST",
            leases,
            body=b'{"worker": "w\\u0000", "lease_ttl": 5}',
            idempotent=False,
        ),
        HostileCase(
            "NUL in a failure message",
            "POST",
            "/v1/tenants/{tenant}/items/{item}/triage",
            body=_json(
                {
                    "worker": "w-held",
                    "fence": 1,
                    "failure": {"class": "x\u0000", "message": "m\u0000", "transient": True},
                    "decision": "requeue",
                }
            ),
        ),
        HostileCase(
            "NUL in the path (queue name)",
            "POST",
            "/v1/tenants/{tenant}/queues/q%00x/items",
            body=b'{"payload": 1}',
        ),
        HostileCase(
            "lone high surrogate in a payload string",
            "POST",
            enqueue,
            body=b'{"payload": "\\ud800"}',
        ),
        HostileCase(
            "lone low surrogate in a payload key",
            "POST",
            enqueue,
            body=b'{"payload": {"\\udfff": 1}}',
        ),
        HostileCase(
            "lone surrogate in a spend-approval reason",
            "POST",
            "/v1/tenants/{tenant}/queues/q/spend-approvals",
            role="operator",
            body=_json(
                {
                    "max_concurrency": 4,
                    "expires_at": SOON,
                    "reason": "\ud800",
                }
            ).replace(b"\\ud800", b"\\ud800"),
        ),
        HostileCase(
            "invalid UTF-8 bytes in the body", "POST", enqueue, body=b'{"payload": "\xff\xfe"}'
        ),
        HostileCase(
            "body that is not JSON",
            "POST",
            enqueue,
            body=b"\x00\x01\x02 not json",
        ),
        HostileCase(
            "JSON body declared as text/plain",
            "POST",
            enqueue,
            body=b'{"payload": 1}',
            content_type="text/plain",
        ),
        # -- bodies that never fully arrive: valid JSON, then the client closes its side
        HostileCase(
            "valid JSON, Content-Length 500 bytes past it, then closed",
            "POST",
            enqueue,
            body=b'{"payload": {"order": 42}}',
            content_length=len(b'{"payload": {"order": 42}}') + 500,
            truncated=True,
        ),
        HostileCase(
            "valid JSON in chunks, the last chunk never sent, then closed",
            "POST",
            enqueue,
            body=b"".join(chunked([b'{"payload": {"order": 42}}']))[: -len(b"0\r\n\r\n")],
            is_chunked=True,
            truncated=True,
        ),
        HostileCase(
            "a completion cut short after its fence",
            "POST",
            complete,
            body=b'{"worker": "w-held", "fence": 1}',
            content_length=len(b'{"worker": "w-held", "fence": 1}') + 500,
            truncated=True,
        ),
        # -- huge headers
        HostileCase(
            "100 KB custom header",
            "GET",
            "/v1/tenants/{tenant}",
            role="operator",
            headers={"X-Junk": "j" * 100_000},
            idempotent=False,
        ),
        HostileCase(
            "10 MB custom header",
            "GET",
            "/v1/tenants/{tenant}",
            role="operator",
            headers={"X-Junk": "j" * (10 * MB)},
            idempotent=False,
        ),
        HostileCase(
            "10,000 headers",
            "GET",
            "/v1/tenants/{tenant}",
            role="operator",
            headers={f"X-H{i}": "v" for i in range(10_000)},
            idempotent=False,
        ),
        HostileCase(
            "100 KB Authorization header",
            "GET",
            "/v1/tenants/{tenant}",
            headers={"Authorization": "Bearer qsk_" + "k" * 100_000},
            idempotent=False,
            expect=frozenset({401, 431, 400}),
        ),
        HostileCase(
            "10 KB Idempotency-Key",
            "POST",
            enqueue,
            body=b'{"payload": 1}',
            headers={"Idempotency-Key": "k" * 10_000},
        ),
        HostileCase(
            "Idempotency-Key with a NUL escape and non-ASCII",
            "POST",
            enqueue,
            body=b'{"payload": 1}',
            headers={"Idempotency-Key": "k\u00e9\u00ff"},
        ),
        HostileCase(
            "10 KB path segment",
            "GET",
            "/v1/tenants/{tenant}/items/" + "i" * 10_000,
            idempotent=False,
        ),
        # -- page sizes and cursors
        HostileCase(
            "dead-letters limit=10**9",
            "GET",
            letters + "?limit=1000000000",
            role="operator",
            idempotent=False,
        ),
        HostileCase(
            "dead-letters limit=10**30",
            "GET",
            letters + "?limit=" + "1" + "0" * 30,
            role="operator",
            idempotent=False,
        ),
        HostileCase(
            "dead-letters limit=-1",
            "GET",
            letters + "?limit=-1",
            role="operator",
            idempotent=False,
        ),
        HostileCase(
            "dead-letters limit=NaN",
            "GET",
            letters + "?limit=NaN",
            role="operator",
            idempotent=False,
        ),
        HostileCase(
            "dead-letters cursor=garbage",
            "GET",
            letters + "?cursor=%FF%FEgarbage%00",
            role="operator",
            idempotent=False,
        ),
        HostileCase(
            "dead-letters cursor of 100 KB",
            "GET",
            letters + "?cursor=" + "A" * 100_000,
            role="operator",
            idempotent=False,
        ),
        HostileCase(
            "dead-letters cursor: well-formed base64 of junk",
            "GET",
            letters + "?cursor=eyJ0IjogIjk5OTk5LTk5LTk5IiwgImlkIjogLTF9",
            role="operator",
            idempotent=False,
        ),
        HostileCase(
            "ledger verification limit=10**9",
            "GET",
            "/v1/tenants/{tenant}/ledger-verification?limit=1000000000",
            role="operator",
            idempotent=False,
        ),
        HostileCase(
            "a batch of 100,000 items (small ones, under 1 MB)",
            "POST",
            batch,
            body=b'{"items": [' + b",".join([b"{}"] * 100_000) + b"]}",
        ),
        # -- text the database cannot store or a parser cannot read, where ids and cursors go
        HostileCase(
            "ledger-verification cursor decoding to a NUL",
            "GET",
            "/v1/tenants/{tenant}/ledger-verification?cursor="
            + _cursor(["\x00", "00000000-0000-0000-0000-000000000000"]),
            role="operator",
            idempotent=False,
        ),
        HostileCase(
            "all-tenants ledger-verification cursor decoding to a NUL",
            "GET",
            "/v1/ledger-verification?cursor="
            + _cursor(["\x00", "00000000-0000-0000-0000-000000000000"]),
            role="admin",
            idempotent=False,
        ),
        HostileCase(
            "deliveries cursor of a superscript digit",
            "GET",
            "/v1/tenants/{tenant}/watchers/{watcher}/deliveries?cursor=%C2%B2",
            role="operator",
            idempotent=False,
        ),
        HostileCase(
            "a key id with a NUL",
            "DELETE",
            "/v1/tenants/{tenant}/keys/abc%00",
            role="admin",
            idempotent=False,
            expect=frozenset({404}),
        ),
        HostileCase(
            "a watcher URL whose host IDNA cannot decode",
            "POST",
            "/v1/tenants/{tenant}/watchers",
            role="operator",
            body=_json({"url": "http://xn--/", "events": ["item.enqueued"]}),
            expect=frozenset({422}),
        ),
        # -- absurd numbers
        HostileCase(
            "lease_ttl 1e308 and max_items 10**30",
            "POST",
            leases,
            body=b'{"worker": "w", "lease_ttl": 1e308, "max_items": 1000000000000000000000000000000}',
            idempotent=False,
        ),
        HostileCase(
            "wait=1e300",
            "POST",
            leases,
            body=b'{"worker": "w", "lease_ttl": 5, "wait": 1e300}',
            idempotent=False,
        ),
        HostileCase(
            "NaN and Infinity literals in a payload",
            "POST",
            enqueue,
            body=b'{"payload": {"a": NaN, "b": Infinity, "c": -Infinity}}',
        ),
        HostileCase(
            "a 5,000-digit integer in a payload",
            "POST",
            enqueue,
            body=b'{"payload": ' + b"9" * 5_000 + b"}",
        ),
        HostileCase(
            "payload integer 2**64 (past 64 bits)",
            "POST",
            enqueue,
            body=_json({"payload": 2**64}),
        ),
        HostileCase(
            "completion result integer -(2**63) - 1",
            "POST",
            complete,
            body=_json({"worker": "w-held", "fence": 1, "result": [-(2**63) - 1]}),
        ),
        HostileCase(
            "a 5,000-digit fence",
            "POST",
            complete,
            body=b'{"worker": "w-held", "fence": ' + b"9" * 5_000 + b', "result": {}}',
        ),
        HostileCase(
            "fence 2**63 (past bigint)",
            "POST",
            complete,
            body=_json({"worker": "w-held", "fence": 2**63, "result": {}}),
        ),
        HostileCase(
            "fence -1",
            "POST",
            complete,
            body=_json({"worker": "w-held", "fence": -1, "result": {}}),
        ),
        HostileCase(
            "fence 1e300 (a float)",
            "POST",
            heartbeat,
            body=b'{"worker": "w-held", "fence": 1e300, "lease_ttl": 5}',
            idempotent=False,
        ),
        HostileCase(
            "priority 10**20 and delay 1e308",
            "POST",
            enqueue,
            body=b'{"payload": 1, "priority": 100000000000000000000, "delay": 1e308}',
        ),
        HostileCase(
            "backlog_cap 10**20 (admin)",
            "PUT",
            "/v1/tenants/{tenant}",
            role="admin",
            body=b'{"backlog_cap": 100000000000000000000, "default_max_acquisitions": 5}',
            idempotent=False,
        ),
        HostileCase(
            "max_concurrency 2**63",
            "POST",
            "/v1/tenants/{tenant}/queues/q/spend-approvals",
            role="operator",
            body=_json(
                {
                    "max_concurrency": 2**63,
                    "expires_at": SOON,
                    "reason": "r",
                }
            ),
        ),
        HostileCase(
            "expires_at in year 99999",
            "POST",
            "/v1/tenants/{tenant}/queues/q/spend-approvals",
            role="operator",
            body=_json(
                {
                    "max_concurrency": 4,
                    "expires_at": "99999-01-01T00:00:00Z",
                    "reason": "r",
                }
            ),
        ),
    ]


class RssSampler:
    """Samples the API's resident memory every 20 ms until stopped."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.peak = cluster.api_rss()
        self.start = self.peak
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.cluster.api_rss())

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return self.peak


def _send_case(
    cluster: Cluster, case: HostileCase, keys: dict[str, str], ids: dict[str, str]
) -> RawAnswer:
    headers: dict[str, str | bytes] = {"Content-Type": case.content_type}
    if "Authorization" not in case.headers:
        headers["Authorization"] = f"Bearer {keys[case.role]}"
    if case.idempotent and "Idempotency-Key" not in case.headers:
        headers["Idempotency-Key"] = uuid.uuid4().hex
    for name, value in case.headers.items():
        headers[name] = value.encode("utf-8")
    path = case.path
    for name, value in ids.items():
        path = path.replace("{" + name + "}", value)
    return raw_request(
        HOST,
        cluster.api_port,
        case.method,
        path,
        headers=headers,
        body=case.pieces(),
        content_length=case.content_length,
        is_chunked=case.is_chunked,
        half_close=case.truncated,
    )


def _verdict(case: HostileCase, answer: RawAnswer) -> str | None:
    """Why this answer fails the case, or None."""
    if answer.status is None and case.truncated:
        return None
    if case.truncated and answer.status != 400:
        return f"status {answer.status} for a body that never fully arrived (want 400 or none)"
    if answer.status is None:
        return f"no answer ({answer.stopped or ''} {answer.error or ''})".strip()
    expected = case.expect or frozenset(range(400, 500))
    if answer.status not in expected:
        return f"status {answer.status}: {answer.body[:160]!r}"
    if answer.status >= 400 and not answer.is_problem:
        return f"status {answer.status} as {answer.content_type!r}, not problem+json"
    if answer.seconds > FAST_SECONDS:
        return f"took {answer.seconds:.2f}s (bound {FAST_SECONDS}s)"
    return None


def hostile_input(
    *, rounds: int = 3, cases: list[HostileCase] | None = None, name: str = "hostile input"
) -> ScenarioOutcome:
    """Oversized, malformed and absurd requests get a fast 4xx problem, change nothing,
    and keep the API's memory bounded."""
    began = time.monotonic()
    cases = cases if cases is not None else hostile_cases()
    violations: list[Violation] = []
    answers: dict[str, JSONValue] = {}
    failures: dict[str, list[str]] = {}
    operations = 0
    # A watcher on a loopback receiver (nothing listens there: its deliveries only wait).
    api_env = {**FAST_API_ENV, "QUEUE_SERVER_TRANSPORT_ALLOW": '["127.0.0.1"]'}
    with Cluster(name="hostile", api_env=api_env) as cluster:
        keys = cluster.create_tenant("hostile", max_concurrency=4)
        roles = {"worker": keys.worker, "operator": keys.operator, "admin": cluster.admin_key}
        with cluster.admin_client() as admin:
            worker = {"Authorization": f"Bearer {keys.worker}"}
            enq = admin.post(
                "/v1/tenants/hostile/queues/q/items",
                json={"payload": {"held": True}},
                headers={**worker, "Idempotency-Key": uuid.uuid4().hex},
            )
            enq.raise_for_status()
            held = admin.post(
                "/v1/tenants/hostile/queues/q/leases",
                json={"worker": "w-held", "lease_ttl": 30},
                headers=worker,
            )
            held.raise_for_status()
            item = str(held.json()["leases"][0]["item_id"])
            watcher = admin.post(
                "/v1/tenants/hostile/watchers",
                json={"url": "http://127.0.0.1:9/hook", "events": ["item.completed"]},
                headers={"Idempotency-Key": uuid.uuid4().hex},
            )
            watcher.raise_for_status()
        ids = {"tenant": "hostile", "item": item, "watcher": str(watcher.json()["watcher_id"])}
        time.sleep(0.3)
        rss = RssSampler(cluster)
        say(f"{name}: {len(cases)} cases x {rounds} rounds; API RSS {rss.start / MB:.0f} MB")
        slowest = 0.0
        for round_no in range(rounds):
            for case in cases:
                before = cluster.table_digest()
                answer = _send_case(cluster, case, roles, ids)
                if case.truncated:
                    # No answer to wait for: give a server that acted on the prefix time to.
                    time.sleep(TRUNCATED_SETTLE)
                after = cluster.table_digest()
                operations += 1
                slowest = max(slowest, answer.seconds)
                problem = _verdict(case, answer)
                changed = sorted(t for t in before if before[t] != after.get(t))
                if changed:
                    problem = (problem + "; " if problem else "") + f"changed tables {changed}"
                if round_no == 0:
                    answers[case.name] = f"{answer.status} in {answer.seconds * 1000:.0f} ms"
                if problem is not None:
                    failures.setdefault(case.name, []).append(problem)
        for case_name, problems in failures.items():
            violations.append(
                Violation(
                    "hostile-input",
                    f"{case_name}: {problems[0]} (in {len(problems)} of {rounds} rounds)",
                )
            )
        peak = rss.stop()
        end_rss = cluster.api_rss()
        growth = peak - rss.start
        if growth > RSS_BOUND:
            violations.append(
                Violation(
                    "memory",
                    f"API RSS grew by {growth / MB:.0f} MB (from {rss.start / MB:.0f} MB to a "
                    f"peak of {peak / MB:.0f} MB; bound {RSS_BOUND / MB:.0f} MB)",
                )
            )
        with cluster.admin_client() as admin:
            alive = admin.get("/v1/tenants/hostile")
        if alive.status_code != 200:
            violations.append(Violation("hostile-input", f"API afterwards: {alive.status_code}"))
        if cluster.api_proc is None or cluster.api_proc.poll() is not None:
            violations.append(Violation("hostile-input", "the API process died"))
        metrics: dict[str, JSONValue] = {
            "cases": len(cases),
            "requests": operations,
            "api_rss_mb": {
                "start": round(rss.start / MB, 1),
                "peak": round(peak / MB, 1),
                "end": round(end_rss / MB, 1),
            },
            "slowest_answer_ms": round(slowest * 1000, 1),
            "answers": answers,
        }
    by_checker: dict[str, int] = {}
    for violation in violations:
        by_checker[violation.checker] = by_checker.get(violation.checker, 0) + 1
    report = CheckReport(
        scenario=name,
        operations=operations,
        faults_injected=operations,
        lost=0,
        duplicated=0,
        violations=tuple(violations),
        by_checker=by_checker or {"hostile-input": 0, "memory": 0},
    )
    return ScenarioOutcome(report, time.monotonic() - began, metrics)
