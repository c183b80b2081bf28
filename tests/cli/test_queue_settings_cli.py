"""`queue-server queues settings`: show each value and its source, change only the ones
given, unset one, refuse one above the envelope naming its cell; and `work` sends a failed
item back after the queue's backoff."""

from __future__ import annotations

import re

from tests.helpers.cli import Cli


def test_show_set_some_then_clear_one(cli: Cli) -> None:
    shown = cli.run("queues", "settings", "reports").stdout
    assert "lease deadline" in shown
    assert "(policy)" in shown
    changed = cli.json("queues", "settings", "reports", "--deadline", "600", "--retry-base", "2")
    assert changed["deadline"] == {"value": 600.0, "source": "queue"}
    assert changed["retry"]["base"] == {"value": 2.0, "source": "queue"}
    # Another change keeps what was set before.
    again = cli.json("queues", "settings", "reports", "--jitter")
    assert again["deadline"]["source"] == "queue"
    assert again["retry"]["base"]["source"] == "queue"
    assert again["retry"]["jitter"] == {"value": True, "source": "queue"}
    cleared = cli.json("queues", "settings", "reports", "--clear", "deadline")
    assert cleared["deadline"] == {"value": 900.0, "source": "policy"}
    assert cleared["retry"]["jitter"]["source"] == "queue"
    table = cli.run("queues", "settings", "reports").stdout
    assert "600" not in table
    assert "2 s  (queue)" in table


def test_the_settings_table_says_whether_jitter_is_on(cli: Cli) -> None:
    on = cli.run("queues", "settings", "reports", "--jitter").stdout
    assert re.search(r"retry jitter +yes  \(queue\)", on), on
    off = cli.run("queues", "settings", "reports", "--no-jitter").stdout
    assert re.search(r"retry jitter +no  \(queue\)", off), off


def test_a_value_above_the_envelope_exits_4_naming_the_cell(cli: Cli) -> None:
    refused = cli.run("queues", "settings", "reports", "--deadline", "5000", ok=False)
    assert refused.returncode == 4, refused.stderr
    assert "durable-leased-work/deadline" in refused.stdout + refused.stderr
    unknown = cli.run("queues", "settings", "reports", "--clear", "colour", ok=False)
    assert unknown.returncode == 2


def test_fairness_is_set_kept_by_other_changes_cleared_and_checked(cli: Cli) -> None:
    fair = cli.json("queues", "settings", "reports", "--fairness", "partition_key")
    assert fair["fairness"] == {"value": "partition_key", "source": "queue"}
    kept = cli.json("queues", "settings", "reports", "--deadline", "600")
    assert kept["fairness"] == {"value": "partition_key", "source": "queue"}
    assert "partition_key  (queue)" in cli.run("queues", "settings", "reports").stdout
    cleared = cli.json("queues", "settings", "reports", "--clear", "fairness")
    assert cleared["fairness"] == {"value": "arrival", "source": "default"}
    unknown = cli.run("queues", "settings", "reports", "--fairness", "loudest", ok=False)
    assert unknown.returncode == 2
    assert "arrival or partition_key" in unknown.stdout + unknown.stderr


def test_work_sends_a_failed_item_back_after_the_backoff(cli: Cli) -> None:
    item = cli.api.enqueue("jobs", {"n": 1})
    done = cli.run("work", "jobs", "--max-items", "1", "--", "false", role="worker", ok=False)
    assert done.returncode == 1, done.stderr
    events = cli.api.worker.get(
        f"/v1/tenants/{cli.api.tenant}/items/{item['item_id']}/ledger"
    ).json()["events"]
    triaged = [e for e in events if e["kind"] == "triaged"]
    assert [(e["data"]["delay"], e["data"]["backoff"]) for e in triaged] == [(1.0, True)]
