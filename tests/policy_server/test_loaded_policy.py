"""One loaded policy per process: `--policy FILE` / QUEUE_SERVER_POLICY or the built-in v2,
validated at start (a bad document or a setting above the envelope stops the process,
naming the cell; a changed document under the built-in's version too), served at
GET /v1/policy and named in /readyz and the start-up log."""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from queue_server.client import QueueClient, Worker
from queue_server.policy import (
    PolicyError,
    load_policy,
    load_policy_file,
    runtime_policy,
)
from queue_server.policy.v2 import OPERATION_RELIABILITY_V2
from queue_server.settings import Settings
from tests.helpers import web
from tests.helpers.api import Api, policy_document

BIN = Path(sys.executable).parent / "queue-server"


def own(**leased: Any) -> dict[str, Any]:
    """short-leases.v1: the built-in under a version of its own, with durable-leased-work
    cells replaced."""
    return policy_document({"durable-leased-work": leased}, version="short-leases.v1")


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps(doc))
    return path


def test_typed_views_read_the_cells_each_enforcement_point_uses() -> None:
    policy = runtime_policy(environ={})
    assert policy.source == "built-in"
    leased = policy.leased_work
    assert (leased.attempt_cap, leased.attempt_timeout, leased.deadline) == (5, 30, 900)
    assert leased.backoff_cap == 300
    assert leased.cell("attempt_cap") == "durable-leased-work/retry"
    delivery = policy.delivery
    assert (delivery.outbox_cap, delivery.concurrency, delivery.attempt_timeout) == (1000, 4, 10)
    assert {c.value for c in delivery.retryable} == {
        "attempt-timeout",
        "transport-error",
        "dependency-unavailable",
        "rate-limited",
    }
    assert delivery.deadline == 86400
    assert policy.verification.deadline == 1800
    assert policy.mutation.deadline == 30
    assert policy.mutation.concurrency == 8


def test_a_policy_file_of_its_own_version_is_loaded(tmp_path: Path) -> None:
    path = write(tmp_path / "p.json", own(deadline={"seconds": 60}))
    policy = runtime_policy(environ={"QUEUE_SERVER_POLICY": str(path)})
    assert policy.leased_work.deadline == 60
    assert policy.source == str(path)
    assert policy.version == "short-leases.v1"
    assert policy.digest != load_policy().digest
    # What `policy show --json` prints is a document the loader takes back, unchanged.
    assert load_policy(policy.as_document()).digest == policy.digest


@pytest.mark.parametrize(
    ("cells", "named"),
    [
        ({"deadline": {"seconds": 604801}}, "durable-leased-work/deadline"),
        (
            {
                "deadline": {"seconds": 7200},
                "attempt-timeout": {"seconds": 3601, "on-timeout": "lease-expires"},
            },
            "durable-leased-work/attempt-timeout",
        ),
        (
            {"retry": {"kind": "queue-reacquisition", "max-acquisitions": 101}},
            "durable-leased-work/retry",
        ),
        (
            {"backoff-and-jitter": {"kind": "requeue-delay", "max-seconds": 86401}},
            "durable-leased-work/backoff-and-jitter",
        ),
        (
            {
                "idempotency-and-fencing": {
                    "effects": "always",
                    "requires-idempotency-key": True,
                    "requires-outcome-reference": True,
                    "fencing": "monotonic-fence",
                    "durable-receipt": False,
                }
            },
            "durable-leased-work/idempotency-and-fencing",
        ),
    ],
)
def test_a_policy_file_beyond_a_bound_is_refused_naming_the_cell(
    tmp_path: Path, cells: dict[str, Any], named: str
) -> None:
    path = write(tmp_path / "p.json", own(**cells))
    with pytest.raises(PolicyError) as info:
        load_policy_file(path)
    assert named in info.value.cells


def test_a_policy_file_that_is_not_total_or_not_json_is_refused(tmp_path: Path) -> None:
    doc = own()
    del doc["classes"]["watcher-delivery"]["retry"]
    with pytest.raises(PolicyError) as info:
        load_policy_file(write(tmp_path / "p.json", doc))
    assert info.value.cells == ("watcher-delivery/retry",)
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(PolicyError, match="is not JSON"):
        load_policy_file(tmp_path / "bad.json")
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy_file(tmp_path / "missing.json")


def test_settings_may_lower_a_policy_value_never_raise_it() -> None:
    policy = load_policy()
    Settings(delivery_concurrency=2, delivery_attempt_timeout=5).bounded_by(policy)
    with pytest.raises(PolicyError) as info:
        Settings(delivery_concurrency=64, delivery_attempt_timeout=11).bounded_by(policy)
    assert info.value.cells == ("watcher-delivery/concurrency", "watcher-delivery/attempt-timeout")
    assert "QUEUE_SERVER_DELIVERY_CONCURRENCY=64" in str(info.value)


@pytest.mark.live
def test_the_sdk_worker_takes_its_lease_ttl_from_the_policy_and_refuses_more(
    api: Api, tmp_path: Path
) -> None:
    with QueueClient(api.url, api.keys["worker"]) as qs:
        assert Worker(qs, "q", lambda job: None).lease_ttl == 30
        assert Worker(qs, "q", lambda job: None, lease_ttl=10).lease_ttl == 10
        with pytest.raises(PolicyError) as info:
            Worker(qs, "q", lambda job: None, lease_ttl=31)
        assert info.value.cells == ("durable-leased-work/attempt-timeout",)
        short = load_policy(
            own(**{"attempt-timeout": {"seconds": 5, "on-timeout": "lease-expires"}})
        )
        assert Worker(qs, "q", lambda job: None, policy=short).lease_ttl == 5


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _serve(
    database_url: str, tmp_path: Path, *args: str, **env: str
) -> tuple[subprocess.Popen[str], int]:
    port = _free_port()
    proc = subprocess.Popen(
        [str(BIN), "serve", "--port", str(port), "--data-dir", str(tmp_path / "data"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("QUEUE_SERVER_")},
            "QUEUE_SERVER_DATABASE_URL": database_url,
            **env,
        },
    )
    return proc, port


@pytest.mark.slow
def test_serve_loads_a_policy_file_and_names_it_in_policy_readyz_and_its_log(
    database_url: str, tmp_path: Path
) -> None:
    path = write(tmp_path / "p.json", own(deadline={"seconds": 60}))
    proc, port = _serve(database_url, tmp_path, "--policy", str(path))
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            assert time.monotonic() < deadline, "server did not become ready"
            try:
                ready = web.get(f"http://127.0.0.1:{port}/readyz")
                if ready.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        expected = load_policy_file(path)
        assert ready.json()["policy"] == {
            "version": "short-leases.v1",
            "digest": expected.digest,
            "source": "file",
        }
        served = web.get(f"http://127.0.0.1:{port}/v1/policy").json()
        assert served["classes"]["durable-leased-work"]["deadline"]["seconds"] == 60
        assert served["loaded"]["digest"] == expected.digest
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=30)
    assert f"policy short-leases.v1 ({path}, {expected.digest[:19]})" in out


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (("--policy", "BAD"), {}, "durable-leased-work/retry"),
        ((), {"QUEUE_SERVER_POLICY": "BAD"}, "durable-leased-work/retry"),
        ((), {"QUEUE_SERVER_DELIVERY_CONCURRENCY": "5"}, "watcher-delivery/concurrency"),
    ],
)
def test_serve_stops_at_start_on_a_policy_or_setting_outside_the_envelope(
    database_url: str, tmp_path: Path, args: tuple[str, ...], env: dict[str, str], named: str
) -> None:
    bad = write(
        tmp_path / "bad.json",
        own(retry={"kind": "queue-reacquisition", "max-acquisitions": 101}),
    )
    args = tuple(str(bad) if a == "BAD" else a for a in args)
    env = {k: str(bad) if v == "BAD" else v for k, v in env.items()}
    proc, _ = _serve(database_url, tmp_path, *args, **env)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    assert named in out
    assert "Traceback" not in out


def test_serve_refuses_a_changed_document_that_keeps_the_built_in_version(
    database_url: str, tmp_path: Path
) -> None:
    doc = copy.deepcopy(OPERATION_RELIABILITY_V2)
    doc["classes"]["durable-leased-work"]["deadline"]["seconds"] = 7200
    proc, _ = _serve(database_url, tmp_path, "--policy", str(write(tmp_path / "p.json", doc)))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    assert (
        "version: operation-reliability.v2 is the built-in policy; a changed document needs a"
        " version of its own (policy new --version NAME)"
    ) in " ".join(out.split())
    assert "Traceback" not in out


def test_deliver_stops_at_start_on_a_setting_above_the_envelope(
    database_url: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [str(BIN), "deliver", "--once"],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            "PATH": os.environ.get("PATH", ""),
            "QUEUE_SERVER_DATABASE_URL": database_url,
            "QUEUE_SERVER_DELIVERY_ATTEMPT_TIMEOUT": "30",
        },
    )
    assert done.returncode == 1
    assert "watcher-delivery/attempt-timeout" in done.stderr
    assert "QUEUE_SERVER_DELIVERY_ATTEMPT_TIMEOUT=30 exceeds the policy's 10" in done.stderr
