"""`python -m bench.sync_cost` (`make bench-sync`): what a commit costs on the local HA
topology (deploy/local-ha/ha.py), with and without waiting for the synchronous standby.

pgbench's write transaction without the branch and teller updates (`-N`, simple
protocol, scale 10) against the Patroni leader: straight to its port with
`synchronous_commit = local` (the commit is flushed locally and not waited for on
the standby) and with the topology's `synchronous_commit = on`; then through HAProxy,
and through PgBouncer and HAProxy, as the API reaches it. What synchronous
replication adds to each commit is measured at one client as the median difference
of adjacent short runs with and without the wait, which the machine's other work
disturbs least. Brings
the topology up if it is not (and down again afterwards). Writes
bench/results/sync-cost.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench.progress import say

RESULTS = Path(__file__).parent / "results"
REPO = Path(__file__).resolve().parents[1]
HA = REPO / "deploy" / "local-ha" / "ha.py"
PG_BIN = Path("/usr/lib/postgresql/15/bin")
DEFAULT_DIR = Path(os.environ.get("QS_HA_DIR", "/var/tmp/queue-server-ha"))


def _pgbench(
    port: int, password: str, clients: int, seconds: int, options: str = ""
) -> tuple[float, float]:
    env = {**os.environ, "PGPASSWORD": password, "PGOPTIONS": options}
    done = subprocess.run(
        [
            str(PG_BIN / "pgbench"),
            *("-h", "127.0.0.1", "-p", str(port), "-U", "postgres"),
            *("-N", "-M", "simple", "-n", "-c", str(clients), "-j", str(min(clients, 2))),
            *("-T", str(seconds), "pgbench"),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    tps = re.search(r"tps = ([\d.]+)", done.stdout)
    latency = re.search(r"latency average = ([\d.]+) ms", done.stdout)
    if tps is None or latency is None:
        raise RuntimeError(f"could not read pgbench's output:\n{done.stdout}\n{done.stderr}")
    return float(tps.group(1)), float(latency.group(1))


def _leader(state: dict[str, Any]) -> str:
    for node in state["nodes"].values():
        members = httpx.get(f"http://127.0.0.1:{node['rest_port']}/cluster", timeout=2).json()
        for member in members["members"]:
            if member["role"] == "leader":
                return str(member["name"])
    raise RuntimeError("no leader")


def run(root: Path, seconds: int, reps: int, pairs: int = 15) -> dict[str, Any]:
    load = [round(v, 2) for v in os.getloadavg()]
    state = json.loads((root / "state.json").read_text())
    password = state["passwords"]["postgres"]
    leader = _leader(state)
    leader_port = int(state["nodes"][leader]["pg_port"])
    env = {**os.environ, "PGPASSWORD": password}
    psql = [str(PG_BIN / "psql"), "-h", "127.0.0.1", "-p", "25000", "-U", "postgres", "-XAtq"]
    exists = subprocess.run(
        [*psql, "-c", "SELECT 1 FROM pg_database WHERE datname = 'pgbench'"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not exists:
        subprocess.run([*psql, "-c", "CREATE DATABASE pgbench"], env=env, check=True)
    say(f"pgbench -i -s 10 on the leader ({leader})")
    subprocess.run(
        [
            *(str(PG_BIN / "pgbench"), "-i", "-q", "-s", "10"),
            *("-h", "127.0.0.1", "-p", "25000", "-U", "postgres", "pgbench"),
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    targets = [
        ("leader, synchronous_commit = local", leader_port, "-c synchronous_commit=local"),
        ("leader, synchronous_commit = on (sync standby)", leader_port, ""),
        ("through HAProxy", 25000, ""),
        ("through PgBouncer and HAProxy", 25400, ""),
    ]
    # Every target once per repetition, in turn, so that each sees the same share of
    # whatever else the machine is doing.
    runs: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for rep in range(reps):
        for clients in (1, 4):
            for label, port, options in targets:
                tps, latency = _pgbench(port, password, clients, seconds, options)
                runs.setdefault((label, clients), []).append((tps, latency))
                say(f"{label}, {clients} clients, rep {rep + 1}: {tps:,.0f} tps, {latency} ms")
    rows: list[dict[str, Any]] = [
        {
            "target": label,
            "clients": clients,
            "tps": round(statistics.median(r[0] for r in measured), 1),
            "latency_ms": round(statistics.median(r[1] for r in measured), 3),
            "runs": [list(r) for r in measured],
        }
        for (label, clients), measured in runs.items()
    ]
    # The figure that matters, robust to the machine's other work: adjacent short runs
    # with and without the standby wait, in alternating order, and the median of the
    # differences of each pair.
    differences: list[float] = []
    for pair in range(pairs):
        order = [("-c synchronous_commit=local", -1.0), ("", 1.0)]
        if pair % 2:
            order.reverse()
        difference = 0.0
        for options, sign in order:
            difference += sign * _pgbench(leader_port, password, 1, 2, options)[1]
        differences.append(round(difference, 3))
    say(f"paired differences (ms): {differences}")
    by = {(r["target"], r["clients"]): r for r in rows}
    cost = {
        clients: round(
            by[(targets[1][0], clients)]["latency_ms"] - by[(targets[0][0], clients)]["latency_ms"],
            3,
        )
        for clients in (1, 4)
    }
    return {
        "run_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {"host": platform.node(), "cpus": os.cpu_count()},
        "load_average_before_and_after": [load, [round(v, 2) for v in os.getloadavg()]],
        "versions": state.get("versions", {}),
        "leader": leader,
        "seconds_per_run": seconds,
        "repetitions": reps,
        "rows": rows,
        "sync_cost_per_commit_ms": {str(k): v for k, v in cost.items()},
        "sync_cost_paired_ms": {
            "median": round(statistics.median(differences), 3),
            "pairs": list(differences),
        },
    }


def markdown(doc: dict[str, Any]) -> str:
    versions = ", ".join(f"{k} {v}" for k, v in doc["versions"].items())
    lines = [
        "# What a commit costs on the local HA topology: latest run",
        "",
        f"Run {doc['run_at']} on {doc['machine']['host']} ({doc['machine']['cpus']} CPUs), "
        f"{versions}. pgbench `-N -M simple`, scale 10, {doc['seconds_per_run']} s per run, "
        f"median of {doc['repetitions']} (the targets in turn, each repetition); the leader was "
        f"{doc['leader']}, with one synchronous standby and one asynchronous replica on the same "
        "machine, whose two cores are shared with other work (load average before and after: "
        f"{doc['load_average_before_and_after']}). Figures as measured.",
        "",
        "| target | clients | tps | latency (ms) |",
        "| --- | ---: | ---: | ---: |",
    ]
    for row in doc["rows"]:
        lines.append(
            f"| {row['target']} | {row['clients']} | {row['tps']:,.0f} | {row['latency_ms']} |"
        )
    cost = doc["sync_cost_per_commit_ms"]
    paired = doc["sync_cost_paired_ms"]
    lines += [
        "",
        f"**Waiting for the synchronous standby adds {paired['median']} ms to a commit** at "
        f"one client: the median of {len(paired['pairs'])} differences between adjacent 2 s "
        "runs with `synchronous_commit = on` and `local` on the leader, alternating which "
        f"goes first (differences: {paired['pairs']} ms). From the table's medians: "
        f"{cost['1']} ms at one client, {cost['4']} ms at four.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sync_cost", description=__doc__)
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="the topology's state dir")
    parser.add_argument("--seconds", type=int, default=5, help="seconds per pgbench run")
    parser.add_argument("--reps", type=int, default=3, help="repetitions per figure")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    args = parser.parse_args(argv)
    brought_up = not (args.dir / "state.json").exists()
    if brought_up:
        say("the HA topology is not up; bringing it up (make ha-up)")
        subprocess.run([sys.executable, str(HA), "--dir", str(args.dir), "up"], check=True)
    try:
        doc = run(args.dir, args.seconds, args.reps)
    finally:
        if brought_up:
            subprocess.run([sys.executable, str(HA), "--dir", str(args.dir), "down"], check=False)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sync-cost.json").write_text(json.dumps(doc, indent=2, sort_keys=True))
    text = markdown(doc)
    (args.out / "sync-cost.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
