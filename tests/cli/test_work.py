"""`queue-server work` end to end: real commands, real leases, real signals."""

from __future__ import annotations

import os
import pty
import re
import signal
import subprocess
import time
from datetime import datetime
from pathlib import Path

import psycopg
import pytest

from queue_server.client import Job, Outcome, QueueClient, Result, TransientError, Worker, errors
from tests.helpers.api import Api
from tests.helpers.cli import BIN, Cli, lines

DB = psycopg.Connection[dict[str, object]]

# Dispatches on the payload: "ok" succeeds with JSON, "flaky" fails transiently on its
# first acquisition then prints text, "broken" fails until the file $FIXED exists.
JOB = """
payload=$(cat)
case "$payload" in
  *flaky*) [ "$QS_ACQUISITION_COUNT" = 1 ] && { echo "not yet" >&2; exit 75; }
           echo "ok after $QS_ACQUISITION_COUNT"; exit 0 ;;
  *broken*) [ -e "$FIXED" ] || { echo "boom" >&2; exit 3; } ;;
esac
printf '{"payload": %s, "item": "%s", "fence": %s}\\n' "$payload" "$QS_ITEM_ID" "$QS_FENCE"
"""


def wait_for(path: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text().strip():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_a_failed_commands_last_4_kib_of_stderr_is_its_items_traceback(cli: Cli, api: Api) -> None:
    # 10,000 bytes of stderr, then 3,000 two-byte characters (the 4 KiB cut falls inside
    # one of them), then the last words.
    script = cli.script(
        "noisy.sh",
        "cat >/dev/null\n"
        "i=0; while [ $i -lt 100 ]; do printf '%099d\\n' $i >&2; i=$((i+1)); done\n"
        "printf 'é%.0s' $(seq 1 3000) >&2; echo ' traceback ends here' >&2; exit 1\n",
    )
    item = api.enqueue("noisy", "x", max_acquisitions=1)
    cli.run("work", "noisy", "--drain", "--", script, role="worker", ok=False)
    failure = cli.json("items", "show", str(item["item_id"]))["last_failure"]
    trace = failure["traceback"]
    # The last 4,096 bytes, less the half character the cut left: 4,095.
    assert trace == "é" * 2037 + " traceback ends here\n"
    ledger = cli.json("items", "ledger", str(item["item_id"]))
    (triaged,) = [e for e in ledger if e["kind"] == "triaged"]
    assert triaged["data"]["failure"]["traceback"] == trace


@pytest.mark.slow
def test_work_completes_retries_and_quarantines_then_a_replay_completes(cli: Cli, api: Api) -> None:
    script = cli.script("job.sh", JOB)
    fixed = cli.cwd / "fixed"
    cli.env["FIXED"] = str(fixed)
    ok = api.enqueue("jobs", "ok", priority=3)
    flaky = api.enqueue("jobs", "flaky", priority=2)
    broken = api.enqueue("jobs", "broken", priority=1, max_acquisitions=2)

    done = cli.run(
        "work", "jobs", "--drain", "--json", "--lease-ttl", "5", "--", script, role="worker",
        ok=False,
    )  # fmt: skip
    assert done.returncode == 1  # --drain with failed items: exit 1, not 0
    outcomes = [(r["item_id"], r["outcome"]) for r in lines(done.stdout)]
    assert outcomes.count((ok["item_id"], "completed")) == 1
    assert outcomes.count((flaky["item_id"], "triaged")) == 1
    assert outcomes.count((flaky["item_id"], "completed")) == 1
    assert outcomes.count((broken["item_id"], "triaged")) == 2
    assert "boom" in done.stderr

    first = cli.json("items", "show", str(ok["item_id"]))
    assert first["state"] == "completed"
    assert first["result"] == {"payload": "ok", "item": ok["item_id"], "fence": 1}
    second = cli.json("items", "show", str(flaky["item_id"]))
    assert (second["state"], second["result"]) == ("completed", "ok after 2")
    assert second["last_failure"]["transient"] is True
    third = cli.json("items", "show", str(broken["item_id"]))
    assert third["state"] == "quarantined"
    assert third["last_failure"]["message"] == "exit 3: boom"
    assert third["last_failure"]["transient"] is False
    assert third["last_failure"]["traceback"] == "boom\n"  # the command's stderr

    (dead,) = cli.json("dead-letters", "list", "--queue", "jobs")
    assert dead["item_id"] == broken["item_id"]
    assert dead["reason"] == "acquisition budget exhausted"
    fixed.touch()
    cli.run("dead-letters", "replay", dead["dead_letter_id"])
    again = cli.run(
        "work", "jobs", "--drain", "--json", "--lease-ttl", "5", "--", script, role="worker"
    )
    assert [r["outcome"] for r in lines(again.stdout)] == ["completed"]
    assert again.returncode == 0  # every item completed
    final = cli.json("items", "show", str(broken["item_id"]))
    assert final["state"] == "completed"
    assert final["fence"] == 3  # two failed acquisitions, then the one after the replay
    # The command saw that fence, not its acquisition count (renewed by the replay).
    assert final["result"] == {"payload": "broken", "item": broken["item_id"], "fence": 3}
    assert final["acquisition_count"] == 1
    kinds = [e["kind"] for e in cli.json("items", "ledger", str(broken["item_id"]))]
    assert kinds == [
        "enqueued",
        "acquired",
        "triaged",
        "acquired",
        "triaged",  # its last attempt: dead-lettered by this triage
        "replayed",
        "acquired",
        "completed",
    ]
    assert cli.json("ledger", "verify")["mismatches"] == []


def test_a_killed_worker_is_taken_over_and_the_item_completes_once(
    cli: Cli, api: Api, db: DB
) -> None:
    block = cli.cwd / "block"
    block.touch()
    pid_file = cli.cwd / "child.pid"
    script = cli.script(
        "slow.sh",
        f"""
cat >/dev/null
if [ -e {block} ]; then echo $$ > {pid_file}; exec sleep 30; fi
echo '"done by '"$QS_WORKER"' at fence '"$QS_FENCE"'"'
""",
    )
    item = api.enqueue("jobs", "slow")
    first = cli.popen("work", "jobs", "--name", "doomed", "--lease-ttl", "2", "--", script)
    try:
        wait_for(pid_file)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        os.kill(int(pid_file.read_text()), signal.SIGKILL)  # the orphaned command
    block.unlink()
    held = cli.json("items", "show", str(item["item_id"]))
    assert (held["state"], held["lease_holder"], held["fence"]) == ("leased", "doomed", 1)
    # Nobody heartbeats any more; let the lease run out now instead of waiting for it.
    db.execute(
        "UPDATE work_items SET lease_expires_at = now() - interval '1 second' WHERE item_id = %s",
        (item["item_id"],),
    )
    done = cli.run(
        "work", "jobs", "--name", "heir", "--drain", "--json", "--", script, role="worker"
    )
    assert [(r["outcome"], r["fence"]) for r in lines(done.stdout)] == [("completed", 2)]
    final = cli.json("items", "show", str(item["item_id"]))
    assert final["result"] == "done by heir at fence 2"
    kinds = [e["kind"] for e in cli.json("items", "ledger", str(item["item_id"]))]
    assert kinds.count("completed") == 1
    # The killed worker's late complete would be refused.
    with (
        QueueClient(api.url, api.keys["worker"], tenant="acme") as qs,
        pytest.raises(errors.LeaseLostError),
    ):
        qs.complete(str(item["item_id"]), worker="doomed", fence=1, result="late")


def test_sigterm_lets_the_command_finish_within_the_grace_period(cli: Cli, api: Api) -> None:
    started = cli.cwd / "started"
    script = cli.script("steady.sh", f"cat >/dev/null; echo go > {started}; sleep 1; echo fine\n")
    item = api.enqueue("jobs", 1)
    worker = cli.popen("work", "jobs", "--grace", "20", "--json", "--", script)
    wait_for(started)
    worker.send_signal(signal.SIGTERM)
    stdout, stderr = worker.communicate(timeout=30)
    assert worker.returncode == 0, stderr
    assert [r["outcome"] for r in lines(stdout)] == ["completed"], (stdout, stderr)
    assert cli.json("items", "show", str(item["item_id"]))["result"] == "fine"


def test_past_the_grace_period_the_command_is_killed_and_the_item_requeued(
    cli: Cli, api: Api
) -> None:
    started = cli.cwd / "started"
    script = cli.script("stuck.sh", f"cat >/dev/null; echo go > {started}; exec sleep 60\n")
    item = api.enqueue("jobs", 1)
    worker = cli.popen("work", "jobs", "--grace", "0.5", "--json", "--", script)
    wait_for(started)
    worker.send_signal(signal.SIGINT)
    stdout, stderr = worker.communicate(timeout=30)
    assert worker.returncode == 0, stderr
    assert [r["outcome"] for r in lines(stdout)] == ["requeued"]
    now = cli.json("items", "show", str(item["item_id"]))
    assert (now["state"], now["lease_holder"]) == ("ready", None)
    kinds = [e["kind"] for e in cli.json("items", "ledger", str(item["item_id"]))]
    assert kinds[-1] == "requeued"


def test_a_lost_lease_stops_the_command_and_the_run_exits_1(cli: Cli, api: Api, db: DB) -> None:
    started = cli.cwd / "started"
    script = cli.script("stuck.sh", f"cat >/dev/null; echo go > {started}; exec sleep 60\n")
    item = api.enqueue("jobs", 1)
    worker = cli.popen(
        "work", "jobs", "--lease-ttl", "3", "--max-items", "1", "--json", "--", script
    )
    wait_for(started)
    # Its lease runs out and another worker takes the item: the next heartbeat is refused.
    db.execute(
        "UPDATE work_items SET lease_expires_at = now() - interval '1 second' WHERE item_id = %s",
        (item["item_id"],),
    )
    with QueueClient(api.url, api.keys["worker"], tenant="acme") as qs:
        (taken,) = qs.acquire("jobs", worker="heir")
    stdout, stderr = worker.communicate(timeout=30)
    assert [r["outcome"] for r in lines(stdout)] == ["lost"], (stdout, stderr)
    assert worker.returncode == 1, stderr
    now = cli.json("items", "show", str(item["item_id"]))
    assert (now["lease_holder"], now["fence"], now["result"]) == ("heir", taken.fence, None)


def test_concurrency_is_capped_by_the_queue_limit(cli: Cli, api: Api) -> None:
    api.approve("wide", 2)
    log = cli.cwd / "log"
    script = cli.script(
        "par.sh", f"cat >/dev/null; echo start >> {log}; sleep 0.5; echo end >> {log}\n"
    )
    for n in range(4):
        api.enqueue("wide", n)
    done = cli.run(
        "work",
        "wide",
        "--concurrency",
        "8",
        "--drain",
        "--json",
        "--wait",
        "0",
        "--",
        script,
        role="worker",
    )
    assert [r["outcome"] for r in lines(done.stdout)] == ["completed"] * 4
    assert "allows 2 lease(s) at once" in done.stderr
    running = peak = 0
    for event in log.read_text().split():
        running += 1 if event == "start" else -1
        peak = max(peak, running)
    assert peak == 2


def test_on_a_terminal_one_status_line_tracks_the_work_and_a_summary_ends_it(
    cli: Cli, api: Api
) -> None:
    api.approve("jobs", 8)
    script = cli.script(
        "pick.sh", 'payload=$(cat); [ "$payload" = 3 ] && { echo no >&2; exit 3; }; echo ok\n'
    )
    for n in range(12):
        api.enqueue("jobs", n, max_acquisitions=1)
    primary, replica = pty.openpty()
    try:
        done = subprocess.run(
            [
                str(BIN),
                "work",
                "jobs",
                "--drain",
                "--wait",
                "0",
                "--concurrency",
                "4",
                "--",
                script,
            ],
            env={**cli.env_for("worker"), "TERM": "xterm", "COLUMNS": "120"},
            stdout=subprocess.PIPE,
            stderr=replica,
            stdin=subprocess.DEVNULL,
            timeout=60,
            cwd=cli.cwd,
        )
        os.close(replica)
        screen = b""
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:
                break
            if not chunk:
                break
            screen += chunk
    finally:
        os.close(primary)
    assert done.returncode == 1  # some items failed
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.decode(errors="replace"))
    # The live line: done, failed, in flight, items/s.
    assert re.search(r"done \d+ · failed \d+ · in flight \d+ · [\d,]+ items/s", text), text
    # Only the failure gets a line of its own; completed items are in the count.
    assert re.search(r"triaged\s+\S+ fence 1 {2}exit 3: no", text), text
    assert "completed   " not in text
    assert re.search(r"worker \S+: 11 completed, 1 triaged in [\d.]+s \([\d,]+ items/s\)", text), (
        text
    )
    assert done.stdout == b""


def test_an_exit_75_item_backs_off_through_the_queue_within_the_policy(cli: Cli, api: Api) -> None:
    item = api.enqueue("q", {"n": 1}, max_acquisitions=5)
    script = cli.script("busy.sh", "exit 75\n")
    done = cli.run(
        "work",
        "q",
        "--retry-delay",
        "30",
        "--max-items",
        "1",
        "--json",
        "--",
        script,
        role="worker",
        ok=False,
    )
    assert done.returncode == 1  # with --max-items, an item not completed is a failure
    assert [line["outcome"] for line in lines(done.stdout)] == ["triaged"]
    shown = api.worker.get(f"/v1/tenants/acme/items/{item['item_id']}").json()
    due_in = datetime.fromisoformat(shown["available_at"]) - datetime.fromisoformat(
        shown["updated_at"]
    )
    assert (shown["state"], due_in.total_seconds()) == ("ready", 30)
    refused = cli.run("work", "q", "--retry-delay", "301", "--drain", "--", script, ok=False)
    assert refused.returncode == 1
    assert "durable-leased-work/backoff-and-jitter" in refused.stderr


def test_a_handler_backs_off_an_item_with_a_delay_instead_of_a_retry_loop(api: Api) -> None:
    api.enqueue("q", {"n": 1}, max_acquisitions=5)

    def busy(job: Job) -> None:
        raise TransientError("the dependency is busy", delay=12)

    with QueueClient(api.url, api.keys["worker"], tenant="acme") as qs:
        results: list[Result] = []
        Worker(qs, "q", busy, wait=0, on_result=results.append).run(max_items=1)
        assert [r.outcome for r in results] == [Outcome.TRIAGED]
    shown = api.worker.get(f"/v1/tenants/acme/items/{results[0].item_id}").json()
    due_in = datetime.fromisoformat(shown["available_at"]) - datetime.fromisoformat(
        shown["updated_at"]
    )
    assert due_in.total_seconds() == 12
    assert api.acquire() == []  # not due yet: no client retry loop ran it again


def test_a_command_is_told_its_tenant_queue_and_worker_and_a_blank_output_is_no_result(
    cli: Cli, api: Api
) -> None:
    script = cli.script(
        "env.sh",
        'payload=$(cat)\ncase "$payload" in *blank*) echo; exit 0 ;; esac\n'
        'printf \'{"tenant": "%s", "queue": "%s", "worker": "%s"}\\n\' '
        '"$QS_TENANT" "$QS_QUEUE" "$QS_WORKER"\n',
    )
    named = api.enqueue("envq", "named")
    blank = api.enqueue("envq", "blank")
    cli.run("work", "envq", "--drain", "--name", "w-env", "--", script, role="worker")
    shown = cli.json("items", "show", str(named["item_id"]))
    assert shown["result"] == {"tenant": api.tenant, "queue": "envq", "worker": "w-env"}
    # A line with nothing on it says nothing: no result, not an empty string.
    assert cli.json("items", "show", str(blank["item_id"]))["result"] is None
