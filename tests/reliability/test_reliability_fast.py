"""The fast subset of the reliability suite against real processes: a small claim
storm (worker processes frozen past their lease) and lost replies through the
fault-injecting proxy. The full suite is ``python -m reliability``."""

from __future__ import annotations

import pytest

from reliability.scenarios import claim_storm, lost_replies


@pytest.mark.slow
def test_small_claim_storm_keeps_every_invariant() -> None:
    outcome = claim_storm(items=200, processes=2, threads=3, ttl=1.0, duration=10.0)
    assert outcome.report.violations == (), [str(v) for v in outcome.report.violations]
    assert outcome.metrics["stalls"] != 0
    assert outcome.snapshot is not None
    assert len(outcome.snapshot.items) == 200


@pytest.mark.slow
def test_lost_replies_replay_the_original_answer() -> None:
    outcome = lost_replies(duration=5.0)
    assert outcome.report.violations == (), [str(v) for v in outcome.report.violations]
    assert outcome.metrics["dropped_replies"] != 0
    assert outcome.metrics["replayed_answers"] != 0
