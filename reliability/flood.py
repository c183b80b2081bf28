"""A flooding tenant as its own process: ``python -m reliability.flood ...``.

``--threads`` loops enqueue batches as fast as the server answers (mostly 429
once the tenant is at its cap) for ``--duration`` seconds or until SIGTERM, then
writes its history as JSONL to ``--out`` and the answer counts to ``--out`` +
``.stats.json``. Running the flood outside the measuring process keeps the
load generator from stealing the measurer's interpreter (its GIL) and so from
inflating the latencies it measures.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from collections import Counter
from pathlib import Path

from reliability.client import RecordingClient
from reliability.history import HistoryRecorder, JSONValue

__all__ = ["flood", "main"]


def flood(client: RecordingClient, queue: str, batch: int, stop: threading.Event) -> Counter[str]:
    """Enqueue batches until ``stop``; returns the count of each answer status."""
    answers: Counter[str] = Counter()
    payloads: list[JSONValue] = [{"flood": True}] * batch
    while not stop.is_set():
        op = client.enqueue_batch(queue, payloads)
        answers[str(op.status)] += 1
    return answers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reliability.flood")
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--tenant", required=True)
    parser.add_argument("--queue", default="q")
    parser.add_argument("--name", default="flood")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=5)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    timer = threading.Timer(args.duration, stop.set)
    timer.daemon = True
    timer.start()
    recorder = HistoryRecorder(source=args.name)
    client = RecordingClient(args.url, args.key, args.tenant, recorder, retry_for=5.0, stop=stop)
    totals: Counter[str] = Counter()
    lock = threading.Lock()

    def run() -> None:
        counts = flood(client, args.queue, args.batch, stop)
        with lock:
            totals.update(counts)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(args.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(args.duration + 30)
    timer.cancel()
    client.close()
    out = Path(args.out)
    recorder.history().dump_jsonl(out)
    Path(f"{out}.stats.json").write_text(json.dumps(dict(totals)), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
