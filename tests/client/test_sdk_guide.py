"""Every example of docs/sdk.md, run as written against the real server, in its own process."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from tests.helpers.api import Api

DB = psycopg.Connection[dict[str, object]]
GUIDE = Path(__file__).resolve().parents[2] / "docs" / "sdk.md"
BLOCK = re.compile(r"(?:<!-- example: (\S+) -->\n)?```python\n(.*?)```", re.DOTALL)


def examples() -> dict[str, str]:
    found = BLOCK.findall(GUIDE.read_text())
    unnamed = [code[:60] for name, code in found if not name]
    assert not unnamed, f"every Python block of the guide must be a named example: {unnamed}"
    return dict(found)


def count(db: DB, sql: str) -> int:
    row = db.execute(sql).fetchone()
    assert row is not None
    return int(str(row["n"]))


def wait_until(db: DB, sql: str, expected: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while count(db, sql) != expected:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{sql} never reached {expected}"
        time.sleep(0.05)


@pytest.mark.slow
def test_every_example_of_the_sdk_guide_runs_as_written(api: Api, db: DB, tmp_path: Path) -> None:
    code = examples()
    assert set(code) == {
        "enqueue.py",
        "worker.py",
        "async_worker.py",
        "errors.py",
        "queue_settings.py",
        "drain.py",
        "processes.py",
        "test_handlers.py",  # test_the_guide_s_handler_tests_pass_on_the_in_memory_server
    }
    for name, text in code.items():
        (tmp_path / name).write_text(text)
    env = {"QUEUE_SERVER_URL": api.url, "QUEUE_SERVER_KEY": api.keys["worker"], "PATH": ""}
    api.approve("emails", 8)

    def run(name: str) -> str:
        done = subprocess.run(
            [sys.executable, name], cwd=tmp_path, env=env, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    def serve_until(name: str, sql: str, expected: int) -> None:
        """Run a worker until the database shows its work done, then stop it with SIGTERM."""
        proc = subprocess.Popen(
            [sys.executable, name], cwd=tmp_path, env=env, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        try:
            wait_until(db, sql, expected, proc)
            proc.send_signal(signal.SIGTERM)
            _, stderr = proc.communicate(timeout=30)
        finally:
            proc.kill()
        assert proc.returncode == 0, stderr
        assert "Traceback" not in stderr, stderr

    assert run("enqueue.py").strip() == "22 items in the backlog"  # the second report is held
    api.enqueue("emails", {"to": "bob@example.invalid"}, max_acquisitions=2)
    serve_until(
        "worker.py", "SELECT count(*) AS n FROM work_items WHERE state <> 'ready'"
        " AND (state = 'completed' OR state = 'quarantined')", 22,
    )  # fmt: skip
    ada = db.execute(
        "SELECT result FROM work_items WHERE payload->>'to' = 'ada@example.com'"
    ).fetchone()
    assert ada == {"result": {"sent_to": "ada@example.com"}}
    bob = db.execute(
        "SELECT state, last_failure FROM work_items WHERE payload->>'to' = 'bob@example.invalid'"
    ).fetchone()
    assert bob is not None
    assert bob["state"] == "quarantined"
    failure = dict(bob["last_failure"])  # type: ignore[call-overload]
    assert failure.pop("traceback").rstrip().endswith("TransientError: mail server busy")
    assert failure == {"class": "TransientError", "message": "mail server busy", "transient": True}

    for n in range(10):
        api.enqueue("emails", {"to": f"async{n}@example.com"})
    serve_until(
        "async_worker.py",
        "SELECT count(*) AS n FROM work_items WHERE result->>'sent_to' LIKE 'async%'",
        10,
    )

    api.approve("hashes", 8)
    for n in range(12):
        api.enqueue("hashes", {"text": f"document {n}"})
    serve_until(
        "processes.py",
        "SELECT count(*) AS n FROM work_items WHERE queue = 'hashes' AND state = 'completed'",
        12,
    )
    hashed = db.execute(
        "SELECT result->>'sha256' AS sha FROM work_items WHERE payload->>'text' = 'document 0'"
    ).fetchone()
    assert hashed == {"sha": hashlib.sha256(b"document 0" * 10_000).hexdigest()}

    api.enqueue("emails", {"to": "err@example.com"})
    out = run("errors.py")
    assert "refused: invalid-request" in out
    assert "missing: item-not-found" in out
    assert "lease lost: fence-ahead" in out
    assert count(db, "SELECT count(*) AS n FROM work_items WHERE state = 'leased'") == 0

    out = run("queue_settings.py")
    assert "lease TTL 30.0 from tenant" in out
    assert "backoff 1.0 s doubling up to 300.0 s" in out

    out = run("drain.py")
    assert out.splitlines()[-1] == "2 items handled"
    assert sorted(line.split()[0] for line in out.splitlines()[:-1]) == [
        "completed",
        "quarantined",
    ]
    images = db.execute(
        "SELECT state, result FROM work_items WHERE queue = 'images' ORDER BY state"
    ).fetchall()
    assert images == [
        {"state": "completed", "result": "resized"},
        {"state": "quarantined", "result": None},
    ]


# This checkout's SDK: both trees of the namespace package (the SDK's is client/).
SDK_SOURCES = os.pathsep.join([str(GUIDE.parents[1]), str(GUIDE.parents[1] / "client")])


def test_the_guide_s_handler_tests_pass_on_the_in_memory_server(tmp_path: Path) -> None:
    """The guide's test module, run by pytest as a user runs it: no server, this checkout's
    SDK, each of its tests passing."""
    (tmp_path / "test_handlers.py").write_text(examples()["test_handlers.py"])
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_handlers.py"],
        cwd=tmp_path, env={"PYTHONPATH": SDK_SOURCES, "PATH": ""},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout, done.stdout
