"""Run the real `queue-server` command as a subprocess against a live server."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers.api import Api

BIN = Path(sys.executable).parent / "queue-server"


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
        done = subprocess.run(
            [str(BIN), *args],
            env=self.env_for(role),
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=self.cwd,
        )
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
