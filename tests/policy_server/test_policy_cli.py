"""`queue-server policy show` and `queue-server policy verify`, with the negative control."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from queue_server.cli import policy as policy_cli
from queue_server.cli.main import app
from queue_server.policy import (
    CancelAfterDispatchMutationPath,
    verify_cancellation_rule,
    verify_contract,
)

runner = CliRunner()


def test_policy_show_prints_every_class_and_dimension() -> None:
    result = runner.invoke(app, ["policy", "show", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert set(document["classes"]) >= {"confirmed-mutation", "artifact-verification"}
    table = runner.invoke(app, ["policy", "show"])
    assert table.exit_code == 0
    assert "read-only-dependency" in table.output
    assert "circuit-breaking" in table.output


def test_policy_verify_passes_and_reports_the_negative_control_failing() -> None:
    result = runner.invoke(app, ["policy", "verify", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["passed"]
    assert report["cells_checked"] == 60
    assert report["bound"] + report["not_applicable"] + report["declared"] == 60
    assert report["real_path"]["passed"]
    assert not report["negative_control"]["passed"]
    assert report["negative_control"]["path"] == "CancelAfterDispatchMutationPath"
    text = runner.invoke(policy_cli.app, ["verify"])
    assert "failed as required" in text.output
    assert "contract verified" in text.output


def test_policy_verify_exits_non_zero_when_the_mutation_cancels_after_dispatch() -> None:
    result = runner.invoke(app, ["policy", "verify", "--weaken-mutation"])
    assert result.exit_code == 1
    assert "contract FAILED" in result.output
    assert not verify_cancellation_rule(CancelAfterDispatchMutationPath()).passed
    assert not verify_contract(mutation_path=CancelAfterDispatchMutationPath()).passed
