"""The schedules scenario's own checks find a lost tick and a second item for a tick."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from reliability.schedules import ALL_BOUNDED, SKIP, _violations

T0 = datetime(2026, 6, 1, 12, tzinfo=UTC)


def _items(*seconds: int) -> list[tuple[datetime, str, float]]:
    return [(T0 + timedelta(seconds=s), f"item-{i}", 0.01) for i, s in enumerate(seconds)]


def test_consecutive_ticks_with_one_item_each_pass() -> None:
    ticks = {ALL_BOUNDED[0]: _items(0, 1, 2, 3), SKIP: _items(0, 3)}
    assert _violations(ticks, {ALL_BOUNDED[0], SKIP}) == ([], 0, 0)


def test_a_gap_under_all_bounded_is_a_lost_tick_and_a_gap_under_skip_is_not() -> None:
    ticks = {ALL_BOUNDED[0]: _items(0, 1, 4), SKIP: _items(0, 4)}
    found, lost, duplicated = _violations(ticks, {ALL_BOUNDED[0], SKIP})
    assert (lost, duplicated) == (2, 0)
    assert [v.checker for v in found] == ["no-lost-tick", "no-lost-tick"]


def test_two_items_for_one_tick_are_a_duplicate() -> None:
    ticks = {SKIP: _items(0, 1, 1)}
    found, lost, duplicated = _violations(ticks, {SKIP})
    assert (lost, duplicated) == (0, 1)
    assert [v.checker for v in found] == ["one-item-per-tick"]
