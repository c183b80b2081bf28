"""`queue-server schedules ...` against the real server."""

from __future__ import annotations

from tests.helpers.cli import Cli


def test_schedules_put_list_show_pause_resume_trigger_delete(cli: Cli) -> None:
    saved = cli.json(
        "schedules",
        "put",
        "nightly",
        "--queue",
        "reports",
        "--cron",
        "30 2 * * *",
        "--tz",
        "Europe/Berlin",
        "--catch-up",
        "all-bounded",
        "--payload",
        '{"report": "sales"}',
    )
    assert (saved["schedule"], saved["cron"], saved["timezone"]) == (
        "nightly",
        "30 2 * * *",
        "Europe/Berlin",
    )
    assert (saved["payload"], saved["catch_up"]) == ({"report": "sales"}, "all-bounded")
    assert len(saved["next_fires"]) == 5

    cli.run("schedules", "put", "hourly", "-q", "q", "--every", "3600")
    table = cli.run("schedules", "list").stdout
    assert "nightly" in table
    assert "30 2 * * * (Europe/Berlin)" in table
    assert "every 3600s" in table
    assert [s["schedule"] for s in cli.json("schedules", "list")] == ["hourly", "nightly"]

    shown = cli.run("schedules", "show", "nightly").stdout
    assert "next fires (UTC)" in shown
    assert saved["next_fires"][0][:10] in shown

    paused = cli.json("schedules", "pause", "nightly")
    assert (paused["paused"], paused["next_fires"]) == (True, [])
    fired = cli.run("schedules", "trigger", "nightly").stdout
    assert "enqueued item" in fired
    assert "on reports" in fired
    detail = cli.json("schedules", "show", "nightly")
    assert [(f["kind"], f["outcome"]) for f in detail["recent_fires"]] == [("trigger", "enqueued")]
    resumed = cli.json("schedules", "resume", "nightly")
    assert resumed["paused"] is False
    assert len(resumed["next_fires"]) == 5

    assert "deleted" in cli.run("schedules", "delete", "nightly").stdout
    gone = cli.run("schedules", "show", "nightly", ok=False)
    assert gone.returncode == 4  # refused: not found
    assert "Schedule not found" in gone.stderr
    assert "schedule-not-found" in gone.stderr


def test_schedules_refusals_exit_with_their_status_and_the_reason(cli: Cli) -> None:
    both = cli.run(
        "schedules", "put", "s", "-q", "q", "--cron", "* * * * *", "--every", "5", ok=False
    )
    assert both.returncode == 2  # usage
    assert "exactly one of --cron and --every" in both.stderr
    bad_json = cli.run(
        "schedules", "put", "s", "-q", "q", "--every", "5", "--payload", "{", ok=False
    )
    assert bad_json.returncode == 4  # validation
    assert "Invalid payload" in bad_json.stderr
    bad_cron = cli.run("schedules", "put", "s", "-q", "q", "--cron", "0 0 30 2 *", ok=False)
    assert bad_cron.returncode == 4
    assert "never fires" in bad_cron.stderr
    bad_zone = cli.run(
        "schedules", "put", "s", "-q", "q", "--every", "5", "--tz", "Nowhere", ok=False
    )
    assert bad_zone.returncode == 4
    assert "Unknown time zone" in bad_zone.stderr
    worker = cli.run("schedules", "list", role="worker", ok=False)
    assert worker.returncode == 4
    assert "forbidden-role" in worker.stderr
    usage = cli.run("schedules", "put", "s", ok=False)
    assert usage.returncode == 2
    assert "--queue" in usage.stderr
    helped = cli.run("schedules", "--help").stdout
    for command in ("list", "show", "put", "pause", "resume", "trigger", "delete"):
        assert command in helped
