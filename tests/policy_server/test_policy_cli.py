"""`queue-server policy show` and `queue-server policy verify`: a document's totality and rules."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from queue_server.cli import policy as policy_cli
from queue_server.cli.main import app
from queue_server.policy.v2 import OPERATION_RELIABILITY_V2

runner = CliRunner()


def _document(path: Path, edit: dict[str, dict[str, Any]]) -> Path:
    """The built-in document with `edit` (class -> {dimension: cell}) applied, written to `path`."""
    doc = copy.deepcopy(OPERATION_RELIABILITY_V2)
    for cls, cells in edit.items():
        doc["classes"][cls].update(cells)
    path.write_text(json.dumps(doc))
    return path


def test_policy_show_prints_every_class_and_dimension() -> None:
    result = runner.invoke(app, ["policy", "show", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert set(document["classes"]) >= {"confirmed-mutation", "artifact-verification"}
    table = runner.invoke(app, ["policy", "show"])
    assert table.exit_code == 0
    assert "read-only-dependency" in table.output
    assert "circuit-breaking" in table.output


def test_policy_verify_passes_on_the_built_in_document() -> None:
    result = runner.invoke(app, ["policy", "verify", "--json"], env={"QUEUE_SERVER_POLICY": ""})
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["passed"]
    assert report["version"] == "operation-reliability.v2"
    assert report["source"] == "built-in"
    assert report["cells"] == 60
    assert 0 < report["not_applicable"] < 60
    assert report["problems"] == []
    text = runner.invoke(policy_cli.app, ["verify"], env={"QUEUE_SERVER_POLICY": ""})
    assert text.exit_code == 0, text.output
    assert "policy verified" in text.output


def test_policy_verify_exits_1_naming_the_cell_of_a_document_that_breaks_a_rule(
    tmp_path: Path,
) -> None:
    # A read-only dependency has no effects: a rule of the policy, not only its envelope.
    effects = dict(
        OPERATION_RELIABILITY_V2["classes"]["read-only-dependency"]["idempotency-and-fencing"]
    )
    effects["effects"] = "always"
    broken = _document(
        tmp_path / "broken.json", {"read-only-dependency": {"idempotency-and-fencing": effects}}
    )
    result = runner.invoke(app, ["policy", "verify", "--json", "--policy", str(broken)])
    assert result.exit_code == 1, result.output
    report = json.loads(result.output)
    assert not report["passed"]
    cells = {p["cell"] for p in report["problems"]}
    assert "read-only-dependency/idempotency-and-fencing" in cells
    text = runner.invoke(app, ["policy", "verify", "--policy", str(broken)], env={"COLUMNS": "200"})
    assert text.exit_code == 1
    assert "policy FAILED" in text.output
    # The table may wrap a long cell name inside its column, whatever the terminal's width.
    cells_column = "".join(
        line.split("│")[1].strip() for line in text.output.splitlines() if line.count("│") >= 3
    )
    assert "read-only-dependency/idempotency-and-fencing" in cells_column


def test_policy_verify_exits_1_on_a_document_that_omits_a_cell_or_passes_a_bound(
    tmp_path: Path,
) -> None:
    doc = copy.deepcopy(OPERATION_RELIABILITY_V2)
    doc["version"] = "acme.v3"
    del doc["classes"]["watcher-delivery"]["backpressure"]
    doc["classes"]["durable-leased-work"]["deadline"] = {"seconds": 604801}
    path = tmp_path / "partial.json"
    path.write_text(json.dumps(doc))
    result = runner.invoke(app, ["policy", "verify", "--json", str(path)])
    assert result.exit_code == 1, result.output
    cells = {p["cell"] for p in json.loads(result.output)["problems"]}
    assert cells == {"watcher-delivery/backpressure", "durable-leased-work/deadline"}


def test_policy_verify_checks_the_file_it_is_given(tmp_path: Path) -> None:
    new = runner.invoke(app, ["policy", "new", "--version", "acme.v3"])
    assert new.exit_code == 0, new.output
    doc = json.loads(new.output)
    doc["classes"]["durable-leased-work"]["deadline"]["seconds"] = 7200
    mine = tmp_path / "p.json"
    mine.write_text(json.dumps(doc))
    # The argument wins over QUEUE_SERVER_POLICY.
    env = {"QUEUE_SERVER_POLICY": str(tmp_path / "missing.json")}
    passed = runner.invoke(app, ["policy", "verify", "--json", str(mine)], env=env)
    assert passed.exit_code == 0, passed.output
    report = json.loads(passed.output)
    assert (report["passed"], report["version"]) == (True, "acme.v3")
    # The same change under the built-in's version: a change needs a version of its own.
    doc["version"] = "operation-reliability.v2"
    mine.write_text(json.dumps(doc))
    refused = runner.invoke(app, ["policy", "verify", "--json", str(mine)])
    assert refused.exit_code == 1, refused.output
    assert json.loads(refused.output)["problems"] == [
        {
            "cell": "version",
            "problem": "operation-reliability.v2 is the built-in policy; a changed document"
            " needs a version of its own (policy new --version NAME)",
        }
    ]


def test_policy_verify_has_no_switch_that_weakens_the_runtime() -> None:
    usage = runner.invoke(app, ["policy", "verify", "--help"], env={"COLUMNS": "200"})
    assert usage.exit_code == 0
    assert "--weaken" not in usage.output
    assert "--server" in usage.output
