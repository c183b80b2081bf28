"""Medians, percentiles and the figures of a run."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


@dataclass
class Figure:
    """One measured quantity: a value per repetition, reported as the median."""

    key: str
    label: str
    unit: str
    runs: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def median(self) -> float:
        return statistics.median(self.runs) if self.runs else 0.0

    def as_json(self) -> dict[str, object]:
        return {
            "label": self.label,
            "unit": self.unit,
            "runs": [round(v, 3) for v in self.runs],
            "median": round(self.median, 3),
            "note": self.note,
        }


@dataclass
class CpuSplit:
    """CPU seconds of each party over the wall time of a family of phases."""

    wall: float = 0.0
    server: float = 0.0
    postgres: float = 0.0
    loadgen: float = 0.0

    def add(self, wall: float, server: float, postgres: float, loadgen: float) -> None:
        self.wall += wall
        self.server += server
        self.postgres += postgres
        self.loadgen += loadgen

    def as_json(self) -> dict[str, float]:
        def pct(v: float) -> float:
            return round(100 * v / self.wall, 1) if self.wall else 0.0

        return {
            "wall_s": round(self.wall, 2),
            "server_cpu_s": round(self.server, 2),
            "postgres_cpu_s": round(self.postgres, 2),
            "loadgen_cpu_s": round(self.loadgen, 2),
            "server_pct_of_core": pct(self.server),
            "postgres_pct_of_core": pct(self.postgres),
            "loadgen_pct_of_core": pct(self.loadgen),
        }
