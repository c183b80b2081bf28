"""Clients generated from /openapi.json, as a user of another language makes them, drive
the walk-through against a live server: enqueue, acquire, complete, and a refused complete
whose `code` they read.

- Python: openapi-python-client, in a virtual environment of its own (pinned, made once
  under the user's cache directory);
- TypeScript: openapi-typescript's types, a client written against them and checked by
  `tsc --strict`, run by Node (both from the npm registry, installed once in the cache).

Skipped, saying why, where npm or the registries cannot be reached.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.api import Api

# Other processes call the server: it listens on a socket.
pytestmark = pytest.mark.live

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "queue-server-tests"
PYTHON_GENERATOR = ("openapi-python-client==0.29.1", "python-dateutil==2.9.0.post0")
NPM_PACKAGES = ("openapi-typescript@7.10.1", "typescript@5.9.3")

DRIVE_PYTHON = """
import json, sys, uuid
sys.path.insert(0, sys.argv[1])
from qs_client import AuthenticatedClient
from qs_client.api.items import enqueue
from qs_client.api.leases import acquire, complete
from qs_client.models import AcquireIn, CompleteIn, ItemIn, Problem

base, key, tenant = sys.argv[2:5]
client = AuthenticatedClient(base_url=base, token=key)
item = enqueue.sync(tenant, "generated", client=client, body=ItemIn(payload={"lang": "py"}),
                    idempotency_key=uuid.uuid4().hex)
leases = acquire.sync(tenant, "generated", client=client, body=AcquireIn(worker="gen-py"))
(lease,) = leases.leases
refused = complete.sync(tenant, lease.item_id, client=client,
                        body=CompleteIn(worker="someone-else", fence=lease.fence),
                        idempotency_key=uuid.uuid4().hex)
assert isinstance(refused, Problem), refused
done = complete.sync(tenant, lease.item_id, client=client,
                     body=CompleteIn(worker="gen-py", fence=lease.fence, result={"ok": True}),
                     idempotency_key=uuid.uuid4().hex)
print(json.dumps({"enqueued": item.item_id, "leased": lease.item_id, "state": str(done.state),
                  "refused": [refused.status, refused.code]}))
"""

DRIVE_TYPESCRIPT = """
import type { components, operations } from "./schema";

declare const process: { argv: string[] };

type Json<T> = T extends { content: { "application/json": infer B } } ? B : never;
type EnqueueBody = Json<operations["enqueue"]["requestBody"]>;
type AcquireBody = Json<operations["acquire"]["requestBody"]>;
type CompleteBody = Json<operations["complete"]["requestBody"]>;
type Item = components["schemas"]["Item"];
type Leases = components["schemas"]["LeasesOut"];
type Problem = components["schemas"]["Problem"];

const [base, key, tenant] = process.argv.slice(2);

async function post<T>(path: string, body: unknown, idempotent: boolean): Promise<[number, T]> {
  const headers: Record<string, string> = {
    Authorization: `Bearer ${key}`,
    "Content-Type": "application/json",
  };
  if (idempotent) headers["Idempotency-Key"] = crypto.randomUUID();
  const response = await fetch(`${base}/v1/tenants/${tenant}${path}`, {
    method: "POST",
    headers,
    body: JSON.stringify(body),
  });
  return [response.status, (await response.json()) as T];
}

async function main(): Promise<void> {
  // Only the fields without a default: the others are optional in the generated types.
  const enqueue: EnqueueBody = { payload: { lang: "ts" } };
  const [, item] = await post<Item>("/queues/generated/items", enqueue, true);
  const acquire: AcquireBody = { worker: "gen-ts" };
  const [, leases] = await post<Leases>("/queues/generated/leases", acquire, false);
  const lease = leases.leases[0];
  const wrong: CompleteBody = { worker: "someone-else", fence: lease.fence };
  const [status, problem] = await post<Problem>(`/items/${lease.item_id}/complete`, wrong, true);
  const code: string = problem.code;
  const complete: CompleteBody = { worker: "gen-ts", fence: lease.fence, result: { ok: true } };
  const [, done] = await post<Item>(`/items/${lease.item_id}/complete`, complete, true);
  console.log(JSON.stringify({
    enqueued: item.item_id, leased: lease.item_id, state: done.state, refused: [status, code],
  }));
}

main();
"""


def _run(args: list[str], cwd: Path | None = None, timeout: float = 300) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:3])}: {done.stdout[-1500:]}{done.stderr[-1500:]}")
    return done.stdout


def _python_generator() -> Path:
    """The generator's own environment (made once; a stamp says with which pins)."""
    venv = CACHE / "openapi-python-client"
    stamp = venv / "installed.txt"
    if not stamp.exists() or stamp.read_text() != "\n".join(PYTHON_GENERATOR):
        shutil.rmtree(venv, ignore_errors=True)
        # Without a pip of its own (ensurepip is about a third of the time), installed by
        # this environment's pip; the generator runs once per test, so nothing is compiled.
        _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
        pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")]
        try:
            _run([*pip, "install", "-q", "--no-compile", *PYTHON_GENERATOR])
        except RuntimeError as exc:
            pytest.skip(f"openapi-python-client could not be installed (no registry?): {exc}")
        stamp.write_text("\n".join(PYTHON_GENERATOR))
    return venv / "bin"


def _npm_tools() -> Path:
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed: the TypeScript client is not generated")
    prefix = CACHE / "openapi-typescript"
    stamp = prefix / "installed.txt"
    if not stamp.exists() or stamp.read_text() != "\n".join(NPM_PACKAGES):
        shutil.rmtree(prefix, ignore_errors=True)
        prefix.mkdir(parents=True)
        try:
            _run([npm, "install", "--silent", "--prefix", str(prefix), *NPM_PACKAGES])
        except RuntimeError as exc:
            pytest.skip(f"openapi-typescript could not be installed (no registry?): {exc}")
        stamp.write_text("\n".join(NPM_PACKAGES))
    return prefix / "node_modules" / ".bin"


def _document(api: Api, tmp_path: Path) -> Path:
    path = tmp_path / "openapi.json"
    path.write_text(api.client(None).get("/openapi.json").text)
    return path


def _check(api: Api, seen: dict[str, object]) -> None:
    assert seen["enqueued"] == seen["leased"]
    assert seen["state"] in ("completed", "ItemState.COMPLETED")
    assert seen["refused"] == [409, "not-lease-holder"]
    item = api.operator.get(f"/v1/tenants/{api.tenant}/items/{seen['enqueued']}").json()
    assert item["state"] == "completed"


def test_a_python_client_generated_from_the_document_runs_the_walk_through(
    api: Api, tmp_path: Path
) -> None:
    tools = _python_generator()
    document = _document(api, tmp_path)
    _run(
        [str(tools / "openapi-python-client"), "generate", "--path", str(document),
         "--output-path", str(tmp_path / "qs_client"), "--meta", "none"],
    )  # fmt: skip
    # The generated modules are named by the operation ids: enqueue.py, acquire.py...
    assert (tmp_path / "qs_client" / "api" / "items" / "enqueue.py").exists()
    script = tmp_path / "drive.py"
    script.write_text(DRIVE_PYTHON)
    out = _run(
        [str(tools / "python"), str(script), str(tmp_path), api.url, api.keys["worker"],
         api.tenant],
    )  # fmt: skip
    _check(api, json.loads(out))


def test_typescript_types_generated_from_the_document_check_strictly_and_run(
    api: Api, tmp_path: Path
) -> None:
    tools = _npm_tools()
    document = _document(api, tmp_path)
    _run([str(tools / "openapi-typescript"), str(document), "-o", str(tmp_path / "schema.d.ts")])
    (tmp_path / "drive.ts").write_text(DRIVE_TYPESCRIPT)
    (tmp_path / "tsconfig.json").write_text(
        json.dumps(
            {
                "compilerOptions": {
                    "strict": True,
                    "target": "es2022",
                    "module": "commonjs",
                    "lib": ["es2022", "dom"],
                    "types": [],
                    "outDir": "out",
                },
                "files": ["drive.ts"],
            }
        )
    )
    _run([str(tools / "tsc"), "-p", str(tmp_path)], cwd=tmp_path)
    node = shutil.which("node")
    assert node is not None
    out = _run(
        [node, str(tmp_path / "out" / "drive.js"), api.url, api.keys["worker"], api.tenant],
    )  # fmt: skip
    _check(api, json.loads(out))
