"""The guides' `queue-server` (tests/helpers/cli_relay.py): a command forked by the CLI's
fork server that a shell cannot tell from the console script's process."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from tests.helpers.api import Api
from tests.helpers.cli import Cli, cli_forks, lines


def _relay() -> str:
    return str(Path(cli_forks().relay_dir()) / "queue-server")


def _commands() -> list[int]:
    """The fork server's children: the commands running now."""
    server = cli_forks().proc.pid
    children = Path(f"/proc/{server}/task/{server}/children").read_text().split()
    return [int(pid) for pid in children]


def _wait_for(path: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def _waiting_worker(cli: Cli) -> subprocess.Popen[bytes]:
    """A relayed `work` command on an empty queue, once its command runs."""
    waiting = subprocess.Popen(
        [_relay(), "work", "jobs", "--", "cat"],
        env=cli.env_for("worker"),
        cwd=cli.cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while not _commands():
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.05)
    return waiting


def test_a_relayed_command_answers_with_its_output_and_exit_status(cli: Cli, api: Api) -> None:
    item = api.enqueue("jobs", {"n": 1})
    shown = subprocess.run(
        [_relay(), "items", "show", str(item["item_id"]), "--json"],
        env=cli.env_for("operator"),
        cwd=cli.cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert '"state": "ready"' in shown.stdout.replace('":"', '": "')
    usage = subprocess.run(
        [_relay(), "items", "show"], env=cli.env_for("operator"), capture_output=True, text=True
    )
    assert usage.returncode == 2, usage  # a usage error, as the console script exits
    assert "Missing argument" in usage.stderr


def test_a_signal_to_the_relay_reaches_its_command(cli: Cli, api: Api) -> None:
    started = cli.cwd / "started"
    script = cli.script("steady.sh", f"cat >/dev/null; echo go > {started}; sleep 1; echo fine\n")
    api.enqueue("jobs", 1)
    worker = subprocess.Popen(
        [_relay(), "work", "jobs", "--grace", "20", "--json", "--", script],
        env=cli.env_for("worker"),
        cwd=cli.cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _wait_for(started)
    worker.send_signal(signal.SIGTERM)  # a graceful stop: the item in hand completes
    stdout, stderr = worker.communicate(timeout=30)
    assert worker.returncode == 0, stderr
    assert [r["outcome"] for r in lines(stdout)] == ["completed"], (stdout, stderr)


def test_a_command_ended_by_a_signal_ends_its_relay_by_the_same_signal(cli: Cli) -> None:
    waiting = _waiting_worker(cli)
    (command,) = _commands()
    os.kill(command, signal.SIGKILL)
    assert waiting.wait(timeout=20) == -signal.SIGKILL


def test_a_relay_killed_outright_takes_its_command_with_it(cli: Cli) -> None:
    waiting = _waiting_worker(cli)
    waiting.kill()
    waiting.wait(timeout=20)
    deadline = time.monotonic() + 20
    while _commands():
        assert time.monotonic() < deadline, "the command outlived its relay"
        time.sleep(0.05)
