"""`queue-server items dependencies`: a fan-in's outcomes from the command line, every page
of them, counted by state, with the failures alone on demand."""

from __future__ import annotations

import re
import uuid

from tests.helpers.cli import Cli
from tests.helpers.items import quarantine_lease


def test_a_callback_s_dependencies_are_read_whole_counted_and_filtered(cli: Cli) -> None:
    api = cli.api
    api.approve("parts", 100)
    assert api.admin.put(f"/v1/tenants/{api.tenant}", json={"backlog_cap": 2_000}).is_success
    path = f"/v1/tenants/{api.tenant}/queues/parts/items:batch"
    first = api.worker.post(
        path,
        json={"items": [{"payload": n} for n in range(500)]},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert first.status_code == 201, first.text
    earlier = [i["item_id"] for i in first.json()["items"]]
    last = api.worker.post(
        path,
        json={
            "items": [{"payload": n} for n in range(500, 600)],
            "callback": {"payload": "sum", "depends_on": earlier},
        },
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert last.status_code == 201, last.text
    callback = last.json()["callback"]["item_id"]
    (failing,) = api.acquire("parts")
    quarantine_lease(api, failing)
    for lease in api.acquire("parts", max_items=100)[:40]:
        done = api.holder("complete", lease["item_id"], worker="w1", fence=lease["fence"])
        assert done.status_code == 200, done.text

    shown = cli.run("items", "dependencies", callback[-8:])
    assert (
        "600 dependencies: 40 completed, 60 leased, 1 quarantined, 499 ready; it waits for"
        " 559 of them" in shown.stdout
    )  # the failure counts as finished for a callback (it runs anyway)
    assert "read 500 dependencies..." in shown.stderr  # two pages
    assert "Boom" in shown.stdout  # the failure, beside its item
    failed = cli.json("items", "dependencies", callback, "--state", "quarantined")
    assert [(i["item_id"], i["last_failure"]["class"]) for i in failed] == [
        (failing["item_id"], "Boom")
    ]
    ready = cli.run("items", "dependencies", callback, "--state", "ready", "--quiet")
    assert len(ready.stdout.split()) == 499


def test_items_workflow_numbers_each_step_after_the_longest_chain_before_it(cli: Cli) -> None:
    api = cli.api
    first = str(api.enqueue("steps", "extract")["item_id"])
    second = str(api.enqueue("steps", "transform", depends_on=[first])["item_id"])
    # Waits for both: it runs after the longer chain, first then second.
    third = str(api.enqueue("steps", "load", depends_on=[second, first])["item_id"])

    shown = cli.run("items", "workflow", second[-8:]).stdout
    assert "3 items" in shown
    rows = re.findall(
        r"│\s*(\d+)\s*│\s*([0-9a-f-]{36})\s*│\s*\S+\s*│\s*(\w+)\s*│\s*(\d+)\s*│", shown
    )
    assert rows == [
        ("1", first, "ready", "0"),
        ("2", second, "waiting", "1"),
        ("3", third, "waiting", "2"),
    ], shown
