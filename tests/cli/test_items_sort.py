"""`queue-server items list` shows the newest items first, or in the order --sort names."""

from __future__ import annotations

from tests.helpers.api import Api
from tests.helpers.cli import Cli


def test_items_list_is_newest_first_and_sorts_by_priority_and_attempts(cli: Cli, api: Api) -> None:
    made = [str(api.enqueue("q", n, priority=(2, 9, 2, -1)[n])["item_id"]) for n in range(4)]
    # Two tries for the highest-priority item (made[1], the first acquired each time).
    for _ in range(2):
        (lease,) = api.acquire("q")
        assert lease["item_id"] == made[1]
        api.holder("requeue", lease["item_id"], worker="w1", fence=lease["fence"])

    assert cli.run("items", "list", "-q").stdout.split() == made[::-1]
    by_priority = cli.json("items", "list", "--sort", "priority", "--limit", "3")
    assert [i["item_id"] for i in by_priority] == [made[3], made[0], made[2]]
    by_attempts = cli.json("items", "list", "--sort", "-attempts")
    assert [i["item_id"] for i in by_attempts] == [made[1], made[3], made[2], made[0]]
    table = cli.run("items", "list", "--sort", "-priority", "--wide").stdout
    assert "priority" in table
    assert " 2/" in table  # made[1]'s two tries

    wrong = cli.run("items", "list", "--sort", "newest", ok=False)
    assert wrong.returncode != 0
    assert "--sort" in wrong.stderr
    assert "-created" in wrong.stderr
