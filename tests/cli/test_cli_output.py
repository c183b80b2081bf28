"""What the CLI prints, as an operator reads it: ids named by their start or their end,
one flag for one thing, counts with their noun, and every time in one format."""

from __future__ import annotations

import json
import re

from tests.helpers.api import Api
from tests.helpers.cli import Cli
from tests.helpers.items import quarantine

# `when` in queue_server/cli/common.py: local time with its zone, to the second.
TIME = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} [A-Z+\-0-9]+")


def test_an_item_is_named_by_the_end_of_its_id_for_show_and_cancel(cli: Cli, api: Api) -> None:
    kept = str(api.enqueue("mail", "keep")["item_id"])
    gone = str(api.enqueue("mail", "cancel me")["item_id"])
    # The end a list shows tells two items apart where their starts (the time) do not.
    assert cli.json("items", "show", kept[-8:])["item_id"] == kept
    assert cli.json("items", "ledger", kept[-12:])[0]["kind"] == "enqueued"
    (cancelled,) = cli.json("items", "cancel", gone[-8:], "--reason", "by its end")
    assert (cancelled["item_id"], cancelled["state"]) == (gone, "cancelled")
    (by_start,) = cli.json("items", "cancel", kept[:-4], "--reason", "by its start")
    assert by_start["item_id"] == kept
    missing = cli.run("items", "cancel", "0123abcd", ok=False)
    assert missing.returncode == 4
    assert "not found" in missing.stderr.lower()


def test_items_list_quiet_is_dash_q_and_counts_say_item_or_items(cli: Cli, api: Api) -> None:
    only = str(api.enqueue("one", "x")["item_id"])
    api.enqueue("two", "y")
    assert cli.run("items", "list", "--queue", "one", "-q").stdout == f"{only}\n"
    table = cli.run("items", "list", "--queue", "one").stdout
    assert table.splitlines()[0].startswith("1 item")
    assert "1 items" not in table
    assert cli.run("items", "list").stdout.splitlines()[0].startswith("2 items")


def test_queues_show_and_spend_show_print_counts_and_times_as_tables_do(cli: Cli, api: Api) -> None:
    api.enqueue("mail", "x")
    cli.run("queues", "pause", "mail", "--reason", "provider outage")
    shown = cli.run("queues", "show", "mail").stdout
    assert "1 ready" in shown
    assert "{" not in shown  # no JSON dict
    (paused,) = [line for line in shown.splitlines() if line.strip().startswith("paused")]
    assert TIME.search(paused), paused
    assert "+00:00" not in paused  # not Python's str() of a datetime

    approve = ("spend", "approve", "mail", "--max-concurrency", "2", "--expires", "2h")
    approved = cli.run(*approve, "--reason", "launch").stdout
    (expires,) = [
        line.strip() for line in cli.run("spend", "show", "mail").stdout.splitlines()
        if line.strip().startswith("expires")
    ]  # fmt: skip
    assert TIME.search(expires), expires
    assert not re.search(r"\dT\d", expires)  # not the JSON's ISO 8601
    # the approval's own answer names the same time, in the same format
    assert TIME.search(expires).group(0) in approved, approved  # type: ignore[union-attr]


def test_queues_show_gives_the_named_queues_figures_and_zeros_for_one_without_items(
    cli: Cli, api: Api
) -> None:
    api.enqueue("mail", "x")
    for n in range(2):
        api.enqueue("news", n)
    shown = {q: cli.json("queues", "show", q) for q in ("mail", "news", "idle")}
    assert {q: (s["queue"], s["ready"]) for q, s in shown.items()} == {
        "mail": ("mail", 1),
        "news": ("news", 2),
        "idle": ("idle", 0),
    }
    assert "2 ready" in cli.run("queues", "show", "news").stdout


def test_tenants_list_json_leaves_out_what_the_list_does_not_count(cli: Cli, api: Api) -> None:
    api.enqueue("mail", "x")
    (acme,) = [t for t in cli.json("tenants", "list", role="admin") if t["tenant"] == "acme"]
    assert acme["backlog"] == 1
    assert None not in {acme.get(k, 0) for k in ("ready", "leased", "completed")}
    assert "ready" not in acme
    assert cli.json("tenants", "show", "acme", role="admin")["ready"] == 1


def test_schedules_list_keeps_names_whole_at_80_columns(cli: Cli, api: Api) -> None:
    cli.run("schedules", "put", "heartbeat", "--queue", "pings", "--cron", "*/5 * * * *")
    cli.env = {**cli.env, "COLUMNS": "80"}
    out = cli.run("schedules", "list").stdout
    assert re.search(r"│ heartbeat +│ pings +│", out), out
    assert max(len(line) for line in out.splitlines()) <= 80, out
    assert "--wide shows every column" in out


def test_items_retry_and_delete_by_filter_and_the_ledger_still_verifies(cli: Cli, api: Api) -> None:
    poisoned = [quarantine(api, "q", f"p{n}") for n in range(3)]
    retried = cli.run("items", "retry", "--state", "quarantined", "--queue", "q", "--yes")
    assert retried.stdout == "3 items retried\n"
    for item_id in poisoned:
        assert cli.json("items", "show", item_id)["state"] == "ready"
        (lease,) = api.acquire("q")
        done = api.holder("complete", lease["item_id"], worker="w1", fence=lease["fence"])
        assert done.status_code == 200, done.text
    assert cli.json("items", "delete", "--state", "completed", "--batch", "2", "--yes") == {
        "deleted": 3
    }
    assert cli.run("items", "show", poisoned[0], ok=False).returncode == 4
    verified = cli.json("ledger", "verify")
    assert (verified["checked"], verified["mismatches"]) == (0, [])

    # At the cap: what fits is retried, the command says the rest waits, and exits 4.
    more = [quarantine(api, "q", f"m{n}") for n in range(2)]
    api.enqueue("q", "holds the backlog")
    cli.run("tenants", "put", "acme", "--backlog-cap", "2", "--yes", role="admin")
    capped = cli.run("items", "retry", "--state", "quarantined", "--yes", ok=False)
    assert capped.returncode == 4
    assert capped.stdout == "1 item retried\n"
    assert "The backlog is at its cap" in capped.stderr
    states = sorted(cli.json("items", "show", i)["state"] for i in more)
    assert states == ["quarantined", "ready"]
    refused = cli.run("items", "delete", "--state", "ready", "--yes", ok=False)
    assert refused.returncode == 2


def test_items_retry_goes_through_every_batch_of_the_filter(cli: Cli, api: Api) -> None:
    poisoned = [quarantine(api, "q", f"p{n}") for n in range(3)]
    retried = cli.json("items", "retry", "--state", "quarantined", "--batch", "1", "--yes")
    assert retried == {"retried": 3, "stopped_at_the_cap": False}
    assert {cli.json("items", "show", i)["state"] for i in poisoned} == {"ready"}


def test_items_retry_with_no_room_under_the_cap_says_it_stopped_there(cli: Cli, api: Api) -> None:
    poisoned = quarantine(api, "q", "poison")
    api.enqueue("q", "holds the backlog")
    cli.run("tenants", "put", "acme", "--backlog-cap", "1", "--yes", role="admin")
    capped = cli.run("items", "retry", "--state", "quarantined", "--yes", "--json", ok=False)
    assert capped.returncode == 4
    assert json.loads(capped.stdout) == {"retried": 0, "stopped_at_the_cap": True}
    assert "The backlog is at its cap" in capped.stderr
    assert cli.json("items", "show", poisoned)["state"] == "quarantined"
