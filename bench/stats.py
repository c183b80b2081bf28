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


# A phase is quiet when processes other than the benchmark's own parties (the server,
# PostgreSQL, the benchmark and its children) used at most this share of the machine.
QUIET_SHARE = 0.10


@dataclass(frozen=True)
class PhaseLoad:
    """What ran on the machine during one phase: CPU seconds of each party and of the rest.

    `busy` is the machine's CPU time over the phase, every state but idle and iowait
    (summed over cores); `other` is what remains of it once the server's process
    tree, PostgreSQL's and the benchmark's own processes are taken out.
    """

    wall: float
    cores: int
    busy: float
    server: float
    postgres: float
    bench: float
    steal: float = 0.0
    load_start: float = 0.0
    load_end: float = 0.0
    top_other: tuple[tuple[str, float], ...] = ()

    @property
    def other(self) -> float:
        # Per-process and per-machine counters tick separately: a quiet phase can
        # come out a few hundredths of a second below zero.
        return max(0.0, self.busy - self.server - self.postgres - self.bench)

    @property
    def share(self) -> float:
        """Other work as a share of the machine (cores x wall) over the phase."""
        capacity = self.cores * self.wall
        return self.other / capacity if capacity > 0 else 0.0

    @property
    def quiet(self) -> bool:
        return self.share <= QUIET_SHARE

    def describe(self) -> str:
        """`other work 23.4% of the machine (load 1.2 -> 3.4; busiest: pytest 1.9 s)`."""
        text = (
            f"other work {100 * self.share:.1f}% of the machine"
            f" (load {self.load_start:.2f} -> {self.load_end:.2f}"
        )
        if self.steal >= 0.05:
            # The hypervisor ran someone else on our cores: no process here shows it.
            text += f"; stolen by the host: {self.steal:.1f} s"
        if self.top_other:
            text += "; busiest: " + ", ".join(f"{n} {s:.1f} s" for n, s in self.top_other[:3])
        return text + ")"

    def as_json(self) -> dict[str, object]:
        return {
            "wall_s": round(self.wall, 3),
            "cores": self.cores,
            "machine_busy_cpu_s": round(self.busy, 3),
            "server_cpu_s": round(self.server, 3),
            "postgres_cpu_s": round(self.postgres, 3),
            "bench_cpu_s": round(self.bench, 3),
            "other_cpu_s": round(self.other, 3),
            "other_share_pct": round(100 * self.share, 1),
            "steal_cpu_s": round(self.steal, 3),
            "load_average_start": round(self.load_start, 2),
            "load_average_end": round(self.load_end, 2),
            "busiest_other": [[n, round(s, 2)] for n, s in self.top_other],
            "quiet": self.quiet,
        }


@dataclass
class Figure:
    """One measured quantity: a value per repetition, reported as the median.

    `loads` holds, per repetition, what else ran on the machine during its phase
    (None when the phase was not probed: such a figure is never called quiet).
    """

    key: str
    label: str
    unit: str
    runs: list[float] = field(default_factory=list)
    note: str = ""
    loads: list[PhaseLoad | None] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.runs) if self.runs else 0.0

    @property
    def quiet(self) -> bool:
        """Every repetition ran with other work at most QUIET_SHARE of the machine."""
        return len(self.loads) == len(self.runs) and all(
            load is not None and load.quiet for load in self.loads
        )

    def why_not_quiet(self, *, short: bool = False) -> str:
        """The repetition that made this figure not comparable, in words ('' when quiet);
        `short`: only the share, without the load average and the busiest processes."""
        if self.quiet:
            return ""
        if len(self.loads) != len(self.runs) or any(load is None for load in self.loads):
            return f"{self.label}: no record of other work during its phase"
        worst = max((load for load in self.loads if load is not None), key=lambda x: x.share)
        if short:
            return f"{self.label}: other work {100 * worst.share:.0f}% of the machine"
        return f"{self.label}: {worst.describe()}"

    def as_json(self) -> dict[str, object]:
        return {
            "label": self.label,
            "unit": self.unit,
            "runs": [round(v, 3) for v in self.runs],
            "median": round(self.median, 3),
            "note": self.note,
            "other_share_pct": [
                None if load is None else round(100 * load.share, 1) for load in self.loads
            ],
            "quiet": self.quiet,
        }


@dataclass
class CpuSplit:
    """CPU seconds of each party over the wall time of a family of phases, and the
    other work on the machine during each of them."""

    wall: float = 0.0
    server: float = 0.0
    postgres: float = 0.0
    loadgen: float = 0.0
    phases: list[PhaseLoad] = field(default_factory=list)

    def add(self, load: PhaseLoad, loadgen: float) -> None:
        self.wall += load.wall
        self.server += load.server
        self.postgres += load.postgres
        self.loadgen += loadgen
        self.phases.append(load)

    @property
    def quiet(self) -> bool:
        return all(p.quiet for p in self.phases)

    def as_json(self) -> dict[str, object]:
        def pct(v: float) -> float:
            return round(100 * v / self.wall, 1) if self.wall else 0.0

        other = sum(p.other for p in self.phases)
        return {
            "wall_s": round(self.wall, 2),
            "server_cpu_s": round(self.server, 2),
            "postgres_cpu_s": round(self.postgres, 2),
            "loadgen_cpu_s": round(self.loadgen, 2),
            "other_cpu_s": round(other, 2),
            "server_pct_of_core": pct(self.server),
            "postgres_pct_of_core": pct(self.postgres),
            "loadgen_pct_of_core": pct(self.loadgen),
            "other_share_pct": [round(100 * p.share, 1) for p in self.phases],
            "load_average": [[round(p.load_start, 2), round(p.load_end, 2)] for p in self.phases],
            "quiet": self.quiet,
            "phases": [p.as_json() for p in self.phases],
        }
