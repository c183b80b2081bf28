"""`queue-server spend concurrency`: sets the queue's concurrency below the approved limit,
refuses above it with exit 4 naming the limit, and `spend show` says what sets the limit."""

from __future__ import annotations

from tests.helpers.api import Api
from tests.helpers.cli import Cli


def test_spend_concurrency_sets_refuses_and_follows_the_approval(cli: Cli, api: Api) -> None:
    refused = cli.run("spend", "concurrency", "q", "3", ok=False)
    assert refused.returncode == 4, refused.stdout + refused.stderr
    assert "approved limit, 1" in refused.stdout + refused.stderr
    api.approve("q", 8)
    assert cli.json("spend", "concurrency", "q", "3", "--reason", "throttled")["limit"] == 3
    shown = cli.run("spend", "show", "q").stdout
    fields = {
        line.rsplit(None, 1)[0].strip(): line.rsplit(None, 1)[1]
        for line in shown.splitlines()
        if len(line.split()) > 1
    }
    assert (fields["limit"], fields["approved limit"], fields["queue's concurrency"]) == (
        "3",
        "8",
        "3",
    )
    both = cli.run("spend", "concurrency", "q", "3", "--follow-approval", ok=False)
    assert both.returncode != 0
    assert "not both" in both.stdout + both.stderr
    followed = cli.json("spend", "concurrency", "q", "--follow-approval")
    assert (followed["limit"], followed["concurrency"]) == (8, None)
    # Both changes are in the queue's ledger, newest first, in words.
    ledger = cli.run("queues", "events", "q").stdout
    assert ledger.index("concurrency 3 -> the approved limit (approved 8)") < ledger.index(
        "concurrency the approved limit -> 3 (approved 8): throttled"
    ), ledger
    (latest, *_) = cli.json("queues", "events", "q")
    assert (latest["kind"], latest["data"]["after"]) == ("concurrency", None)
    # A worker key reads the limit but may not set it.
    assert cli.run("spend", "concurrency", "q", "2", role="worker", ok=False).returncode != 0


def test_queues_events_tells_each_kind_of_event_in_words(cli: Cli, api: Api) -> None:
    cli.run("queues", "pause", "q", "--reason", "provider down")
    cli.run("queues", "resume", "q", "--reason", "back")
    cli.run("queues", "settings", "q", "--max-acquisitions", "4")
    events = cli.run("queues", "events", "q").stdout
    lines = [line for line in events.splitlines() if "│" in line]
    said = " ".join(events.split())
    assert "paused: provider down" in said, events
    assert "resumed: back" in said, events
    assert "settings: max_acquisitions None -> 4" in said, events
    # Newest first.
    assert said.index("settings:") < said.index("resumed: back") < said.index("paused:")
    assert len(lines) >= 3
