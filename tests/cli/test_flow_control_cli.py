"""Flow control from the command line: `enqueue --ordering-key` (the key's first item is
ready, the next says it waits behind the items before it; a file's lines may carry their own
keys) and `--partition-key`; `queues settings --ordering-dead-letters` and `--rate-limit`,
each kept when another setting changes."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.api import Api
from tests.helpers.cli import Cli


def test_enqueue_with_an_ordering_key_says_when_the_item_waits(
    cli: Cli, api: Api, tmp_path: Path
) -> None:
    first = cli.run("enqueue", "q", "--payload", "1", "--ordering-key", "acct-9", role="worker")
    assert first.stdout.strip().endswith(" on q"), first.stdout
    second = cli.run("enqueue", "q", "--payload", "2", "--ordering-key", "acct-9", role="worker")
    assert "waiting behind the items before it with ordering key acct-9" in second.stdout
    lines = tmp_path / "items.jsonl"
    lines.write_text('{"payload": 3, "ordering_key": "acct-9"}\n{"payload": 4}\n')
    loaded = cli.json("enqueue", "q", "--file", str(lines), role="worker")
    states = [
        api.worker.get(f"/v1/tenants/acme/items/{item_id}").json()["state"]
        for item_id in loaded["item_ids"]
    ]
    assert states == ["waiting", "ready"]
    refused = cli.run(
        "enqueue", "q", "--file", str(lines), "--ordering-key", "x", role="worker", ok=False
    )
    assert refused.returncode != 0
    assert "--ordering-key is for one item" in refused.stdout + refused.stderr


def test_queue_settings_hold_ordering_keys_behind_dead_letters_and_keep_it_on_other_changes(
    cli: Cli, api: Api
) -> None:
    shown = cli.run("queues", "settings", "q", "--ordering-dead-letters", "hold", role="operator")
    assert "hold  (queue)" in shown.stdout, shown.stdout
    # Another setting changed: the queue still holds its keys.
    kept = cli.json("queues", "settings", "q", "--deadline", "600", role="operator")
    assert kept["ordering_dead_letters"] == {"value": "hold", "source": "queue"}
    cleared = cli.json(
        "queues", "settings", "q", "--clear", "ordering-dead-letters", role="operator"
    )
    assert cleared["ordering_dead_letters"]["value"] == "release"
    refused = cli.run(
        "queues", "settings", "q", "--ordering-dead-letters", "skip", role="operator", ok=False
    )
    assert refused.returncode != 0


def test_a_rate_limit_is_set_shown_and_kept_from_the_command_line(cli: Cli, api: Api) -> None:
    shown = cli.run(
        "queues", "settings", "q", "--rate-limit", "10", "--rate-per", "60", "--rate-by-partition",
        role="operator",
    )  # fmt: skip
    assert "10 per 60 s per partition key  (queue)" in shown.stdout, shown.stdout
    kept = cli.json("queues", "settings", "q", "--rate-limit", "20", role="operator")
    assert kept["rate_limit"]["value"] == {"limit": 20, "per": 60.0, "partitioned": True}
    half = cli.run("queues", "settings", "other", "--rate-limit", "5", role="operator", ok=False)
    assert half.returncode != 0
    assert "--rate-per" in half.stdout + half.stderr
    made = cli.json("enqueue", "q", "--payload", "1", "--partition-key", "cust-7", role="worker")
    assert made["partition_key"] == "cust-7"
    cleared = cli.json("queues", "settings", "q", "--clear", "rate-limit", role="operator")
    assert cleared["rate_limit"] == {"value": None, "source": "default"}


def test_enqueue_with_dependencies_says_the_item_waits_and_a_refusal_names_the_dependency(
    cli: Cli, api: Api, tmp_path: Path
) -> None:
    a = cli.json("enqueue", "q", "--payload", '"a"', role="worker")["item_id"]
    b = cli.json("enqueue", "q", "--payload", '"b"', role="worker")["item_id"]
    joined = cli.run(
        "enqueue", "q", "--payload", '"joined"', "--depends-on", a, "--depends-on", b,
        "--on-dependency-failure", "run", role="worker",
    )  # fmt: skip
    assert "waiting for 2 items to complete" in joined.stdout, joined.stdout
    # A file's line names its own dependencies.
    lines = tmp_path / "items.jsonl"
    lines.write_text(f'{{"payload": "after-a", "depends_on": ["{a}"]}}\n')
    (after,) = cli.json("enqueue", "q", "--file", str(lines), role="worker")["item_ids"]
    assert api.worker.get(f"/v1/tenants/acme/items/{after}").json()["state"] == "waiting"
    # The queue drains in dependency order.
    drained = cli.run("work", "q", "--drain", "--", "cat", role="worker")
    assert "4 completed" in drained.stdout + drained.stderr
    nowhere = "00000000-0000-7000-8000-000000000001"
    refused = cli.run(
        "enqueue", "q", "--payload", "1", "--depends-on", nowhere, role="worker", ok=False
    )
    assert refused.returncode != 0
    assert f"depends_on: no item {nowhere} in tenant acme" in refused.stdout + refused.stderr
    unknown = cli.run(
        "enqueue", "q", "--payload", "1", "--depends-on", a, "--on-dependency-failure", "skip",
        role="worker", ok=False,
    )  # fmt: skip
    assert "give cancel, run or wait" in unknown.stdout + unknown.stderr
