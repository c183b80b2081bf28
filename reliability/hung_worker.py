"""A hung `queue-server work` command under a short lease deadline: taken over, done once.

The API and both workers run under a policy document of their own whose
durable-leased-work deadline is short (DEADLINE seconds, attempt timeout 2 s). Worker
`hung` runs a command that never returns (`sleep 1000`) while the worker keeps
heartbeating; its lease ends at the deadline counted from its acquisition, the
heartbeat after it is refused (lease-deadline-exceeded), its command is stopped and
nothing is submitted. Worker `rescuer` takes the item over with a higher fence once
the deadline passes and completes it. The item is completed exactly once.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import httpx

from queue_server.policy.v2 import OPERATION_RELIABILITY_V2
from reliability.checkers import CheckReport, Violation
from reliability.cluster import Cluster, say, venv_bin
from reliability.history import JSONValue
from reliability.scenarios import ScenarioOutcome

DEADLINE = 6.0
TTL = 2.0

SCRIPT = """#!/bin/sh
# The first run hangs (its worker keeps heartbeating); any later run completes.
if [ -e "$MARKER" ]; then
    printf '{"by": "%s", "fence": %s}' "$QS_WORKER" "$QS_FENCE"
else
    touch "$MARKER"
    exec sleep 1000
fi
"""


def _policy(path: Path) -> Path:
    doc = copy.deepcopy(OPERATION_RELIABILITY_V2)
    doc.pop("policy", None)
    doc["version"] = "reliability.short-lease-deadline"  # a change is a version of its own
    leased = doc["classes"]["durable-leased-work"]
    leased["deadline"] = {"seconds": DEADLINE}
    leased["attempt-timeout"] = {"seconds": TTL, "on-timeout": "lease-expires"}
    path.write_text(json.dumps(doc))
    return path


def _work(
    cluster: Cluster, key: str, policy: Path, script: Path, marker: Path, *args: str
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            venv_bin("queue-server"),
            "work",
            "q",
            "--policy",
            str(policy),
            "--lease-ttl",
            str(TTL),
            "--json",
            "--grace",
            "0",
            *args,
            "--",
            str(script),
        ],
        env={
            **os.environ,
            "QUEUE_SERVER_URL": cluster.base_url,
            "QUEUE_SERVER_KEY": key,
            "MARKER": str(marker),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def hung_worker(*, name: str = "hung worker") -> ScenarioOutcome:
    """A hung `queue-server work` command is taken over after the lease deadline; done once.
    Its policy file and command live in a temporary folder, removed when it ends."""
    with tempfile.TemporaryDirectory(prefix="qs-hung-") as root:
        return _hung_worker(Path(root), name)


def _hung_worker(root: Path, name: str) -> ScenarioOutcome:
    began = time.monotonic()
    violations: list[Violation] = []
    metrics: dict[str, JSONValue] = {"deadline_seconds": DEADLINE, "lease_ttl_seconds": TTL}
    policy = _policy(root / "short-deadline.json")
    script = root / "job.sh"
    script.write_text(SCRIPT)
    script.chmod(0o755)
    marker = root / "started"
    with Cluster(name="hung", api_env={"QUEUE_SERVER_POLICY": str(policy)}) as cluster:
        keys = cluster.create_tenant("hung")
        worker = httpx.Client(
            base_url=cluster.base_url,
            headers={"Authorization": f"Bearer {keys.worker}"},
            timeout=30,
        )
        made = worker.post(
            "/v1/tenants/hung/queues/q/items",
            json={"payload": {"job": 1}},
            headers={"Idempotency-Key": uuid.uuid4().hex},
        )
        made.raise_for_status()
        item_id = made.json()["item_id"]
        # One item each: the hung worker must not win the item back after losing it.
        hung = _work(
            cluster, keys.worker, policy, script, marker, "--name", "hung", "--max-items", "1"
        )
        waited = time.monotonic()
        while not marker.exists() and time.monotonic() - waited < 30:
            time.sleep(0.05)
        acquired_at = time.monotonic()
        say(f"{name}: worker 'hung' runs a command that never returns; deadline {DEADLINE:g}s")
        rescuer = _work(
            cluster, keys.worker, policy, script, marker, "--name", "rescuer", "--max-items", "1"
        )
        try:
            out, _ = rescuer.communicate(timeout=DEADLINE + 60)
        except subprocess.TimeoutExpired:
            os.killpg(rescuer.pid, signal.SIGKILL)
            out, _ = rescuer.communicate()
            violations.append(Violation("takeover", "no other worker took the item over"))
        took = time.monotonic() - acquired_at
        metrics["takeover_after_seconds"] = round(took, 1)
        # The hung worker saw its lease end and stopped its command; it exits by itself
        # (--max-items 1), else a SIGTERM stops it.
        with contextlib.suppress(subprocess.TimeoutExpired):
            hung.wait(timeout=10)
        if hung.poll() is None:
            os.killpg(hung.pid, signal.SIGTERM)
        try:
            hung_out, _ = hung.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(hung.pid, signal.SIGKILL)
            hung_out, _ = hung.communicate()
            violations.append(Violation("stop", "the hung worker did not stop on SIGTERM"))
        lines = [json.loads(line) for line in out.splitlines() if line.strip()]
        hung_lines = [json.loads(line) for line in hung_out.splitlines() if line.strip()]
        metrics["rescuer"] = lines
        metrics["hung"] = hung_lines
        item = worker.get(f"/v1/tenants/hung/items/{item_id}").json()
        events = worker.get(f"/v1/tenants/hung/items/{item_id}/ledger").json()["events"]
        kinds = [e["kind"] for e in events]
        metrics["ledger"] = kinds
        completed = [e for e in events if e["kind"] == "completed"]
        if item["state"] != "completed":
            violations.append(Violation("completion", f"the item is {item['state']}"))
        if len(completed) != 1:
            violations.append(Violation("completions", f"completed {len(completed)} times"))
        if "deadline_exceeded" not in kinds:
            violations.append(Violation("deadline", "no deadline_exceeded in the ledger"))
        if completed and (completed[0]["actor"], completed[0]["fence"]) != ("rescuer", 2):
            violations.append(
                Violation(
                    "fences",
                    f"completed by {completed[0]['actor']} at fence"
                    f" {completed[0]['fence']}, not by the rescuer at fence 2",
                )
            )
        if took < DEADLINE - 1:
            violations.append(
                Violation("deadline", f"taken over after {took:.1f}s, before the deadline")
            )
        if [line.get("outcome") for line in hung_lines] != ["lost"]:
            violations.append(
                Violation("lease", f"the hung worker reported {hung_lines}, not its lease lost")
            )
        if not any("lease-deadline-exceeded" in line.get("detail", "") for line in hung_lines):
            violations.append(
                Violation("lease", "the hung worker never heard lease-deadline-exceeded")
            )
        worker.close()
    report = CheckReport(
        scenario=name,
        operations=len(metrics.get("ledger", [])),  # type: ignore[arg-type]
        faults_injected=1,
        lost=0 if not violations else int(any(v.checker == "completion" for v in violations)),
        duplicated=max(0, len(completed) - 1),
        violations=tuple(violations),
        by_checker={v.checker: 1 for v in violations},
    )
    return ScenarioOutcome(report, time.monotonic() - began, metrics)
