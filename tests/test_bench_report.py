"""The benchmark's report: a target read from a phase that ran beside other work is not judged."""

from __future__ import annotations

from typing import Any

from bench import report
from bench.stats import CpuSplit, Figure, PhaseLoad


def load(other_share: float) -> PhaseLoad:
    """A 2-core, 2-second phase in which other processes used `other_share` of the machine."""
    return PhaseLoad(
        wall=2.0,
        cores=2,
        busy=2.0 + other_share * 4.0,
        server=1.0,
        postgres=0.6,
        bench=0.4,
        load_start=0.5,
        load_end=0.9,
        top_other=(("pytest", other_share * 4.0),),
    )


def figure(key: str, value: float, *shares: float, unit: str = "items/s") -> Figure:
    return Figure(key, key, unit, runs=[value] * len(shares), loads=[load(s) for s in shares])


def document(figures: list[Figure], cpu: dict[str, CpuSplit] | None = None) -> dict[str, Any]:
    return report.build(
        run_figures={f.key: f for f in figures},
        cpu=cpu or {},
        extra={},
        errors={},
        machine={"cpus": 2, "cpu_model": "test", "memory_gb": 1, "python": "3", "kernel": "k",
                 "load_average_at_start": [0.5, 0.5, 0.5]},
        config={"quick": False, "reps": 2, "server_workers": 1, "modes": {"w1": "--workers 1"},
                "scale": "default", "postgres": "18", "commit": "abc", "started_at": "now"},
        peak_rss={"w1": 100 * 2**20},
        wall=10.0,
    )  # fmt: skip


def target(doc: dict[str, Any], name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [r for r in doc["ratios"] if r["target"] == name]
    assert len(found) == 1, name
    return found[0]


ENQUEUE = "REST batch enqueue >= 0.5x pgqueuer batch enqueue"


def test_ratio_of_quiet_phases_is_judged() -> None:
    doc = document(
        [figure("rest_enqueue_batch", 600.0, 0.02, 0.05), figure("peer_enqueue_batch", 1000.0, 0.1)]
    )
    r = target(doc, ENQUEUE)
    assert (r["status"], r["met"], r["value"]) == ("met", True, 0.6)


def test_ratio_whose_denominator_ran_beside_other_work_is_not_comparable() -> None:
    doc = document(
        [
            figure("rest_enqueue_batch", 100.0, 0.0, 0.0),
            figure("peer_enqueue_batch", 1000.0, 0.0, 0.3),
        ]
    )
    r = target(doc, ENQUEUE)
    assert (r["status"], r["met"]) == ("not comparable", None)
    (why,) = r["not_comparable_because"]
    assert why.startswith("peer_enqueue_batch: other work 30.0% of the machine")
    assert "pytest 1.2 s" in why
    markdown = report.markdown(doc)
    assert "not comparable" in markdown
    row = next(line for line in report.readme_table(doc) if line.startswith(f"| {ENQUEUE} "))
    assert "100" not in row.split("not comparable")[0]  # no figure of that run in docs/speed.md


def test_at_most_target_of_a_loaded_phase_is_not_comparable() -> None:
    doc = document([figure("acquire_p50_ms_c1@w1", 0.5, 0.11, unit="ms")])
    r = target(doc, "acquire p50 at one worker <= 0.8 ms [--workers 1]")
    assert r["status"] == "not comparable"


def test_figure_without_a_load_record_is_not_quiet() -> None:
    fig = Figure("x", "x", "ms", runs=[1.0])
    assert not fig.quiet
    assert "no record" in fig.why_not_quiet()


def test_run_says_at_the_top_whether_every_phase_was_quiet() -> None:
    quiet, loud = CpuSplit(), CpuSplit()
    quiet.add(load(0.01), 0.0)
    loud.add(load(0.25), 0.0)
    assert "**Quiet run**" in report.markdown(document([], {"a": quiet})).splitlines()[2]
    top = report.markdown(document([], {"a": quiet, "b": loud})).splitlines()[2]
    assert top.startswith("**Not a quiet run**: in 1 of its 2 phases")


def test_other_work_is_busy_time_less_the_parties() -> None:
    phase = load(0.2)
    assert round(phase.other, 6) == 0.8
    assert round(phase.share, 6) == 0.2
    assert not phase.quiet
    assert load(0.1).quiet


def test_best_of_is_not_comparable_when_a_loaded_rival_may_have_lost_to_the_load() -> None:
    # The quiet 4-worker phase is the best only because the loaded 16-worker one was slowed.
    doc = document(
        [
            figure("sdk_thread_c16@w1", 4800.0, 0.0),
            figure("rest_batched_c4@w1", 5000.0, 0.0),
            figure("rest_batched_c16@w1", 4000.0, 0.4),
        ]
    )
    r = target(
        doc, "SDK Worker (threads), 16 slots >= 0.9x the raw batched REST loop's best [--workers 1]"
    )
    assert r["status"] == "not comparable"
    assert r["not_comparable_short"] == ["rest_batched_c16@w1: other work 40% of the machine"]


def test_transactional_enqueue_rows_are_judged_against_the_bare_insert_of_the_same_run() -> None:
    doc = document(
        [
            figure("tx_insert_1", 4000.0, 0.0),
            figure("tx_enqueue_1", 1000.0, 0.0),
            figure("tx_insert_100", 100_000.0, 0.0),
            figure("tx_enqueue_100", 5000.0, 0.0),
        ]
    )
    one = target(doc, "enqueue in an application transaction, 1 per commit >= 0.2x a bare INSERT")
    assert (one["value"], one["status"]) == (0.25, report.MET)
    batch = target(
        doc, "enqueue in an application transaction, 100 per commit >= 0.08x a bare INSERT"
    )
    assert (batch["value"], batch["status"]) == (0.05, report.UNMET)
    assert batch["figures"] == ["tx_enqueue_100", "tx_insert_100"]
    markdown = report.markdown(doc)
    assert "enqueue in an application transaction, 100 per commit" in markdown


def test_held_snapshot_end_is_judged_against_its_baseline_on_both_targets() -> None:
    doc = document(
        [
            figure("held_snapshot_items_s_base", 2000.0, 0.0),
            figure("held_snapshot_items_s_end", 1900.0, 0.0),
            figure("held_snapshot_acquire_p99_ms_base", 10.0, 0.0, unit="ms"),
            figure("held_snapshot_acquire_p99_ms_end", 25.0, 0.0, unit="ms"),
        ]
    )
    items = target(
        doc, "held snapshot: SDK Worker items/s at the end of the hold >= 0.9x before it"
    )
    assert (items["value"], items["status"]) == (0.95, report.MET)
    p99 = target(doc, "held snapshot: acquire p99 at the end of the hold <= 2x before it")
    assert (p99["value"], p99["status"]) == (2.5, report.UNMET)
    assert p99["figures"] == [
        "held_snapshot_acquire_p99_ms_end",
        "held_snapshot_acquire_p99_ms_base",
    ]


def test_held_snapshot_targets_are_not_measured_without_the_phase() -> None:
    doc = document([])
    for name in (
        "held snapshot: SDK Worker items/s at the end of the hold >= 0.9x before it",
        "held snapshot: acquire p99 at the end of the hold <= 2x before it",
    ):
        assert target(doc, name)["status"] == report.NOT_MEASURED
