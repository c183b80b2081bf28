"""The README's quick start and every guide's shell blocks, run as written.

A newcomer's first hour: a fresh HOME, `make serve ARGS="--port N"` on a port
that is not the default, and each document's shell blocks pasted in order into
one shell (a second terminal), with `set -e`: a command that fails fails the
test. Shell blocks are the fences labelled sh, bash or shell. A block that must not run (a server that runs until Ctrl-C) says so
right above its fence: `<!-- not run: why -->`.

The guides that go on from the README's tenant run after it, on its server; the guides
that set up their own tenant (ON_THEIR_OWN) each run on a fresh server of their own, so
the three tests run side by side in the suite's workers.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.helpers import web
from tests.helpers.cli import cli_forks

REPO = Path(__file__).resolve().parents[2]
GUIDES = sorted((REPO / "docs").glob("*.md"))
FENCE = re.compile(r"(<!-- not run: ([^>]*)-->\n)?```(\w*)\n(.*?)```", re.DOTALL)
SHELL = {"sh", "bash", "shell"}  # an unlabelled block (a diagram, a listing) is not run
# What a fresh machine has on PATH: not the project's .venv/bin (the README says how).
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEBIAN = ["curl", "make"]
COLUMNS = 80  # a newcomer's terminal: every table fits it, ids whole
TABLE_LINE = re.compile(r"^[┏┃┡│└]")
# Guides that make their own tenant and keys: each needs a server, not the README's state.
ON_THEIR_OWN = ("operators.md", "watchers.md")


def shell_blocks(path: Path) -> list[str]:
    """The shell blocks to run, in order; a block marked not to run must say why."""
    blocks = []
    for marker, reason, language, body in FENCE.findall(path.read_text()):
        if language not in SHELL:
            continue
        if marker:
            assert reason.strip(), f"{path.name}: a block marked not to run must say why"
            continue
        blocks.append(body)
    return blocks


@dataclass
class Served:
    home: Path
    port: int
    env: dict[str, str]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def served() -> Iterator[Served]:
    """`make serve ARGS="--port N"` in a fresh HOME: the data directory is its default."""
    subprocess.run([str(REPO / "deploy" / "ensure-debian-packages.sh"), *DEBIAN], check=True)
    # Not under pytest's basetemp, whose 0700 parents the database's own user cannot cross
    # (the session database in tests/conftest.py lives in a mkdtemp directory too).
    home = Path(tempfile.mkdtemp(prefix="qs-guide-home-"))
    # As root, PostgreSQL runs as a system user that must traverse to its data directory.
    home.chmod(0o711)
    port = _free_port()
    assert port != 8080
    env = {
        "HOME": str(home),
        "PATH": SYSTEM_PATH,
        "LANG": "C.UTF-8",
        "COLUMNS": str(COLUMNS),
        "NO_COLOR": "1",
        # The webhooks guide starts its server so; the others do not mind.
        "QUEUE_SERVER_TRANSPORT_ALLOW": '["127.0.0.1"]',
    }
    if os.geteuid() == 0:
        # Root's default is /var/lib/queue-server (shared by every run on the machine); the
        # guides find the data directory with `queue-server data-dir`, which reads this too.
        env["QUEUE_SERVER_DATA_DIR"] = str(home / ".local" / "share" / "queue-server")
    proc = subprocess.Popen(
        ["make", "--no-print-directory", "serve", f"ARGS=--port {port}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, proc.communicate()[0]
        assert time.monotonic() < deadline, "make serve did not become ready"
        try:
            if web.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
                break
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    try:
        yield Served(home=home, port=port, env=env)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        shutil.rmtree(home, ignore_errors=True)


def run_document(served: Served, document: Path, cwd: Path, path: str, logs: Path) -> str:
    """Every shell block of the document, in order, in one shell, as pasted."""
    blocks = shell_blocks(document)
    assert blocks, f"{document.name} has no shell block to run"
    script = "set -euo pipefail\n" + "\n".join(blocks)
    log = logs / f"{document.stem}.log"  # a file: what runs in the background keeps a pipe open
    with log.open("w") as handle:
        proc = subprocess.Popen(
            ["bash", "-c", script],
            cwd=cwd,
            env={**served.env, "PATH": path},
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # what the guide leaves in the background goes with it
        )
        try:
            proc.wait(timeout=100)
        except subprocess.TimeoutExpired:
            pass
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    out = log.read_text()
    assert proc.returncode == 0, f"{document.name} failed (exit {proc.returncode}):\n{out}"
    assert "Traceback" not in out, out
    too_wide = [line for line in out.splitlines() if TABLE_LINE.match(line) and len(line) > COLUMNS]
    assert not too_wide, f"{document.name}: tables wider than {COLUMNS} columns:\n" + "\n".join(
        too_wide
    )
    return out


ON_PATH = f"{REPO / '.venv' / 'bin'}:{SYSTEM_PATH}"  # as the README says


def run_guide(served: Served, name: str, tmp_path: Path) -> str:
    """The guide's blocks in a directory of its own, the project's commands on PATH.

    Its `queue-server` commands, a hundred in the guides, are forked from a process that has
    imported the CLI (tests/helpers/cli_relay.py): the same entry point with the same
    arguments, environment, streams and signals, without 0.3 s of CPU for each one's start.
    """
    cwd = tmp_path / Path(name).stem
    cwd.mkdir()
    path = f"{cli_forks().relay_dir()}:{ON_PATH}"
    return run_document(served, REPO / "docs" / name, cwd, path, cwd)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_readme_and_the_guides_that_follow_it_run_as_written(
    served: Served, tmp_path: Path
) -> None:
    # The README's second terminal: the repository's directory, a PATH without .venv/bin.
    out = run_document(served, REPO / "README.md", REPO, SYSTEM_PATH, tmp_path)
    data_dir = served.home / ".local" / "share" / "queue-server"
    assert (data_dir / "server.url").read_text().strip() == f"http://127.0.0.1:{served.port}"
    assert '"kind":"completed"' in out.replace(" ", "")  # the curl walk-through's ledger
    assert "1 completed" in out  # queue-server work --drain -- cat

    outputs = {}
    for guide in GUIDES:
        if not shell_blocks(guide) or guide.name in ON_THEIR_OWN:
            continue  # a guide without commands (its examples are run elsewhere, if any)
        outputs[guide.name] = run_guide(served, guide.name, tmp_path)
    assert "nightly" in outputs["schedules.md"]
    # The second item of an ordering key waits; the worker completes both, in order.
    flow = " ".join(outputs["flow-control.md"].split())  # as the terminal wrapped it
    assert "waiting behind the items before it with ordering key acct-9" in flow
    assert "2 completed" in flow
    assert "(completed) already holds unique key day-report" in flow  # unique for a day
    # Fair between partition keys: the small customer's item (enqueued fourth) right after
    # the big customer's first.
    made = re.findall(r"enqueued (\S+) on thumbnails", flow)
    done = [i for i in re.findall(r"completed (\S+) fence", flow) if i in made]
    assert done == [made[0], made[3], made[1], made[2]], (made, done)
    # The album waits for its two images, and a worker completes it once they are done.
    workflows = " ".join(outputs["workflows.md"].split())
    assert "3 items" in workflows  # the album's graph: the two images and itself
    assert "2 completed" in workflows
    assert "1 completed" in workflows
    assert "1 cancelled" in workflows  # the root; its album is listed cancelled with it
    assert "cancelled" in workflows.split("1 cancelled", 1)[1]
    # The application's own table, in its role's schema, and an order committed with its
    # item, on the embedded database.
    assert re.search(
        r"^order 1 committed with item [0-9a-f-]{36}$",
        outputs["transactional-enqueue.md"],
        re.MULTILINE,
    )


def test_every_guide_with_commands_runs_in_one_of_the_tests() -> None:
    with_commands = {guide.name for guide in GUIDES if shell_blocks(guide)}
    assert set(ON_THEIR_OWN) <= with_commands
    assert len(with_commands) > len(ON_THEIR_OWN)  # the README's test runs the others


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_operators_guide_runs_as_written(served: Served, tmp_path: Path) -> None:
    out = run_guide(served, "operators.md", tmp_path)
    assert "exit 1: an item failed" in out
    # The section on raising a queue's concurrency: its limit below the approved one.
    assert re.search(r"approved limit\s+│?\s*8", out), out[:3000]
    assert "replayed" in out
    assert "quarantined" in out


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_watchers_guide_runs_as_written(served: Served, tmp_path: Path) -> None:
    out = run_guide(served, "watchers.md", tmp_path)
    assert "HTTP 500" in out  # the dead delivery's last failure
    assert "delivered" in out
    # the deliveries table keeps the delivery key whole at 80 columns
    assert re.search(r"^│ msg_[0-9a-f]{32} │", out, re.MULTILINE)


def test_a_block_marked_not_to_run_is_skipped_and_must_say_why(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "<!-- not run: serves forever -->\n```\nmake serve\n```\n"
        "```sh\necho one\n```\n```python\nprint(2)\n```\n```bash\necho three\n```\n"
        "```\na diagram\n```\n"
    )
    assert shell_blocks(doc) == ["echo one\n", "echo three\n"]
    doc.write_text("<!-- not run: -->\n```sh\nmake serve\n```\n")
    with pytest.raises(AssertionError, match="must say why"):
        shell_blocks(doc)
