"""Each checker passes a clean history and catches a planted bug.

Histories come from the in-memory reference model (``reliability.model``),
either with one of its guards weakened, or with the history or the snapshot
edited afterwards.
"""

from __future__ import annotations

import dataclasses

import pytest

from reliability.checkers import (
    CHECKERS,
    DatabaseSnapshot,
    ItemSnapshot,
    LedgerEvent,
    Violation,
    check_backlog_cap,
    check_completions,
    check_conservation,
    check_fences,
    check_idempotent_replays,
    check_total_queue,
    render_summary_row,
    render_summary_table,
    run_all_checks,
    total_queue_view,
)
from reliability.history import History, Operation, OpKind, hash_json
from reliability.model import QueueModel

pytestmark = pytest.mark.timeout(20)

A = "acme"
B = "beta"


def _first_id(answer: tuple[int, object]) -> str:
    body = answer[1]
    assert isinstance(body, dict)
    item_id = body["item_id"]
    assert isinstance(item_id, str)
    return item_id


def _code(answer: tuple[int, object]) -> object:
    body = answer[1]
    return body.get("code") if isinstance(body, dict) else None


def _exercise(m: QueueModel) -> None:
    """A run touching every operation and every fault the checkers must tolerate.

    The answers are asserted only against the correct model; a weakened one
    answers differently, which is the point.
    """
    strict = not m.weakened

    def expect(condition: bool) -> None:
        assert condition or not strict

    ids = [_first_id(m.enqueue(A, key=f"e{n}", payload=n)) for n in range(4)]
    m.enqueue(A, key="batch", count=2)
    m.enqueue(B, key="b1", payload="b")
    m.probe()

    # A plain lease cycle with a heartbeat.
    [(item, fence)] = m.acquire(A, "w1")
    expect(item == ids[0])
    m.heartbeat(A, item, "w1", fence)
    expect(m.complete(A, item, "w1", fence, key="c0")[0] == 200)

    # Lost reply on complete; the retry with the same key replays the answer.
    [(item, fence)] = m.acquire(A, "w1")
    m.complete(A, item, "w1", fence, key="c1", lose_reply=True)
    expect(m.complete(A, item, "w1", fence, key="c1")[0] == 200)
    expect(m.complete(A, item, "w1", fence, key="c1")[0] == 200)

    # An expired lease: the successor gets a higher fence; the stale holder is refused.
    [(item, fence_old)] = m.acquire(A, "w1")
    m.expire(A, item)
    [(item2, fence_new)] = m.acquire(A, "w2")
    expect(item2 == item)
    expect(fence_new > fence_old)
    expect(_code(m.complete(A, item, "w1", fence_old, key="stale")) == "stale-fence")
    expect(m.heartbeat(A, item, "w1", fence_old)[0] == 409)
    # A requeue whose reply was lost, then a successor acquires, then the retry replays:
    # the accepted 200 of an earlier attempt is not a stale write.
    m.requeue(A, item, "w2", fence_new, key="rq", lose_reply=True)
    [(item3, fence3)] = m.acquire(A, "w3")
    expect(item3 == item)
    expect(m.requeue(A, item, "w2", fence_new, key="rq")[0] == 200)
    expect(m.triage(A, item, "w3", fence3, key="tr", decision="quarantine")[0] == 200)

    # The same key with a different body is refused.
    expect(m.enqueue(A, key="e0", payload="other")[0] == 422)
    # An enqueue whose reply was lost and never retried: indeterminate, item exists.
    m.enqueue(A, key="lost", lose_reply=True)
    # B at its cap of 2: the third is refused with 429.
    m.enqueue(B, key="b2")
    expect(m.enqueue(B, key="b3")[0] == 429)
    m.probe()
    m.quiescent(A)
    m.quiescent(B)


def _clean() -> QueueModel:
    m = QueueModel(caps={A: 20, B: 2})
    _exercise(m)
    return m


def _codes(violations: list[Violation]) -> set[str]:
    return {v.checker for v in violations}


def _only(history: History, kind: OpKind) -> list[Operation]:
    return [op for op in history.operations if op.kind is kind]


def _replace_item(snapshot: DatabaseSnapshot, item_id: str, **changes: object) -> DatabaseSnapshot:
    return DatabaseSnapshot(
        tuple(
            dataclasses.replace(item, **changes) if item.item_id == item_id else item  # type: ignore[arg-type]
            for item in snapshot.items
        )
    )


def _completed_id(history: History) -> str:
    op = next(op for op in _only(history, OpKind.COMPLETE) if op.accepted)
    assert op.item_id is not None
    return op.item_id


# ---------------------------------------------------------------------- clean


def test_clean_history_passes_every_checker() -> None:
    m = _clean()
    history, snapshot = m.recorder.history(), m.snapshot()
    assert check_completions(history, snapshot) == []
    assert check_fences(history, snapshot) == []
    assert check_conservation(history, snapshot) == []
    assert check_backlog_cap(history) == []
    assert check_idempotent_replays(history) == []
    assert check_total_queue(history, snapshot) == []
    report = run_all_checks(history, snapshot, scenario="clean")
    assert report.passed
    assert report.by_checker == dict.fromkeys(CHECKERS, 0)
    view = total_queue_view(history, snapshot)
    assert view.lost == view.duplicated == view.unexpected == ()
    assert len(view.recovered) == 1  # the enqueue whose answer was lost
    assert view.acknowledged == 8  # acme 4 + a batch of 2, beta 2


def test_unanswered_enqueue_that_made_nothing_is_allowed() -> None:
    m = _clean()
    history, snapshot = m.recorder.history(), m.snapshot()
    [recovered] = total_queue_view(history, snapshot).recovered
    without = DatabaseSnapshot(tuple(i for i in snapshot.items if i.key != recovered))
    assert check_conservation(history, without) == []
    assert check_total_queue(history, without) == []


# ------------------------------------------------------------------ checker 1


def test_acknowledged_completion_missing_from_snapshot_fails_checker_1() -> None:
    m = _clean()
    history, snapshot = m.recorder.history(), m.snapshot()
    done = _completed_id(history)
    item = snapshot.index()[(A, done)]
    lost = _replace_item(
        snapshot,
        done,
        state="ready",
        events=tuple(e for e in item.events if e.kind != "completed"),
    )
    violations = check_completions(history, lost)
    assert _codes(violations) == {"completions"}
    messages = " ".join(v.message for v in violations)
    assert "'ready'" in messages
    assert "no completed event" in messages
    assert all(v.item_id == done for v in violations)


def test_forgotten_completion_fails_checker_1() -> None:
    m = QueueModel(caps={A: 20, B: 2}, forget_completions=True)
    _exercise(m)
    violations = check_completions(m.recorder.history(), m.snapshot())
    assert violations
    assert _codes(violations) == {"completions"}


def test_item_missing_entirely_fails_checker_1() -> None:
    m = _clean()
    history, snapshot = m.recorder.history(), m.snapshot()
    done = _completed_id(history)
    gone = DatabaseSnapshot(tuple(i for i in snapshot.items if i.item_id != done))
    assert any("missing" in v.message for v in check_completions(history, gone))


def test_second_accepted_completion_fails_checker_1_and_is_a_duplicate() -> None:
    m = _clean()
    history, snapshot = m.recorder.history(), m.snapshot()
    first = next(op for op in _only(history, OpKind.COMPLETE) if op.accepted)
    second = dataclasses.replace(
        first,
        op_id=10_000,
        idempotency_key="another-key",
        start_mono=first.end_mono + 5,
        end_mono=first.end_mono + 6,
    )
    doubled = dataclasses.replace(history, operations=(*history.operations, second))
    violations = check_completions(doubled, snapshot)
    assert any("2 distinct accepted requests" in v.message for v in violations)
    view = total_queue_view(doubled, snapshot)
    assert view.duplicated == ((A, first.item_id),)


def test_two_completed_ledger_events_fail_checker_1() -> None:
    m = _clean()
    history, snapshot = m.recorder.history(), m.snapshot()
    done = _completed_id(history)
    item = snapshot.index()[(A, done)]
    extra = LedgerEvent(len(item.events) + 1, "completed", item.fence)
    twice = _replace_item(snapshot, done, events=(*item.events, extra))
    assert any("2 completed events" in v.message for v in check_completions(history, twice))


# ------------------------------------------------------------------ checker 2


def test_accepted_stale_fence_fails_checker_2() -> None:
    m = QueueModel(caps={A: 20, B: 2}, accept_stale_fence=True)
    _exercise(m)
    violations = check_fences(m.recorder.history(), m.snapshot())
    assert _codes(violations) == {"fences"}
    assert any("accepted complete carried fence" in v.message for v in violations)
    assert any("ledger completed event" in v.message for v in violations)


def test_stale_complete_planted_into_history_fails_checker_2() -> None:
    m = _clean()
    history = m.recorder.history()
    refused = next(op for op in _only(history, OpKind.COMPLETE) if op.problem_code == "stale-fence")
    accepted = dataclasses.replace(refused, status=200, response_body={"state": "completed"})
    planted = dataclasses.replace(
        history,
        operations=tuple(accepted if op is refused else op for op in history.operations),
    )
    violations = check_fences(planted, m.snapshot())
    assert len(violations) == 1
    assert violations[0].op_ids[1] == refused.op_id


def test_replay_of_an_earlier_attempt_is_not_stale_but_a_late_first_attempt_is() -> None:
    m = _clean()
    history, snapshot = m.recorder.history(), m.snapshot()
    requeues = [op for op in _only(history, OpKind.REQUEUE) if op.idempotency_key == "rq"]
    lost_attempt, replay = requeues
    assert lost_attempt.status is None
    assert replay.accepted
    assert check_fences(history, snapshot) == []
    # Without the early attempt, the accepted answer came after a higher fence was handed out.
    without = dataclasses.replace(
        history, operations=tuple(op for op in history.operations if op is not lost_attempt)
    )
    violations = check_fences(without, snapshot)
    assert len(violations) == 1
    assert "requeue carried fence" in violations[0].message


def _acquire(op_id: int, item_id: str, fence: int, start: float, end: float) -> Operation:
    return Operation(
        op_id=op_id,
        kind=OpKind.ACQUIRE,
        tenant=A,
        start_mono=start,
        end_mono=end,
        start_wall=start,
        end_wall=end,
        worker=f"w{op_id}",
        status=200,
        response_body={"leases": [{"item_id": item_id, "fence": fence}]},
    )


def test_fences_in_real_time_order_must_increase() -> None:
    sequential = History((_acquire(1, "i", 2, 0.0, 1.0), _acquire(2, "i", 1, 2.0, 3.0)))
    violations = check_fences(sequential, DatabaseSnapshot())
    assert len(violations) == 1
    assert "lower fence 1" in violations[0].message
    # Overlapping acquires may be served in either order.
    overlapping = History((_acquire(1, "i", 2, 0.0, 2.5), _acquire(2, "i", 1, 2.0, 3.0)))
    assert check_fences(overlapping, DatabaseSnapshot()) == []
    # The same fence to two holders is wrong whatever the timing.
    same = History((_acquire(1, "i", 3, 0.0, 2.5), _acquire(2, "i", 3, 2.0, 3.0)))
    assert any(
        "handed out by 2 acquires" in v.message for v in check_fences(same, DatabaseSnapshot())
    )


def test_ledger_fences_must_increase() -> None:
    events = (
        LedgerEvent(1, "enqueued", 0),
        LedgerEvent(2, "acquired", 1),
        LedgerEvent(3, "acquired", 1),
        LedgerEvent(4, "acquired", 2),
        LedgerEvent(5, "completed", 1),
    )
    snapshot = DatabaseSnapshot((ItemSnapshot("i", A, "completed", 2, 3, events),))
    messages = [v.message for v in check_fences(History(), snapshot)]
    assert len(messages) == 2
    assert "seq 3 has fence 1" in messages[0]
    assert "completed event seq 5" in messages[1]


def test_acquired_fence_unknown_to_the_ledger_fails_checker_2() -> None:
    m = _clean()
    history, snapshot = m.recorder.history(), m.snapshot()
    grant = _only(history, OpKind.ACQUIRE)[0]
    [(item_id, fence)] = grant.leases()
    item = snapshot.index()[(A, item_id)]
    trimmed = _replace_item(
        snapshot,
        item_id,
        events=tuple(e for e in item.events if not (e.kind == "acquired" and e.fence == fence)),
    )
    violations = check_fences(history, trimmed)
    assert any("no acquired event with that fence" in v.message for v in violations)


# ------------------------------------------------------------------ checker 3


def test_lost_enqueue_fails_checker_3_and_6() -> None:
    m = _clean()
    history, snapshot = m.recorder.history(), m.snapshot()
    victim = next(op for op in _only(history, OpKind.ENQUEUE) if op.accepted and op.tenant == B)
    [item_id] = victim.enqueued_item_ids()
    lost = DatabaseSnapshot(tuple(i for i in snapshot.items if i.item_id != item_id))
    conservation = check_conservation(history, lost)
    assert len(conservation) == 1
    assert conservation[0].tenant == B
    assert "2 enqueued items were acknowledged but only 1" in conservation[0].message
    view = total_queue_view(history, lost)
    assert view.lost == ((B, item_id),)
    assert _codes(check_total_queue(history, lost)) == {"total-queue"}


def test_unaccounted_extra_item_fails_checker_3_and_6() -> None:
    m = _clean()
    history, snapshot = m.recorder.history(), m.snapshot()
    ghost = ItemSnapshot("ghost", B, "ready", 0, 0, (LedgerEvent(1, "enqueued", 0),))
    extra = DatabaseSnapshot((*snapshot.items, ghost))
    conservation = check_conservation(history, extra)
    assert len(conservation) == 1
    assert "3 items exist" in conservation[0].message
    assert total_queue_view(history, extra).unexpected == ((B, "ghost"),)


def test_quiescent_point_with_missing_items_fails_checker_3() -> None:
    m = _clean()
    m.recorder.record_quiescent(A, {"completed": 1})
    violations = check_conservation(m.recorder.history(), m.snapshot())
    assert len(violations) == 1
    assert "quiescent point" in violations[0].message


def test_unknown_state_fails_checker_3() -> None:
    m = _clean()
    snapshot = m.snapshot()
    weird = _replace_item(snapshot, snapshot.items[0].item_id, state="limbo")
    assert any(
        "unknown item state" in v.message for v in check_conservation(m.recorder.history(), weird)
    )


# ------------------------------------------------------------------ checker 4


def test_backlog_above_cap_fails_checker_4() -> None:
    m = QueueModel(caps={A: 20, B: 2}, ignore_cap=True)
    _exercise(m)
    violations = check_backlog_cap(m.recorder.history())
    assert len(violations) == 1
    assert violations[0].tenant == B
    assert "backlog 3 above the cap 2" in violations[0].message


def test_backlog_sample_planted_above_cap_fails_checker_4() -> None:
    m = _clean()
    m.recorder.record_backlog(A, 21, 20)
    assert len(check_backlog_cap(m.recorder.history())) == 1


# ------------------------------------------------------------------ checker 5


def test_replay_with_a_different_body_fails_checker_5() -> None:
    m = _clean()
    history = m.recorder.history()
    replays = [op for op in _only(history, OpKind.COMPLETE) if op.idempotency_key == "c1"]
    original, *later = [op for op in replays if op.accepted]
    assert later
    changed = dataclasses.replace(later[0], response_body_hash=hash_json({"state": "ready"}))
    planted = dataclasses.replace(
        history,
        operations=tuple(changed if op is later[0] else op for op in history.operations),
    )
    violations = check_idempotent_replays(planted)
    assert len(violations) == 1
    assert "a different body" in violations[0].message
    assert violations[0].op_ids == (original.op_id, changed.op_id)


def test_replay_with_a_different_status_fails_checker_5() -> None:
    def cycle(m: QueueModel) -> History:
        m.enqueue(A, key="e", payload=1)
        [(item, fence)] = m.acquire(A, "w1")
        m.complete(A, item, "w1", fence, key="c")
        m.complete(A, item, "w1", fence, key="c")  # the client retries: must replay the 200
        return m.recorder.history()

    assert check_idempotent_replays(cycle(QueueModel())) == []
    violations = check_idempotent_replays(cycle(QueueModel(ignore_idempotency=True)))
    assert len(violations) == 1
    assert "status 409 instead of 200" in violations[0].message


def test_key_reused_for_another_body_and_accepted_fails_checker_5() -> None:
    m = QueueModel(ignore_idempotency=True)
    m.enqueue(A, key="same", payload=1)
    m.enqueue(A, key="same", payload=2)
    violations = check_idempotent_replays(m.recorder.history())
    assert any("accepted for 2 different request bodies" in v.message for v in violations)
    assert check_idempotent_replays(_clean().recorder.history()) == []


def test_in_flight_answers_and_5xx_are_not_receipts() -> None:
    m = QueueModel()
    m.enqueue(A, key="k", payload=1)
    history = m.recorder.history()
    [op] = history.operations
    busy = dataclasses.replace(
        op, op_id=2, status=409, response_body={"code": "idempotency-key-in-flight"}
    )
    crash = dataclasses.replace(op, op_id=3, status=503, response_body={"code": "unavailable"})
    extended = dataclasses.replace(history, operations=(op, busy, crash))
    assert check_idempotent_replays(extended) == []


# ------------------------------------------------------------------ checker 6


def test_retried_enqueue_that_makes_a_second_item_is_duplicated() -> None:
    m = QueueModel(ignore_idempotency=True)
    m.enqueue(A, key="once", payload="x", lose_reply=True)
    m.enqueue(A, key="once", payload="x")
    m.enqueue(A, key="once", payload="x")
    view = total_queue_view(m.recorder.history(), m.snapshot())
    assert len(view.duplicated) == 1
    assert view.lost == ()
    assert _codes(check_total_queue(m.recorder.history(), m.snapshot())) == {"total-queue"}
    # The same retries against the correct model replay one item.
    ok = QueueModel()
    ok.enqueue(A, key="once", payload="x", lose_reply=True)
    ok.enqueue(A, key="once", payload="x")
    ok.enqueue(A, key="once", payload="x")
    assert check_total_queue(ok.recorder.history(), ok.snapshot()) == []
    assert len(ok.snapshot().items) == 1


def test_phantom_lease_is_unexpected() -> None:
    m = _clean()
    history = m.recorder.history()
    phantom = _acquire(10_000, "never-enqueued", 1, 5000.0, 5001.0)
    planted = dataclasses.replace(history, operations=(*history.operations, phantom))
    view = total_queue_view(planted, m.snapshot())
    assert view.unexpected == ((A, "never-enqueued"),)


def test_repeated_row_is_duplicated() -> None:
    m = _clean()
    snapshot = m.snapshot()
    doubled = DatabaseSnapshot((*snapshot.items, snapshot.items[0]))
    view = total_queue_view(m.recorder.history(), doubled)
    assert view.duplicated == (snapshot.items[0].key,)


# -------------------------------------------------------------------- summary


def test_summary_rows() -> None:
    m = _clean()
    m.recorder.note_fault("proxy", "drop_after_reply")
    history, snapshot = m.recorder.history(), m.snapshot()
    good = run_all_checks(history, snapshot, scenario="lost replies")
    assert (
        render_summary_row(good)
        == f"| lost replies | {len(history.operations)} | 1 | 0 | 0 | 0 | PASS |"
    )

    done = _completed_id(history)
    broken = DatabaseSnapshot(tuple(i for i in snapshot.items if i.item_id != done))
    bad = run_all_checks(history, broken, scenario="planted", faults_injected=7)
    assert not bad.passed
    assert bad.lost == 1
    assert bad.by_checker["completions"] == 1
    assert bad.by_checker["total-queue"] == 1
    # The tenant's unanswered enqueue could account for the count: conservation alone
    # cannot tell, the total-queue view (by item id) can.
    assert bad.by_checker["conservation"] == 0
    row = render_summary_row(bad)
    assert row.startswith("| planted | ")
    assert row.endswith(f"| 7 | 1 | 0 | {len(bad.violations)} | FAIL |")

    table = render_summary_table([good, bad]).splitlines()
    assert table[0] == (
        "| scenario | operations | faults injected | lost | duplicated "
        "| invariant violations | result |"
    )
    assert len(table) == 4
    assert all(str(v) for v in bad.violations)


def test_snapshot_round_trips_through_json(tmp_path: pytest.TempPathFactory) -> None:
    snapshot = _clean().snapshot()
    path = f"{tmp_path}/snapshot.json"
    snapshot.dump(path)
    assert DatabaseSnapshot.load(path) == snapshot


def test_snapshot_from_database_rows() -> None:
    snapshot = DatabaseSnapshot.from_rows(
        [{"tenant_id": A, "item_id": "i", "state": "leased", "fence": 1, "acquisition_count": 1}],
        [
            {"tenant_id": A, "item_id": "i", "seq": 2, "kind": "acquired", "fence": 1},
            {"tenant_id": A, "item_id": "i", "seq": 1, "kind": "enqueued", "fence": 0},
        ],
    )
    [item] = snapshot.items
    assert item.key == (A, "i")
    assert [e.seq for e in item.events] == [1, 2]
