"""`queue-server enqueue --unique-key`: the first makes the item, the next says which item
holds the key and makes nothing; a file's lines may carry their own keys. An option that
needs another (`--unique-for`, `--on-dependency-failure`) is refused without it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.api import Api
from tests.helpers.cli import Cli


def test_enqueue_with_a_unique_key_says_when_an_item_already_holds_it(
    cli: Cli, api: Api, tmp_path: Path
) -> None:
    made = cli.run("enqueue", "q", "--payload", '{"n": 1}', "--unique-key", "daily", role="worker")
    assert made.stdout.startswith("enqueued "), made.stdout
    item_id = made.stdout.split()[1]
    held = cli.run("enqueue", "q", "--payload", '{"n": 2}', "--unique-key", "daily", role="worker")
    assert f"{item_id} on q (ready) already holds unique key daily" in held.stdout, held.stdout
    answered = cli.json("enqueue", "q", "--payload", "3", "--unique-key", "daily", role="worker")
    assert (answered["item_id"], answered["payload"]) == (item_id, {"n": 1})
    lines = tmp_path / "items.jsonl"
    lines.write_text('{"payload": 4, "unique_key": "daily"}\n{"payload": 5, "unique_key": "w"}\n')
    loaded = cli.json("enqueue", "q", "--file", str(lines), role="worker")
    assert loaded["item_ids"][0] == item_id
    refused = cli.run(
        "enqueue", "q", "--file", str(lines), "--unique-key", "x", role="worker", ok=False
    )
    assert refused.returncode != 0
    assert "--unique-key is for one item" in refused.stdout + refused.stderr
    with api.client(api.keys["worker"]) as client:
        count = client.get("/v1/tenants/acme/queues").json()["backlog"]
    assert count == 2


@pytest.mark.parametrize(
    ("option", "needs"),
    [
        (("--unique-for", "60"), "--unique-key"),
        (("--on-dependency-failure", "run"), "--depends-on"),
    ],
)
def test_an_option_without_the_one_it_needs_is_refused_and_nothing_enqueued(
    cli: Cli, api: Api, option: tuple[str, str], needs: str
) -> None:
    refused = cli.run("enqueue", "q", "--payload", "1", *option, role="worker", ok=False)
    assert refused.returncode == 2
    assert f"{option[0]} needs {needs}" in refused.stderr
    assert api.worker.get("/v1/tenants/acme/queues").json()["backlog"] == 0
