"""What the server loads of the policy package: the document, its loader and the values it
reads, never the proof machinery (bindings, verifier, negative control), which is test code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import queue_server.policy as policy_package

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "queue_server"

# What `import queue_server.app` may load from the policy package: what the server runs.
SERVER_RUNS = {
    "queue_server.policy",
    "queue_server.policy.admission",
    "queue_server.policy.errors",
    "queue_server.policy.loader",
    "queue_server.policy.model",
    "queue_server.policy.runtime",
    "queue_server.policy.v2",
    "queue_server.policy.values",
}
# The proof that each cell is enforced: test code, and where it used to live in the package.
PROOF = (
    "tests",
    "queue_server.policy.bindings",
    "queue_server.policy.verifier",
)


def _loaded_by(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running `code`."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    modules: list[str] = json.loads(done.stdout.splitlines()[-1])
    return set(modules)


def _proof_modules(modules: set[str]) -> set[str]:
    return {m for m in modules for p in PROOF if m == p or m.startswith(p + ".")}


def test_importing_the_app_loads_no_module_of_the_proof_machinery() -> None:
    loaded = _loaded_by("import queue_server.app")
    assert "queue_server.app" in loaded
    assert _proof_modules(loaded) == set()
    policy = {
        m for m in loaded if m == "queue_server.policy" or m.startswith("queue_server.policy.")
    }
    # The clients' breaker, permit gate, mutation path and retries are not the server's.
    assert policy == SERVER_RUNS


def test_the_check_finds_a_proof_module_the_process_imported() -> None:
    loaded = _loaded_by("import queue_server.app\nimport tests.policy_proof.verifier")
    assert {"tests.policy_proof.verifier", "tests.policy_proof.bindings"} <= _proof_modules(loaded)


def test_the_installed_package_holds_no_proof_machinery() -> None:
    assert not (PACKAGE / "policy" / "bindings.py").exists()
    assert not (PACKAGE / "policy" / "verifier.py").exists()
    planted = [
        str(path.relative_to(ROOT))
        for path in PACKAGE.rglob("*.py")
        if "CancelAfterDispatch" in path.read_text() or "InMemoryReceiptStore" in path.read_text()
    ]
    assert planted == []


def test_every_public_name_of_the_policy_package_resolves_from_its_module() -> None:
    names = set(policy_package.__all__)
    assert names == set(policy_package._WHERE)
    for name in sorted(names):
        assert getattr(policy_package, name) is not None, name
