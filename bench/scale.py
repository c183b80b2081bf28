"""`python -m bench.scale` (`make bench-scale`): 1, 2 and 4 API processes through PgBouncer,
then the scale curve: one `serve --workers N` (N = 1, 2, 4, 8) and 1, 2 and 4 SDK worker
processes against it.

One fresh embedded PostgreSQL, PgBouncer (Debian's package, installed when missing)
in transaction mode in front of it, and N `queue-server serve` processes configured
as in production behind a pooler (`QUEUE_SERVER_DATABASE_POOLER=transaction`: no
prepared statements, session settings as role defaults, LISTEN on a direct
session). Load generators in separate processes run lease cycles (acquire, then a
fenced complete per item) spread evenly over the N processes; each figure is the
median of the repetitions, and the ratio is to one process through the same
PgBouncer. One process straight to PostgreSQL (prepared statements, no pooler) is
measured too, for the pooler's own cost.

The scale curve is what a bigger machine shows first: batched lease cycles against one
`queue-server serve --workers N` straight to PostgreSQL for each N, and 1, 2 and 4 SDK
`Worker` processes (16 slots each) against `serve`'s default; each with items/s and the CPU
per item (API, PostgreSQL and load generators together), so that the curve's bend says
which runs out first. Writes bench/results/scale.{json,md}.

Not part of `make bench` (it keeps that under 8 minutes); about 7 minutes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import pwd
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import httpx
import psutil
import psycopg

from bench import loadgen
from bench import workers as user_workers
from bench.env import (
    BENCH_MAX_QUEUED,
    HOST,
    MAX_APPROVED,
    PREFILL,
    SOON,
    bench_policy,
    free_port,
    venv_bin,
)
from bench.progress import say
from queue_server.infra.embedded import SYSTEM_USER, EmbeddedPostgres
from queue_server.infra.serve import ensure_admin_key
from queue_server.settings import Settings
from queue_server.store.bootstrap import DATABASE_NAME

RESULTS = Path(__file__).parent / "results"
ENSURE = Path(__file__).resolve().parents[1] / "deploy" / "ensure-debian-packages.sh"
PROCESSES = (1, 2, 4)
# The scale curve: `serve --workers N`, and SDK worker processes against `serve`.
SERVE_WORKERS = (1, 2, 4, 8)
SDK_PROCESSES = (1, 2, 4)
SDK_SLOTS = 16
WORKERS = 16
BATCH = 50
START_MARGIN = 0.5


@dataclass
class Measured:
    """Items/s per repetition of one configuration and mode, and the CPU it used."""

    runs: list[float] = field(default_factory=list)
    api_cores: list[float] = field(default_factory=list)
    postgres_cores: list[float] = field(default_factory=list)
    pgbouncer_cores: list[float] = field(default_factory=list)
    machine_busy: list[float] = field(default_factory=list)
    errors: int = 0

    @property
    def median(self) -> float:
        return statistics.median(self.runs) if self.runs else 0.0

    def as_json(self) -> dict[str, Any]:
        def med(values: list[float]) -> float:
            return round(statistics.median(values), 2) if values else 0.0

        return {
            "items_per_s": round(self.median, 1),
            "runs": [round(v, 1) for v in self.runs],
            "api_cores": med(self.api_cores),
            "postgres_cores": med(self.postgres_cores),
            "pgbouncer_cores": med(self.pgbouncer_cores),
            "machine_busy": med(self.machine_busy),
            "errors": self.errors,
        }


def _tree_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            for proc in [root, *root.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    times = proc.cpu_times()
                    total += times.user + times.system
    return total


class Bed:
    """PostgreSQL, PgBouncer and however many API processes the phase wants."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="qs-bench-scale-"))
        self.root.chmod(0o755)
        self.pg = EmbeddedPostgres(self.root / "pgdata", server_settings={"max_connections": "200"})
        self.bouncer_port = free_port()
        self.bouncer: subprocess.Popen[bytes] | None = None
        self.apis: list[tuple[subprocess.Popen[bytes], int]] = []
        self.direct = ""
        self.pooled = ""
        self.admin_key = ""

    def start(self) -> None:
        done = subprocess.run([str(ENSURE), "pgbouncer"], check=False)
        if done.returncode != 0:
            raise SystemExit("PgBouncer is needed (see above)")
        say(f"starting embedded PostgreSQL in {self.root}")
        self.pg.start()
        with psycopg.connect(self.pg.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DATABASE_NAME}")
        self.direct = self.pg.url(DATABASE_NAME)
        self.pooled = f"postgresql://postgres@{HOST}:{self.bouncer_port}/{DATABASE_NAME}"
        subprocess.run(
            [venv_bin("queue-server"), "db", "upgrade"],
            env={**os.environ, "QUEUE_SERVER_DATABASE_URL": self.direct},
            check=True,
            stdout=subprocess.DEVNULL,
        )
        secret = ensure_admin_key(
            Settings(database_url=self.direct, data_dir=self.root / "data"), self.direct
        )
        assert secret is not None
        self.admin_key = secret
        self._start_pgbouncer()

    def _start_pgbouncer(self) -> None:
        conf = self.root / "pgbouncer"
        conf.mkdir(mode=0o755)
        # PgBouncer proves the password to PostgreSQL (SCRAM): it keeps it, like the passfile.
        (conf / "userlist.txt").write_text(f'"postgres" "{self.pg.password}"\n')
        (conf / "pgbouncer.ini").write_text(
            f"""[databases]
{DATABASE_NAME} = host={self.pg.socket_dir} port={self.pg.port} dbname={DATABASE_NAME}

[pgbouncer]
listen_addr = {HOST}
listen_port = {self.bouncer_port}
unix_socket_dir =
auth_type = trust
auth_file = {conf}/userlist.txt
pool_mode = transaction
default_pool_size = 40
max_client_conn = 1000
"""
        )
        user = pwd.getpwnam(SYSTEM_USER) if os.geteuid() == 0 else None
        for path in conf.iterdir():
            path.chmod(0o600)
            if user is not None:
                os.chown(path, user.pw_uid, user.pw_gid)
        with (self.root / "pgbouncer.log").open("wb") as log:
            self.bouncer = subprocess.Popen(
                [shutil.which("pgbouncer") or "/usr/sbin/pgbouncer", str(conf / "pgbouncer.ini")],
                stdout=log,
                stderr=subprocess.STDOUT,
                user=user.pw_uid if user else None,
                group=user.pw_gid if user else None,
                extra_groups=[] if user else None,
            )
        say(f"PgBouncer (transaction mode) on {HOST}:{self.bouncer_port}")

    def start_apis(self, n: int, *, pooled: bool = True, workers: int | None = None) -> None:
        """`n` API processes (`serve`, each with `--workers` when given)."""
        self.stop_apis()
        env = {
            **os.environ,
            "QUEUE_SERVER_DATA_DIR": str(self.root / "data"),
            "QUEUE_SERVER_DATABASE_URL": self.pooled if pooled else self.direct,
            "QUEUE_SERVER_POLICY": str(bench_policy(self.root / "bench-policy.json")),
        }
        if pooled:
            env["QUEUE_SERVER_DATABASE_POOLER"] = "transaction"
            env["QUEUE_SERVER_LISTEN_DATABASE_URL"] = self.direct
        for _ in range(n):
            port = free_port()
            proc = subprocess.Popen(
                [
                    *(venv_bin("queue-server"), "serve", "--host", HOST, "--port", str(port)),
                    *("--log-level", "warning"),
                    *(() if workers is None else ("--workers", str(workers))),
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=(self.root / f"api-{port}.log").open("wb"),
                stdin=subprocess.DEVNULL,
            )
            self.apis.append((proc, port))
        deadline = time.monotonic() + 60
        for proc, port in self.apis:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError((self.root / f"api-{port}.log").read_text()[-2000:])
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"http://{HOST}:{port}/readyz", timeout=2).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError("an API process did not become ready")
                time.sleep(0.1)

    def stop_apis(self) -> None:
        for proc, _ in self.apis:
            proc.send_signal(signal.SIGTERM)
        for proc, _ in self.apis:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.apis = []

    def stop(self) -> None:
        self.stop_apis()
        if self.bouncer is not None:
            self.bouncer.terminate()
            self.bouncer.wait(10)
        self.pg.stop("fast")
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.pg.socket_dir, ignore_errors=True)

    def cpu(self) -> tuple[float, float, float]:
        apis = _tree_cpu([proc.pid for proc, _ in self.apis])
        pid = int((self.pg.pgdata / "postmaster.pid").read_text().split()[0])
        bouncer = _tree_cpu([self.bouncer.pid]) if self.bouncer else 0.0
        return apis, _tree_cpu([pid]), bouncer

    def tenant(self, name: str) -> str:
        """A tenant with a worker key and a high concurrency limit; returns the key."""
        port = self.apis[0][1]
        with httpx.Client(
            base_url=f"http://{HOST}:{port}",
            headers={"Authorization": f"Bearer {self.admin_key}"},
            timeout=60,
        ) as admin:
            admin.put(
                f"/v1/tenants/{name}",
                json={
                    "backlog_cap": BENCH_MAX_QUEUED,
                    "default_max_acquisitions": 5,
                    "default_lease_ttl": 30,
                },
            ).raise_for_status()
            keys: dict[str, str] = {}
            for role in ("worker", "operator"):
                created = admin.post(f"/v1/tenants/{name}/keys", json={"role": role})
                created.raise_for_status()
                keys[role] = str(created.json()["secret"])
            admin.post(
                f"/v1/tenants/{name}/queues/q/spend-approvals",
                json={
                    "max_concurrency": MAX_APPROVED,
                    "expires_at": SOON,
                    "reason": "benchmark",
                },
                headers={
                    "Authorization": f"Bearer {keys['operator']}",
                    "Idempotency-Key": os.urandom(8).hex(),
                },
            ).raise_for_status()
        with psycopg.connect(self.direct, autocommit=True) as conn:
            conn.execute(PREFILL, {"tenant": name, "queue": "q", "n": 60_000})
            conn.execute("ANALYZE work_items")
        return keys["worker"]


def measure(
    bed: Bed,
    pool: ProcessPoolExecutor,
    key: str,
    tenant: str,
    batch: int,
    seconds: float,
    batch_route: bool,
) -> tuple[float, int, tuple[float, float, float], float]:
    """Lease cycles for `seconds`, WORKERS spread over the API processes."""
    share = [WORKERS // len(bed.apis) + (i < WORKERS % len(bed.apis)) for i in range(len(bed.apis))]
    start_at = time.time() + START_MARGIN
    end_at = start_at + seconds
    futures = []
    offset = 0
    for (_, port), n in zip(bed.apis, share, strict=True):
        spec = loadgen.CycleSpec(
            HOST, port, key, tenant, "q", workers=n, worker_offset=offset, batch=batch,
            batch_route=batch_route, start_at=start_at, end_at=end_at,
        )  # fmt: skip
        offset += n
        futures.append(pool.submit(loadgen.run_cycles, spec))
    time.sleep(max(0.0, start_at - time.time()))
    cpu0 = bed.cpu()
    machine0 = psutil.cpu_times()
    results = [f.result() for f in futures]
    elapsed = time.time() - start_at
    cpu1 = bed.cpu()
    machine1 = psutil.cpu_times()
    total = sum(machine1) - sum(machine0)
    busy = 1 - (machine1.idle - machine0.idle) / total if total > 0 else 0.0
    items = sum(r.items for r in results)
    errors = sum(r.errors for r in results)
    for r in results:
        if r.error_samples:
            say(f"  !! errors: {r.error_samples[:2]}")
    cores = tuple((b - a) / elapsed for a, b in zip(cpu0, cpu1, strict=True))
    return items / seconds, errors, (cores[0], cores[1], cores[2]), busy


def measure_sdk(
    bed: Bed, pool: ProcessPoolExecutor, key: str, processes: int, seconds: float
) -> tuple[float, int, float]:
    """SDK `Worker` processes (16 slots each) on one prefilled queue for `seconds`: items/s
    from the agreed start, errors, and the CPU per item of the API, PostgreSQL and the
    workers (ms)."""
    port = bed.apis[0][1]
    start_at = time.time() + START_MARGIN
    spec = user_workers.WorkerSpec(
        kind="thread", slots=SDK_SLOTS, start_at=start_at, end_at=start_at + seconds,
        base_url=f"http://{HOST}:{port}", key=key,
    )  # fmt: skip
    futures = [pool.submit(user_workers.run_worker, spec) for _ in range(processes)]
    time.sleep(max(0.0, start_at - time.time()))
    cpu0 = bed.cpu()
    results = [f.result() for f in futures]
    cpu1 = bed.cpu()
    items = sum(r.items for r in results)
    for r in results:
        if r.error_samples:
            say(f"  !! errors: {r.error_samples[:2]}")
    used = sum(b - a for a, b in zip(cpu0, cpu1, strict=True)) + sum(r.cpu for r in results)
    return items / seconds, sum(r.errors for r in results), used / max(items, 1) * 1000


def curve(
    bed: Bed, pool: ProcessPoolExecutor, seconds: float, reps: int
) -> dict[str, dict[str, Any]]:
    """The scale curve: batched cycles at each `serve --workers N`, then SDK worker
    processes against `serve`'s default; medians of `reps`, with CPU per item."""
    rows: dict[str, dict[str, list[float]]] = {}

    def keep(name: str, rate: float, cpu_ms: float, errors: int) -> None:
        row = rows.setdefault(name, {"runs": [], "cpu_ms": [], "errors": []})
        row["runs"].append(rate)
        row["cpu_ms"].append(cpu_ms)
        row["errors"].append(errors)
        say(f"  {rate:,.0f} items/s, {cpu_ms:.2f} ms of CPU per item")

    tenants = 0
    for rep in range(reps):
        for n in SERVE_WORKERS:
            say(f"serve --workers {n}: batched cycles, rep {rep + 1}/{reps}")
            bed.start_apis(1, pooled=False, workers=n)
            tenants += 1
            tenant = f"curve{tenants}"
            key = bed.tenant(tenant)
            cpu0 = bed.cpu()
            rate, errors, _, _ = measure(bed, pool, key, tenant, BATCH, seconds, True)
            cpu1 = bed.cpu()
            used = sum(b - a for a, b in zip(cpu0, cpu1, strict=True))
            keep(f"serve --workers {n}", rate, used / max(rate * seconds, 1) * 1000, errors)
        bed.start_apis(1, pooled=False)
        for n in SDK_PROCESSES:
            say(f"{n} SDK worker process(es) x {SDK_SLOTS} slots, rep {rep + 1}/{reps}")
            tenants += 1
            key = bed.tenant(f"curve{tenants}")
            rate, errors, cpu_ms = measure_sdk(bed, pool, key, n, seconds)
            keep(f"SDK Worker x{n} process{'es' if n > 1 else ''}", rate, cpu_ms, errors)
    return {
        name: {
            "items_per_s": round(statistics.median(row["runs"]), 1),
            "runs": [round(v, 1) for v in row["runs"]],
            "cpu_ms_per_item": round(statistics.median(row["cpu_ms"]), 3),
            "errors": int(sum(row["errors"])),
        }
        for name, row in rows.items()
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    seconds = 2.0 if args.quick else 3.0
    reps = 1 if args.quick else 3
    configs: list[tuple[str, int, bool]] = [("direct", 1, False)]
    configs += [(f"pgbouncer x{n}", n, True) for n in PROCESSES]
    figures: dict[str, dict[str, Measured]] = {}
    bed = Bed()
    tenants = 0
    load_before = os.getloadavg()
    try:
        bed.start()
        with ProcessPoolExecutor(max_workers=4, mp_context=get_context("spawn")) as pool:
            # Every configuration once per repetition, in turn, so that each sees the same
            # share of whatever else the machine is doing.
            for rep in range(reps):
                for name, n, pooled in configs:
                    say(f"{name}: starting {n} API process(es), rep {rep + 1}/{reps}")
                    bed.start_apis(n, pooled=pooled)
                    paths = httpx.get(f"http://{HOST}:{bed.apis[0][1]}/openapi.json").json()
                    batch_route = "/v1/tenants/{tenant}/completions" in paths["paths"]
                    for mode, batch in (("unbatched", 1), ("batched", BATCH)):
                        measured = figures.setdefault(name, {}).setdefault(mode, Measured())
                        tenants += 1
                        tenant = f"scale{tenants}"
                        key = bed.tenant(tenant)
                        rate, errors, cores, busy = measure(
                            bed, pool, key, tenant, batch, seconds, batch_route
                        )
                        measured.runs.append(rate)
                        measured.errors += errors
                        measured.api_cores.append(cores[0])
                        measured.postgres_cores.append(cores[1])
                        measured.pgbouncer_cores.append(cores[2])
                        measured.machine_busy.append(busy)
                        say(
                            f"  {mode}: {rate:,.0f} items/s; cores: API {cores[0]:.2f}, "
                            f"PostgreSQL {cores[1]:.2f}, PgBouncer {cores[2]:.2f};"
                            f" machine {busy:.0%} busy"
                        )
            scale_curve = curve(bed, pool, seconds, reps)
    finally:
        bed.stop()
    one = figures["pgbouncer x1"]
    doc: dict[str, Any] = {
        "run_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "load_average_before_and_after": [
            [round(v, 2) for v in load_before],
            [round(v, 2) for v in os.getloadavg()],
        ],
        "workers": WORKERS,
        "batch": BATCH,
        "seconds_per_run": seconds,
        "repetitions": reps,
        "curve": scale_curve,
        "figures": {
            name: {
                mode: {
                    **m.as_json(),
                    "ratio_to_one_process": round(m.median / one[mode].median, 2)
                    if one[mode].median
                    else None,
                }
                for mode, m in modes.items()
            }
            for name, modes in figures.items()
        },
    }
    return doc


def markdown(doc: dict[str, Any]) -> str:
    lines = [
        "# API processes through PgBouncer: latest run",
        "",
        f"Run {doc['run_at']} on {doc['machine']['host']} ({doc['machine']['cpus']} CPUs): "
        f"one embedded PostgreSQL, PgBouncer 1.18 in transaction mode, N `queue-server serve` "
        f"processes, {doc['workers']} lease-cycle workers in separate load-generator processes "
        f"spread evenly over the API processes; {doc['seconds_per_run']} s per run, median of "
        f"{doc['repetitions']} (the configurations in turn); a batch is completed in one call (`/completions`). Everything "
        "shares the same two cores (load average before and after: "
        f"{doc['load_average_before_and_after']}). Figures as measured.",
        "",
        "| configuration | mode | items/s | ratio to 1 process | API cores | PostgreSQL cores"
        " | PgBouncer cores | machine busy | errors |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, modes in doc["figures"].items():
        for mode, fig in modes.items():
            label = f"{mode} ({doc['batch']}/call)" if mode == "batched" else mode
            ratio = fig["ratio_to_one_process"]
            lines.append(
                f"| {name} | {label} | {fig['items_per_s']:,.0f} | "
                f"{'' if ratio is None else f'{ratio:.2f}x'} | {fig['api_cores']} | "
                f"{fig['postgres_cores']} | {fig['pgbouncer_cores']} | "
                f"{fig['machine_busy']:.0%} | {fig['errors']} |"
            )
    lines += [
        "",
        "`direct` is one process straight to PostgreSQL (prepared statements, no pooler);",
        "`pgbouncer xN` is N processes through PgBouncer; ratios are to `pgbouncer x1`.",
        "",
        "## The scale curve",
        "",
        f"Batched lease cycles ({doc['workers']} workers, {doc['batch']} per call) against one"
        " `queue-server serve --workers N` straight to PostgreSQL, then SDK `Worker` processes"
        f" ({SDK_SLOTS} slots each) against `serve`'s default. CPU per item: the API"
        " processes and PostgreSQL over the items done, and for the SDK rows the worker"
        " processes too (the product there).",
        "",
        "| configuration | items/s | ratio to the first | CPU per item | errors |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    firsts: dict[bool, float] = {}
    for name, fig in doc.get("curve", {}).items():
        sdk = name.startswith("SDK")
        first = firsts.setdefault(sdk, fig["items_per_s"])
        ratio = fig["items_per_s"] / first if first else 0.0
        lines.append(
            f"| {name} | {fig['items_per_s']:,.0f} | {ratio:.2f}x |"
            f" {fig['cpu_ms_per_item']:.2f} ms | {fig['errors']} |"
        )
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one short repetition each")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    args = parser.parse_args(argv)
    began = time.monotonic()
    doc = run(args)
    doc["seconds"] = round(time.monotonic() - began, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scale.json").write_text(json.dumps(doc, indent=2, sort_keys=True))
    text = markdown(doc)
    (args.out / "scale.md").write_text(text)
    print(text)
    say(f"wrote {args.out / 'scale.md'} in {doc['seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
