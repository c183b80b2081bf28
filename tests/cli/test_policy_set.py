"""`queue-server policy set CELL VALUE --reason`: the envelope moves in one command, on the
running server, with who and why in the history; a version names one document; a policy
file that is no document at all is refused in one line."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from queue_server.policy import default_policy
from queue_server.settings import Settings
from tests.helpers import web
from tests.helpers.cli import BIN, Cli
from tests.helpers.server import LiveServer


def enqueue(cli: Cli, budget: int, key: str) -> Any:
    return cli.api.worker.post(
        f"/v1/tenants/{cli.api.tenant}/queues/imports/items",
        json={"payload": None, "max_acquisitions": budget},
        headers={"Idempotency-Key": key},
    )


def test_policy_set_raises_the_attempts_cap_and_the_deadline_with_who_and_why(cli: Cli) -> None:
    # Under the built-in: 25 attempts and a deadline of two hours are refused.
    before = enqueue(cli, 25, "before")
    assert before.status_code == 422, before.text
    assert before.json()["errors"][0]["cell"] == "durable-leased-work/retry"
    refused = cli.run("queues", "settings", "reports", "--deadline", "7200", ok=False)
    assert refused.returncode == 4, refused.stderr

    raised = cli.run(
        "policy", "set", "attempts", "25", "--reason", "imports retry for a day", role="admin"
    )
    assert "max-acquisitions 5 -> 25" in raised.stdout, raised.stdout
    assert enqueue(cli, 25, "after").status_code == 201
    over = enqueue(cli, 26, "over")
    assert over.status_code == 422, over.text
    assert over.json()["errors"][0]["cell"] == "durable-leased-work/retry"

    cli.run(
        "policy",
        "set",
        "durable-leased-work/deadline",
        "7200",
        "--reason",
        "reports run two hours",
        role="admin",
    )
    settled = cli.json("queues", "settings", "reports", "--deadline", "7200")
    assert settled["deadline"] == {"value": 7200.0, "source": "queue"}

    served = cli.api.client(None).get("/v1/policy").json()
    leased = served["classes"]["durable-leased-work"]
    assert (leased["retry"]["max-acquisitions"], leased["deadline"]["seconds"]) == (25, 7200)
    assert served["version"].startswith("operation-reliability.v2+")
    assert served["loaded"]["source"] == "published"

    versions = cli.json("policy", "history", role="admin")["versions"]
    published = [(v["reason"], v["current"]) for v in versions if v["published_by"]]
    assert published == [("reports run two hours", True), ("imports retry for a day", False)]
    admin_id = cli.api.admin.get("/v1/whoami").json()["key_id"]
    assert {v["published_by"] for v in versions if v["published_by"]} == {f"key:{admin_id}"}
    table = cli.run("policy", "history", "--wide", role="admin").stdout
    assert "imports retry for a day" in table


def test_policy_set_refuses_a_value_past_the_bounds_naming_the_cell(cli: Cli) -> None:
    refused = cli.run("policy", "set", "attempts", "101", "--reason", "r", role="admin", ok=False)
    assert refused.returncode == 1, refused.stderr
    assert "durable-leased-work/retry" in refused.stdout
    unknown = cli.run("policy", "set", "colour", "1", "--reason", "r", role="admin", ok=False)
    assert unknown.returncode == 2
    assert cli.api.client(None).get("/v1/policy").json()["version"] == "operation-reliability.v2"


def acme(attempts: int) -> dict[str, Any]:
    document = default_policy().as_document()
    document["version"] = "acme.v3"
    document["classes"]["durable-leased-work"]["retry"]["max-acquisitions"] = attempts
    return document


def publish(cli: Cli, document: dict[str, Any], key: str) -> Any:
    return cli.api.admin.put(
        "/v1/policy/versions/acme.v3",
        json={"document": document, "reason": "more attempts"},
        headers={"Idempotency-Key": key},
    )


def test_a_version_name_reused_with_other_content_is_refused(cli: Cli) -> None:
    first = publish(cli, acme(25), "first")
    assert first.status_code == 201, first.text
    again = publish(cli, acme(25), "again")
    assert again.status_code == 200, again.text
    assert again.json()["sha256"] == first.json()["sha256"]

    other = publish(cli, acme(30), "other")
    assert other.status_code == 409, other.text
    assert other.json()["type"].endswith("/policy-version-conflict")
    assert other.json()["kept_sha256"] == first.json()["sha256"]
    by_cli = cli.run(
        "policy", "set", "attempts", "30", "--version", "acme.v3", "--reason", "r",
        role="admin", ok=False,
    )  # fmt: skip
    assert by_cli.returncode == 4, by_cli.stderr
    assert "policy-version-conflict" in by_cli.stderr
    served = cli.api.client(None).get("/v1/policy").json()
    assert (served["version"], served["loaded"]["digest"]) == (
        "acme.v3",
        "sha256:" + first.json()["sha256"],
    )
    versions = cli.json("policy", "history", role="admin")["versions"]
    assert [v["version"] for v in versions].count("acme.v3") == 1

    # Only an admin publishes.
    worker = cli.api.worker.put(
        "/v1/policy/versions/acme.v3",
        json={"document": acme(25), "reason": "mine"},
        headers={"Idempotency-Key": "worker"},
    )
    assert worker.status_code == 403, worker.text


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nests deeper than"),
        (b'{"version": "caf\xe9.v3"}', "is not UTF-8"),
    ],
    ids=["nested", "latin-1"],
)
@pytest.mark.parametrize("command", ["verify", "serve"])
def test_a_file_that_is_no_policy_document_is_one_line_and_exit_2(
    tmp_path: Path, content: bytes, said: str, command: str
) -> None:
    path = tmp_path / "p.json"
    path.write_bytes(content)
    argv = (
        ["policy", "verify", str(path)] if command == "verify" else ["serve", "--policy", str(path)]
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "COLUMNS": "300",
        "NO_COLOR": "1",
        "HOME": str(tmp_path),
        "QUEUE_SERVER_DATA_DIR": str(tmp_path / "data"),
    }
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    done = subprocess.run([str(BIN), *argv], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: Not a policy document:"), line
    assert said in line


# uvicorn ends its thread with SystemExit(3) when the app's start fails.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_server_does_not_start_under_a_file_reusing_a_kept_version_name(
    cli: Cli, tmp_path: Path, database_url: str
) -> None:
    assert publish(cli, acme(25), "first").status_code == 201
    path = tmp_path / "acme.json"
    path.write_text(json.dumps(acme(30)))
    settings = Settings(data_dir=tmp_path / "second", poll_interval=0.2, policy=str(path))
    second = LiveServer(settings, database_url)
    try:
        with pytest.raises(RuntimeError, match="did not start"):
            second.start()
    finally:
        second.stop()
    versions = cli.json("policy", "history", role="admin")["versions"]
    assert [(v["version"], v["loads"]) for v in versions if v["version"] == "acme.v3"] == [
        ("acme.v3", 1)
    ]


def test_another_server_process_runs_a_published_version_as_soon_as_it_is_told(
    cli: Cli, tmp_path: Path, database_url: str
) -> None:
    """A process that did not take the publication runs it when the policy channel's
    notification reaches it, not at its next poll (a minute away here): `policy set`, which
    checks that every process answers with the new version, cannot be answered by a
    process still under the old one once it has seen a few agree."""
    other = LiveServer(Settings(data_dir=tmp_path / "other", policy_poll_interval=60), database_url)
    other.start()
    try:
        notifier = other.app.state.notifier
        deadline = time.monotonic() + 10
        while not notifier.connected.is_set():
            assert time.monotonic() < deadline, "the other process never listened"
            time.sleep(0.02)
        with web.client(base_url=other.url) as anonymous:
            assert anonymous.get("/v1/policy").json()["version"] != "acme.v3"
            assert publish(cli, acme(25), "told").status_code == 201
            published = time.monotonic()
            while anonymous.get("/v1/policy").json()["version"] != "acme.v3":
                assert time.monotonic() - published < 5, "the other process was not told"
                time.sleep(0.02)
    finally:
        other.stop()


def test_the_examples_of_queues_settings_help_run_in_order_under_the_built_in(cli: Cli) -> None:
    shown = cli.run("queues", "settings", "--help").stdout
    # The example lines: `Examples: queue-server ...` and the ones under it (not the usage).
    found = re.findall(r"^\s*(?:Examples?: )?queue-server ([^\n]+?)\s*$", shown, re.M)
    examples = [shlex.split(line) for line in found]
    assert examples, shown
    for argv in examples:
        cli.run(*argv, role="admin" if argv[0] == "policy" else "operator")
