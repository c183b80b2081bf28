"""A worker process for the claim storm: ``python -m reliability.worker ...``.

It runs ``--threads`` worker loops (each its own worker name) against one
tenant's queue and records every request. It stops after ``--duration``
seconds, on SIGTERM, or once every thread saw ``--until-empty`` empty polls in
a row; then it writes its history as JSONL to ``--out`` (and counters to
``--out`` + ``.stats.json``). The harness may SIGSTOP and SIGCONT it at any
time: that is the point.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import threading
from pathlib import Path

from reliability.client import RecordingClient, WorkerStats, run_worker
from reliability.history import HistoryRecorder

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reliability.worker")
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--queue", default="q")
    parser.add_argument("--name", required=True)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--ttl", type=float, default=1.5)
    parser.add_argument("--max-items", type=int, default=2)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--until-empty", type=int, default=0)
    parser.add_argument("--requeue-ratio", type=float, default=0.0)
    parser.add_argument("--heartbeat-ratio", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    timer = threading.Timer(args.duration, stop.set)
    timer.daemon = True
    timer.start()

    recorder = HistoryRecorder(source=args.name)
    client = RecordingClient(args.url, args.key, args.tenant, recorder, retry_for=15.0, stop=stop)
    all_stats: list[WorkerStats] = []
    threads: list[threading.Thread] = []
    for i in range(args.threads):
        stats = WorkerStats()
        all_stats.append(stats)
        rng = random.Random(args.seed * 1000 + i)
        thread = threading.Thread(
            target=run_worker,
            args=(client, args.queue, f"{args.name}-t{i}", stop),
            kwargs={
                "ttl": args.ttl,
                "max_items": args.max_items,
                "requeue_ratio": args.requeue_ratio,
                "heartbeat_ratio": args.heartbeat_ratio,
                "work_seconds": lambda rng=rng: rng.random() * 0.01,
                "until_empty": args.until_empty,
                "stats": stats,
                "rng": rng,
            },
            daemon=True,
        )
        threads.append(thread)
        thread.start()
    for thread in threads:
        thread.join(args.duration + 60)
    timer.cancel()
    client.close()
    out = Path(args.out)
    recorder.history().dump_jsonl(out)
    totals = {
        "acquired": sum(s.acquired for s in all_stats),
        "completed": sum(s.completed for s in all_stats),
        "refused": sum(s.refused for s in all_stats),
        "requeued": sum(s.requeued for s in all_stats),
        "errors": sum(s.errors for s in all_stats),
        "attempts": client.attempts,
        "retries": client.retries,
    }
    Path(f"{out}.stats.json").write_text(json.dumps(totals), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
