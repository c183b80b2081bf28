"""The pg_dump scenario's own checks: a restored database is a state the live one went
through, the drain completed every item once, and the pace during the dump."""

from __future__ import annotations

from reliability.checkers import DatabaseSnapshot
from reliability.pgdump import completion_violations, pace_violations, restored_violations


def snapshot(*items: tuple[str, str, int, list[str]]) -> DatabaseSnapshot:
    """Items of tenant `t`: (item_id, state, fence, ledger kinds); each acquired event
    carries the next fence."""
    rows, events = [], []
    for item_id, state, fence, kinds in items:
        acquired = 0
        for seq, kind in enumerate(kinds):
            acquired += kind == "acquired"
            events.append(
                {"tenant": "t", "item_id": item_id, "seq": seq, "kind": kind, "fence": acquired}
            )
        rows.append(
            {
                "tenant": "t",
                "item_id": item_id,
                "state": state,
                "fence": fence,
                "acquisition_count": acquired,
            }
        )
    return DatabaseSnapshot.from_rows(rows, events)


DONE = ["enqueued", "acquired", "completed"]


def test_an_earlier_consistent_state_passes() -> None:
    live = snapshot(("a", "completed", 1, DONE), ("b", "completed", 1, DONE))
    restored = snapshot(("a", "completed", 1, DONE))
    assert (
        restored_violations(
            live,
            restored,
            acked_before=[("t", "a")],
            completed_before={("t", "a"): 1},
            sent_after=[("t", "b")],
        )
        == []
    )


def test_a_restored_database_missing_an_acknowledged_item_or_holding_a_later_one_fails() -> None:
    live = snapshot(("a", "completed", 1, DONE), ("b", "completed", 1, DONE))
    restored = snapshot(("b", "ready", 0, ["enqueued"]))
    found = restored_violations(
        live,
        restored,
        acked_before=[("t", "a")],
        completed_before={("t", "a"): 1},
        sent_after=[("t", "b")],
    )
    assert [v.checker for v in found] == ["restored", "restored", "restored"]
    assert {v.item_id for v in found} == {"a", "b"}


def test_a_restored_ledger_that_does_not_fold_fails() -> None:
    live = snapshot(("a", "completed", 1, DONE))
    restored = snapshot(("a", "leased", 1, ["enqueued"]))
    found = restored_violations(live, restored, acked_before=[], completed_before={}, sent_after=[])
    assert [(v.checker, v.message) for v in found] == [
        ("restored-ledger", "fence 1 but the highest acquired fence in the ledger is 0")
    ]


def test_the_drain_must_complete_every_item_exactly_once() -> None:
    live = snapshot(("a", "completed", 1, DONE), ("b", "ready", 0, ["enqueued"]))
    found = completion_violations(live, [("t", "a"), ("t", "b"), ("t", "c")])
    assert [(v.checker, v.item_id) for v in found] == [("drained", "b"), ("drained", "c")]


def test_the_pace_during_the_dump_is_judged_against_the_pace_before() -> None:
    assert pace_violations(100.0, 60.0, 0.5) == []
    (slow,) = pace_violations(100.0, 40.0, 0.5)
    assert "0.40x" in slow.message
    assert pace_violations(0.0, 10.0, 0.5)[0].checker == "pace"
