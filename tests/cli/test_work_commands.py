"""How `queue-server work` talks to its command: stdin in, stdout and stderr out, the exit
watched, and a stop asked for while it runs; both ways (pidfd, and the polling fallback).
And how it stops one: SIGTERM to its process group, then SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable

import pytest

from queue_server.cli.work import KILL_AFTER, _converse, _converse_polling, _stop

Converse = Callable[..., tuple[bytes, bytes] | None]
WAYS = [pytest.param(_converse, id="pidfd"), pytest.param(_converse_polling, id="polling")]


def _start(*command: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        list(command),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


@pytest.mark.parametrize("converse", WAYS)
def test_a_payload_larger_than_a_pipe_comes_back_whole(converse: Converse) -> None:
    data = bytes(range(256)) * 4096  # 1 MiB: many pipe buffers each way
    proc = _start("cat")
    assert converse(proc, data, lambda: False) == (data, b"")
    assert proc.returncode == 0


@pytest.mark.parametrize("converse", WAYS)
def test_stderr_and_the_exit_code_are_kept_apart_from_stdout(converse: Converse) -> None:
    proc = _start("sh", "-c", "cat >/dev/null; echo out; echo oops >&2; exit 3")
    assert converse(proc, b'{"n": 1}', lambda: False) == (b"out\n", b"oops\n")
    assert proc.returncode == 3


@pytest.mark.parametrize("converse", WAYS)
def test_a_command_that_never_reads_its_stdin_is_not_waited_on_for_it(
    converse: Converse,
) -> None:
    proc = _start("sh", "-c", "echo done")
    assert converse(proc, b"x" * (4 << 20), lambda: False) == (b"done\n", b"")
    assert proc.returncode == 0


@pytest.mark.parametrize("converse", WAYS)
def test_an_empty_payload_closes_stdin_at_once(converse: Converse) -> None:
    proc = _start("cat")
    assert converse(proc, b"", lambda: False) == (b"", b"")


@pytest.mark.parametrize("converse", WAYS)
def test_a_stop_asked_for_while_it_runs_returns_without_waiting_for_it(
    converse: Converse,
) -> None:
    proc = _start("sleep", "30")
    asked_at = time.monotonic() + 0.3
    started = time.monotonic()
    assert converse(proc, b"", lambda: time.monotonic() > asked_at) is None
    assert time.monotonic() - started < 5
    assert proc.poll() is None  # still running: stopping it is the caller's (`_stop`)
    proc.kill()
    proc.wait()


def test_a_process_left_holding_the_pipe_still_hears_the_stop() -> None:
    # The command exits at once; what it started in the background keeps stdout open.
    proc = _start("sh", "-c", "sleep 30 & echo started")
    asked_at = time.monotonic() + 0.5
    assert _converse(proc, b"", lambda: time.monotonic() > asked_at) is None
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_a_command_that_ignores_sigterm_is_killed_shortly_after() -> None:
    started = _start("sh", "-c", "trap '' TERM; echo ready; exec sleep 30")
    assert started.stdout is not None
    assert started.stdout.readline() == b"ready\n"  # its trap is set
    asked = time.monotonic()
    _stop(started)
    took = time.monotonic() - asked
    assert started.returncode == -signal.SIGKILL
    assert KILL_AFTER - 0.5 < took < KILL_AFTER + 5
