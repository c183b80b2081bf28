"""The `--policy` option of the client commands (`work` and `policy show`), and a refusal by
the server's policy as a client command prints it."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from queue_server.policy import default_policy
from queue_server.policy.v2 import OPERATION_RELIABILITY_V2
from tests.helpers.cli import Cli


def own(**leased: Any) -> dict[str, Any]:
    doc = copy.deepcopy(OPERATION_RELIABILITY_V2)
    doc["version"] = "short-leases.v1"
    doc["classes"]["durable-leased-work"].update(leased)
    return doc


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps(doc))
    return path


def test_work_refuses_a_lease_ttl_above_the_policy_naming_the_cell(cli: Cli) -> None:
    done = cli.run(
        "work", "q", "--lease-ttl", "31", "--drain", "--", "true", ok=False, role="worker"
    )
    assert done.returncode == 1
    assert "durable-leased-work/attempt-timeout" in done.stderr
    assert "lease_ttl=31 exceeds the policy's 30" in done.stderr


def test_policy_show_prints_a_document_of_ones_own_and_refuses_a_bad_one(
    cli: Cli, tmp_path: Path
) -> None:
    built_in = json.loads(cli.run("policy", "show", "--json").stdout)
    assert built_in == default_policy().as_document()
    path = write(tmp_path / "mine.json", own(deadline={"seconds": 60}))
    mine = json.loads(cli.run("policy", "show", "--json", "--policy", str(path)).stdout)
    assert mine["version"] == "short-leases.v1"
    assert mine["classes"]["durable-leased-work"]["deadline"]["seconds"] == 60
    bad = write(tmp_path / "bad.json", own(deadline={"seconds": 604801}))
    refused = cli.run("policy", "show", "--policy", str(bad), ok=False)
    assert refused.returncode == 1
    assert "durable-leased-work/deadline" in refused.stderr


def test_a_refusal_by_the_servers_policy_prints_its_detail_and_each_fields_ceiling(
    cli: Cli,
) -> None:
    done = cli.run(
        "enqueue", "q", "--payload", "{}", "--max-acquisitions", "50", ok=False, role="worker"
    )
    # Not checked by the CLI first (its own policy may differ): the server refuses it.
    assert done.returncode == 4, done.stderr
    said = " ".join(done.stderr.split())
    assert "The policy is a maximum envelope." in said, said
    # The detail, then the field with its reason, as the server's problem gave them.
    assert "must be at most" in said.split("The policy is a maximum envelope.", 1)[1], said
