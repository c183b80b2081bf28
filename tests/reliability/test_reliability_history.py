"""The history recorder: thread safety, hashing, JSONL round trip, merging."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from reliability.history import (
    History,
    HistoryRecorder,
    OpKind,
    hash_body,
    hash_json,
    parse_body,
)
from reliability.model import ManualClock

pytestmark = pytest.mark.timeout(20)


def _recorder(source: str = "t", start: float = 0.0) -> tuple[HistoryRecorder, ManualClock]:
    clock = ManualClock(start)
    return HistoryRecorder(source=source, clock=clock, wall_clock=clock.wall), clock


def test_hashes_are_canonical() -> None:
    assert hash_body(b'{"a": 1, "b": [1, 2]}') == hash_body(b'{"b":[1,2],"a":1}')
    assert hash_body(b'{"a": 1}') == hash_json({"a": 1})
    assert hash_body(b'{"a": 1}') != hash_body(b'{"a": 2}')
    assert hash_body(b"not json") != hash_body(b"not json!")
    assert hash_body(b"") is not None
    assert hash_body(None) is None
    assert parse_body(b"\xff\xfe") is None
    assert parse_body(b"[1, null]") == [1, None]


def test_begin_and_finish_record_every_field() -> None:
    rec, clock = _recorder()
    request = {"worker": "w1", "fence": 3, "result": {"ok": True}}
    pending = rec.begin(
        OpKind.COMPLETE,
        tenant="acme",
        item_id="i1",
        fence=3,
        worker="w1",
        idempotency_key="k1",
        request_body=request,
    )
    clock.advance(0.25)
    body = json.dumps({"item_id": "i1", "state": "completed"}).encode()
    op = rec.finish(pending, status=200, body=body, replayed=True)
    assert op.op_id == 1
    assert op.kind is OpKind.COMPLETE
    assert (op.tenant, op.item_id, op.fence, op.worker) == ("acme", "i1", 3, "w1")
    assert op.idempotency_key == "k1"
    assert op.request_body_hash == hash_json(request)
    assert op.response_body == {"item_id": "i1", "state": "completed"}
    assert op.response_body_hash == hash_body(body)
    assert op.end_mono - op.start_mono == pytest.approx(0.25)
    assert op.end_wall - op.start_wall == pytest.approx(0.25)
    assert op.accepted
    assert op.definitive
    assert op.replayed
    assert not op.indeterminate
    assert op.source == "t"


def test_answer_classes() -> None:
    rec, _ = _recorder()

    def answer(status: int | None, code: str | None = None) -> HistoryRecorder:
        pending = rec.begin(OpKind.REQUEUE, tenant="t", idempotency_key="k")
        if status is None:
            rec.fail(pending, TimeoutError("read timed out"))
        else:
            rec.finish(pending, status=status, body=json.dumps({"code": code}).encode())
        return rec

    for status, code in [
        (409, "stale-fence"),
        (409, "idempotency-key-in-flight"),
        (422, "idempotency-key-reuse"),
        (429, "backlog-cap-reached"),
        (503, "database-unavailable"),
        (None, None),
    ]:
        answer(status, code)
    ops = rec.history().operations
    assert [op.definitive for op in ops] == [True, False, True, False, False, False]
    assert [op.indeterminate for op in ops] == [False, False, False, False, True, True]
    assert ops[0].problem_code == "stale-fence"
    assert ops[-1].error == "TimeoutError: read timed out"
    assert ops[-1].response_body_hash is None
    assert not ops[-1].answered


def test_leases_and_enqueued_ids_are_parsed_from_bodies() -> None:
    rec, _ = _recorder()
    acquire = rec.finish(
        rec.begin(OpKind.ACQUIRE, tenant="t", worker="w"),
        status=200,
        body=b'{"leases": [{"item_id": "a", "fence": 1}, {"item_id": "b", "fence": 4}]}',
    )
    assert acquire.leases() == [("a", 1), ("b", 4)]
    batch_request = {"items": [{"payload": 1}, {"payload": 2}, {"payload": 3}]}
    pending = rec.begin(OpKind.ENQUEUE_BATCH, tenant="t", request_body=batch_request)
    assert pending.batch_size == 3
    batch = rec.finish(
        pending,
        status=201,
        body=b'{"items": [{"item_id": "x"}, {"item_id": "y"}, {"item_id": "z"}]}',
    )
    assert batch.enqueued_item_ids() == ["x", "y", "z"]
    single = rec.finish(rec.begin("enqueue", tenant="t"), status=201, body=b'{"item_id": "s"}')
    assert single.enqueued_item_ids() == ["s"]
    refused = rec.finish(rec.begin("enqueue", tenant="t"), status=429, body=b'{"item_id": "s"}')
    assert refused.enqueued_item_ids() == []
    assert refused.leases() == []


def test_recorder_is_thread_safe() -> None:
    rec = HistoryRecorder()
    barrier = threading.Barrier(8)

    def work(n: int) -> None:
        barrier.wait()
        for i in range(250):
            pending = rec.begin(OpKind.HEARTBEAT, tenant=f"t{n}", item_id=str(i), fence=i)
            rec.finish(pending, status=200, body=b"{}")
            if i % 50 == 0:
                rec.record_backlog(f"t{n}", i, 1000)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    history = rec.history()
    assert len(rec) == 2000
    assert [op.op_id for op in history.operations] == list(range(1, 2001))
    assert len(history.samples) == 40
    assert all(op.end_mono >= op.start_mono for op in history.operations)


def test_jsonl_round_trip(tmp_path: Path) -> None:
    rec, clock = _recorder()
    pending = rec.begin(
        OpKind.ENQUEUE,
        tenant="acme",
        queue="q",
        idempotency_key="k\u00e9",
        request_body={"payload": "caf\u00e9 \u2603"},
    )
    clock.advance()
    rec.finish(pending, status=201, body='{"item_id": "i", "payload": "\u2603"}'.encode())
    rec.fail(rec.begin(OpKind.COMPLETE, tenant="acme", item_id="i", fence=1), "reset")
    rec.finish(rec.begin(OpKind.ACQUIRE, tenant="acme"), status=200, body=b"plain text")
    rec.record_backlog("acme", 3, 10)
    rec.note_fault("proxy", "reset")
    rec.record_quiescent("acme", {"ready": 1, "completed": 0})
    history = rec.history()
    path = tmp_path / "history.jsonl"
    history.dump_jsonl(path)
    assert len(path.read_text(encoding="utf-8").splitlines()) == 6
    assert History.load_jsonl(path) == history


def test_load_rejects_unknown_records(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"type": "mystery"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="unknown record type"):
        History.load_jsonl(path)
    path.write_text('{"type": "op", "op_id": "one"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="op_id"):
        History.load_jsonl(path)


def test_merge_orders_by_start_and_renumbers() -> None:
    first, clock_a = _recorder("worker-a", start=10.0)
    second, clock_b = _recorder("worker-b", start=5.0)
    for rec, clock in ((first, clock_a), (second, clock_b)):
        for _ in range(3):
            pending = rec.begin(OpKind.HEARTBEAT, tenant="t")
            clock.advance(1.0)
            rec.finish(pending, status=200)
        rec.note_fault("sigstop", rec.history().operations[0].source)
    merged = History.merge(first.history(), second.history())
    assert [op.op_id for op in merged.operations] == [1, 2, 3, 4, 5, 6]
    assert [op.source for op in merged.operations] == ["worker-b"] * 3 + ["worker-a"] * 3
    assert [op.start_mono for op in merged.operations] == [5.0, 6.0, 7.0, 10.0, 11.0, 12.0]
    assert [fault.detail for fault in merged.faults] == ["worker-b", "worker-a"]
