"""Run the real `queue-server` command as a process of its own against a live server."""

from __future__ import annotations

import atexit
import contextlib
import json
import locale
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tests.helpers.api import Api

BIN = Path(sys.executable).parent / "queue-server"
FORKS = Path(__file__).with_name("cli_forks.py")
RELAY = Path(__file__).with_name("cli_relay.py")


class CliForks:
    """`queue-server` commands forked from a process that has imported the CLI's libraries
    (tests/helpers/cli_forks.py): each one a process of its own, as `subprocess.run` of the
    script makes, without an interpreter's start and its imports per command."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="qs-cli-forks-")
        self.path = os.path.join(self.dir, "forks.sock")
        # An environment like the commands': none of the suite's own variables, but the
        # PYTHONPATH the suite runs under, so the commands import the package it tests.
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        if "PYTHONPATH" in os.environ:
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        self.proc = subprocess.Popen(
            [sys.executable, str(FORKS), self.path, str(BIN), str(os.getpid())],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            cwd=self.dir,
        )
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        assert ready == b"ready\n", f"the CLI's fork server did not start: {ready!r}"

    def relay_dir(self) -> str:
        """A directory with a `queue-server` that has this server fork the command
        (tests/helpers/cli_relay.py): for a shell's PATH, ahead of .venv/bin."""
        bin_dir = os.path.join(self.dir, "bin")
        script = os.path.join(bin_dir, "queue-server")
        if not os.path.exists(script):
            os.makedirs(bin_dir, exist_ok=True)
            with open(script + ".new", "w") as handle:
                handle.write(
                    f'#!/bin/sh\nexec "{sys.executable}" -I -S "{RELAY}" "{self.path}" "{BIN}" "$@"\n'
                )
            os.chmod(script + ".new", 0o755)
            os.replace(script + ".new", script)
        return bin_dir

    def run(
        self, argv: list[str], env: dict[str, str], cwd: Path, input: str | None, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        encoding = locale.getpreferredencoding(False)
        deadline = time.monotonic() + timeout
        with (
            tempfile.TemporaryFile() as out,
            tempfile.TemporaryFile() as err,
            socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn,
        ):
            conn.connect(self.path)
            head = json.dumps({"argv": argv, "env": env, "cwd": str(cwd)}).encode()
            writer = None
            if input is None:
                stdin = 0  # inherited, as subprocess.run leaves it
                socket.send_fds(conn, [head], [stdin, out.fileno(), err.fileno()])
            else:
                stdin, feed = os.pipe()
                socket.send_fds(conn, [head], [stdin, out.fileno(), err.fileno()])
                os.close(stdin)
                writer = threading.Thread(target=_feed, args=(feed, input.encode(encoding)))
                writer.start()
            conn.settimeout(timeout)
            pid = int(conn.recv(64))
            try:
                conn.settimeout(max(0.0, deadline - time.monotonic()))
                returncode = int(conn.recv(64))
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(
                    argv, timeout, _read(out, encoding), _read(err, encoding)
                ) from None
            finally:
                if writer is not None:
                    writer.join()
            return subprocess.CompletedProcess(
                argv, returncode, _read(out, encoding), _read(err, encoding)
            )

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def _feed(fd: int, data: bytes) -> None:
    with open(fd, "wb") as pipe, contextlib.suppress(BrokenPipeError):
        pipe.write(data)


def _read(file: IO[bytes], encoding: str) -> str:
    """What subprocess.run(text=True) makes of the bytes: decoded, universal newlines."""
    file.seek(0)
    return file.read().decode(encoding).replace("\r\n", "\n").replace("\r", "\n")


_forks: CliForks | None = None
_forks_lock = threading.Lock()


def cli_forks() -> CliForks:
    """This test process's fork server, started on first use."""
    global _forks
    with _forks_lock:
        if _forks is None or _forks.proc.poll() is not None:
            _forks = CliForks()
            atexit.register(_forks.stop)
        return _forks


@dataclass
class Cli:
    """`queue-server` as a subprocess, connected through the environment."""

    env: dict[str, str]
    api: Api
    cwd: Path

    def env_for(self, role: str) -> dict[str, str]:
        key = self.admin_key if role == "admin" else self.api.keys[role]
        return {**self.env, "QUEUE_SERVER_KEY": key}

    @property
    def admin_key(self) -> str:
        return str(self.api.admin.headers["Authorization"]).removeprefix("Bearer ")

    def run(
        self,
        *args: str,
        role: str = "operator",
        ok: bool = True,
        input: str | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        done = cli_forks().run([str(BIN), *args], self.env_for(role), self.cwd, input, timeout)
        if ok:
            assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        assert "Traceback" not in done.stderr, done.stderr
        return done

    def json(self, *args: str, role: str = "operator") -> Any:
        return json.loads(self.run(*args, "--json", role=role).stdout)

    def popen(self, *args: str, role: str = "worker") -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(BIN), *args],
            env=self.env_for(role),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=self.cwd,
        )

    def script(self, name: str, body: str) -> str:
        path = self.cwd / name
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)
        return str(path)


def lines(stdout: str) -> Sequence[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def quarantine(api: Api, queue: str, n: int) -> list[str]:
    ids = []
    for i in range(n):
        item = api.enqueue(queue, {"i": i})
        (lease,) = api.acquire(queue)
        response = api.holder(
            "triage",
            item["item_id"],
            worker="w1",
            fence=lease["fence"],
            failure={"class": "Boom", "message": f"poison {i}", "transient": False},
            decision="quarantine",
        )
        assert response.status_code == 200, response.text
        ids.append(str(item["item_id"]))
    return ids
