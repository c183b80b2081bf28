"""`pg_dump` of the live database under load, restored into a new database.

Producers enqueue and workers complete while `pg_dump` (the server's own major
version: the embedded PostgreSQL's programs) dumps the database. A dump of a large
database keeps its snapshot for as long as it reads, so the dump here reads from a
snapshot the harness exported `hold` seconds before it runs (`pg_dump --snapshot`):
the flow runs that long under the dump's snapshot, as it would under a long dump.
The dump is then restored (`pg_restore`) into a new database of the same cluster.

Checked:

- live: the flow stops, a worker drains the queue, and every acknowledged enqueue is
  completed exactly once (one `completed` event per item), besides the six checkers;
- restored: a consistent earlier state: its items are among the live ones, no more of
  them, a finished item finished alike; everything acknowledged before the dump's
  snapshot is there, nothing sent after it; every ledger folds to its item; the
  same tables as the live database;
- pace: items completed per second while the dump's snapshot was held are at least
  ``pace_floor`` of the rate before it.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Iterable
from dataclasses import replace

import psycopg
from psycopg.rows import dict_row

from reliability.checkers import (
    SNAPSHOT_EVENTS_SQL,
    SNAPSHOT_ITEMS_SQL,
    DatabaseSnapshot,
    ItemKey,
    Violation,
)
from reliability.client import RecordingClient, run_worker
from reliability.cluster import HARNESS_APP, HOST, Cluster, say
from reliability.history import ENQUEUES, History, HistoryRecorder, JSONValue, OpKind
from reliability.scenarios import (
    FAST_API_ENV,
    Load,
    ScenarioOutcome,
    fill,
    finish,
    ledger_fold_violations,
    probe_backlog,
    with_extras,
)

__all__ = ["completion_violations", "pace_violations", "pg_dump_under_load", "restored_violations"]

RESTORED = "queue_server_restored"
TERMINAL = frozenset({"completed", "cancelled", "quarantined"})
_VERSION = re.compile(r"(\d+)(?:\.\d+)?")


def _major(version: str) -> str:
    found = _VERSION.search(version)
    return found.group(1) if found else version


def restored_violations(
    live: DatabaseSnapshot,
    restored: DatabaseSnapshot,
    *,
    acked_before: Iterable[ItemKey],
    completed_before: dict[ItemKey, int],
    sent_after: Iterable[ItemKey],
) -> list[Violation]:
    """The restored database is a consistent state the live one went through.

    ``acked_before``: items whose enqueue was acknowledged before the dump's snapshot;
    ``completed_before``: fences of completions acknowledged before it; ``sent_after``:
    items whose enqueue was sent after the snapshot was taken.
    """
    out: list[Violation] = []
    now, then = live.index(), restored.index()
    if len(then) > len(now):
        out.append(Violation("restored", f"{len(then)} items restored, {len(now)} live"))
    for key, item in then.items():
        current = now.get(key)
        if current is None:
            out.append(Violation("restored", "an item the live database never had", *key))
        elif item.fence > current.fence:
            out.append(Violation("restored", f"fence {item.fence} > live {current.fence}", *key))
        elif item.state in TERMINAL and (item.state, item.fence) != (
            current.state,
            current.fence,
        ):
            out.append(
                Violation(
                    "restored",
                    f"{item.state} at fence {item.fence} restored, live {current.state}"
                    f" at {current.fence}",
                    *key,
                )
            )
    for key in acked_before:
        if key not in then:
            out.append(Violation("restored", "enqueue acknowledged before the dump missing", *key))
    for key, fence in completed_before.items():
        done = then.get(key)
        if done is None or (done.state, done.fence) != ("completed", fence):
            found = "missing" if done is None else f"{done.state} at fence {done.fence}"
            out.append(
                Violation(
                    "restored",
                    f"completion at fence {fence} acknowledged before the dump: {found}",
                    *key,
                )
            )
    for key in sent_after:
        if key in then:
            out.append(Violation("restored", "an item enqueued after the dump's snapshot", *key))
    out += [replace(v, checker="restored-ledger") for v in ledger_fold_violations(restored)]
    return out


def completion_violations(live: DatabaseSnapshot, acked: Iterable[ItemKey]) -> list[Violation]:
    """After the drain: every acknowledged item is there, completed, with one completion."""
    out: list[Violation] = []
    now = live.index()
    for key in acked:
        item = now.get(key)
        if item is None:
            out.append(Violation("drained", "acknowledged item missing", *key))
            continue
        done = sum(e.kind == "completed" for e in item.events)
        if item.state != "completed" or done != 1:
            out.append(Violation("drained", f"{item.state} with {done} completed events", *key))
    return out


def pace_violations(before: float, during: float, floor: float) -> list[Violation]:
    """Items/s while the dump's snapshot was held, against the rate before it."""
    if before <= 0:
        return [Violation("pace", "no item completed before the dump")]
    if during < floor * before:
        return [
            Violation(
                "pace",
                f"{during:.0f} items/s during the dump, {during / before:.2f}x the"
                f" {before:.0f} before it (floor {floor}x)",
            )
        ]
    return []


def _completions(history: History, start: float, end: float) -> int:
    return sum(
        1
        for op in history.operations
        if op.kind is OpKind.COMPLETE and op.accepted and start <= op.end_mono < end
    )


def _read(url: str) -> DatabaseSnapshot:
    with psycopg.connect(url, autocommit=True, row_factory=dict_row) as conn:
        items = conn.execute(SNAPSHOT_ITEMS_SQL).fetchall()
        events = conn.execute(SNAPSHOT_EVENTS_SQL).fetchall()
    return DatabaseSnapshot.from_rows(items, events)


def _tables(url: str) -> set[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        return {str(r[0]) for r in rows.fetchall()}


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)


def pg_dump_under_load(
    *,
    phase: float = 15.0,
    hold: float = 30.0,
    producers: int = 2,
    workers: int = 3,
    pace_floor: float = 0.5,
    name: str = "pg_dump under load",
) -> ScenarioOutcome:
    """pg_dump under load restores into a new database; nothing lost, the flow keeps its pace."""
    began = time.monotonic()
    metrics: dict[str, JSONValue] = {"phase_seconds": phase, "snapshot_held_seconds": hold}
    extras: list[Violation] = []
    with Cluster(name="pgdump", api_env=FAST_API_ENV) as cluster:
        tenant = "dump"
        keys = cluster.create_tenant(tenant, max_concurrency=16)
        recorder = HistoryRecorder(source="harness")
        stop = threading.Event()
        client = RecordingClient(cluster.base_url, keys.worker, tenant, recorder)
        fill(client, "q", 500)
        probe = probe_backlog(cluster, [tenant], recorder, stop)
        load = Load(
            client,
            stop,
            producers=producers,
            workers=workers,
            ttl=10.0,
            max_items_total=10**9,
            requeue_ratio=0.0,
            producer_pause=0.01,
        )
        programs = cluster.pg.bin_dir
        dump_file = cluster.root / "queue_server.dump"
        time.sleep(1.0)
        base = time.monotonic()
        say(f"{name}: load for {phase:.0f}s before the dump")
        time.sleep(phase)
        with psycopg.connect(cluster.db_url, application_name=HARNESS_APP) as exporter:
            exporter.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            taken_mono, taken_wall = time.monotonic(), time.time()
            row = exporter.execute("SELECT pg_export_snapshot()").fetchone()
            exported_wall = time.time()
            snapshot_id = str(row[0]) if row else ""
            say(f"{name}: the dump's snapshot is taken; pg_dump reads it in {hold:.0f}s")
            time.sleep(hold)
            started = time.monotonic()
            dumped = _run(
                [
                    str(programs / "pg_dump"),
                    "--format=custom",
                    f"--snapshot={snapshot_id}",
                    "--file",
                    str(dump_file),
                    "--dbname",
                    cluster.db_url,
                ]
            )
            dump_end = time.monotonic()
            exporter.rollback()
        metrics["pg_dump_seconds"] = round(dump_end - started, 2)
        stop.set()
        load.join()
        probe.join(5)
        say(f"{name}: the flow stopped; a worker drains the queue")
        run_worker(client, "q", "drain", threading.Event(), ttl=10.0, max_items=50, until_empty=20)
        report, history, live = finish(
            cluster, recorder, name, [tenant], clients=[client], faults_injected=1
        )

        before = _completions(history, base, taken_mono) / max(1e-9, taken_mono - base)
        during = _completions(history, taken_mono, dump_end) / max(1e-9, dump_end - taken_mono)
        metrics["items_s_before"] = round(before, 1)
        metrics["items_s_during_dump"] = round(during, 1)
        metrics["pace_ratio"] = round(during / before, 3) if before else None
        extras += pace_violations(before, during, pace_floor)

        enqueues = [op for op in history.operations if op.kind in ENQUEUES]
        acked = {(tenant, i) for op in enqueues for i in op.enqueued_item_ids()}
        acked_before = {
            (tenant, i)
            for op in enqueues
            if op.end_wall < taken_wall
            for i in op.enqueued_item_ids()
        }
        sent_after = {
            (tenant, i)
            for op in enqueues
            if op.start_wall > exported_wall
            for i in op.enqueued_item_ids()
        }
        completed_before = {
            (tenant, str(op.item_id)): int(op.fence or 0)
            for op in history.operations
            if op.kind is OpKind.COMPLETE and op.accepted and op.end_wall < taken_wall
        }
        extras += completion_violations(live, acked)
        metrics["items_enqueued"] = len(acked)

        versions = {
            "server": cluster.pg_version(),
            "pg_dump": _run([str(programs / "pg_dump"), "--version"]).stdout.strip(),
        }
        metrics["versions"] = dict(versions)
        if _major(versions["server"]) != _major(versions["pg_dump"].rsplit(" ", 1)[-1]):
            extras.append(Violation("pg_dump", f"pg_dump of another major version: {versions}"))
        if dumped.returncode != 0:
            extras.append(Violation("pg_dump", f"pg_dump failed: {dumped.stderr[-500:]}"))
        else:
            with cluster.db() as conn:
                conn.execute(f"CREATE DATABASE {RESTORED}")
            restored_url = cluster.pg.tcp_url(RESTORED, HOST)
            started = time.monotonic()
            restored = _run(
                [
                    str(programs / "pg_restore"),
                    "--exit-on-error",
                    "--dbname",
                    restored_url,
                    str(dump_file),
                ]
            )
            metrics["pg_restore_seconds"] = round(time.monotonic() - started, 2)
            metrics["dump_mb"] = round(dump_file.stat().st_size / 2**20, 2)
            if restored.returncode != 0:
                extras.append(Violation("pg_restore", f"pg_restore: {restored.stderr[-500:]}"))
            else:
                then = _read(restored_url)
                metrics["items_live"] = len(live.items)
                metrics["items_restored"] = len(then.items)
                metrics["items_acknowledged_before_the_snapshot"] = len(acked_before)
                metrics["completions_acknowledged_before_the_snapshot"] = len(completed_before)
                metrics["items_sent_after_the_snapshot"] = len(sent_after)
                extras += restored_violations(
                    live,
                    then,
                    acked_before=acked_before,
                    completed_before=completed_before,
                    sent_after=sent_after,
                )
                missing = _tables(cluster.db_url) - _tables(restored_url)
                if missing:
                    extras.append(Violation("restored", f"tables not restored: {sorted(missing)}"))
        client.close()
    report = with_extras(report, extras)
    return ScenarioOutcome(report, time.monotonic() - began, metrics, history, live)
