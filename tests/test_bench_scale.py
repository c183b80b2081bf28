"""`make bench-scale`'s report: the scale curve's rows, each against the first of its kind."""

from __future__ import annotations

from typing import Any

from bench import scale


def _doc(curve: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "run_at": "2026-12-05 06:00:00 UTC",
        "machine": {"host": "vm", "cpus": 2, "python": "3.11"},
        "load_average_before_and_after": [[0.5, 0.5, 0.5], [1.0, 1.0, 1.0]],
        "workers": 16,
        "batch": 50,
        "seconds_per_run": 3.0,
        "repetitions": 3,
        "curve": curve,
        "figures": {},
    }


def _row(rate: float, cpu_ms: float) -> dict[str, Any]:
    return {"items_per_s": rate, "runs": [rate], "cpu_ms_per_item": cpu_ms, "errors": 0}


def test_the_curve_shows_items_and_cpu_per_item_against_the_first_of_each_kind() -> None:
    text = scale.markdown(
        _doc(
            {
                "serve --workers 1": _row(5000.0, 0.4),
                "serve --workers 8": _row(7500.0, 0.5),
                "SDK Worker x1 process": _row(6000.0, 0.3),
                "SDK Worker x4 processes": _row(3000.0, 0.6),
            }
        )
    )
    assert "## The scale curve" in text
    assert "| serve --workers 1 | 5,000 | 1.00x | 0.40 ms | 0 |" in text
    assert "| serve --workers 8 | 7,500 | 1.50x | 0.50 ms | 0 |" in text
    # The SDK rows are read against one SDK process, not against the server's first row.
    assert "| SDK Worker x1 process | 6,000 | 1.00x | 0.30 ms | 0 |" in text
    assert "| SDK Worker x4 processes | 3,000 | 0.50x | 0.60 ms | 0 |" in text
