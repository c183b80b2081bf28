"""The SDK holds only the SDK: each of its modules is reached from its public API (the
package's `__init__`), and none of them is a thin client of another operation class."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SDK = ROOT / "client" / "queue_server" / "client"


def _modules() -> set[str]:
    return {
        "queue_server.client" + ("" if p.stem == "__init__" else f".{p.stem}")
        for p in SDK.glob("*.py")
    }


def unreached(code: str, modules: set[str]) -> set[str]:
    """The modules of `modules` a fresh interpreter does not hold after running `code`."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return modules - set(json.loads(done.stdout.splitlines()[-1]))


def test_every_module_of_the_sdk_is_reached_from_its_public_api() -> None:
    modules = _modules()
    assert "queue_server.client.worker_core" in modules
    assert unreached("import queue_server.client", modules) == set()


def test_a_module_the_public_api_does_not_reach_is_found() -> None:
    modules = {*_modules(), "queue_server.client.turns"}
    assert unreached("import queue_server.client", modules) == {"queue_server.client.turns"}
