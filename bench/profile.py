"""py-spy against the server while a load phase runs, and a summary of where time went."""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from bench.env import venv_bin

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")

# The package a frame belongs to, by a piece of its file path; the first match wins.
_AREAS = (
    ("queue_server/", "queue_server"),
    ("psycopg_pool/", "psycopg_pool"),
    ("psycopg/", "psycopg"),
    ("fastapi/", "fastapi"),
    ("starlette/", "starlette"),
    ("pydantic/", "pydantic"),
    ("pydantic_core/", "pydantic"),
    ("uvicorn/", "uvicorn"),
    ("httptools", "uvicorn"),
    ("prometheus_client/", "prometheus_client"),
    ("orjson", "orjson"),
    ("json/", "json (stdlib)"),
    ("asyncio/", "asyncio"),
    ("uvloop", "asyncio"),
    ("anyio/", "anyio"),
)


def _area(file: str) -> str:
    for needle, name in _AREAS:
        if needle in file:
            return name
    return "other"


def _parse(frame: str) -> tuple[str, str]:
    match = _FRAME.match(frame.strip())
    if match is None:
        return frame.strip(), ""
    file = match["file"]
    short = re.sub(r"^.*/(site-packages|lib/python3\.\d+)/", "", file)
    short = re.sub(r"^.*/main/", "", short)
    return match["func"], short


@dataclass
class ProfileSummary:
    samples: int = 0
    top_self: list[tuple[str, float]] = field(default_factory=list)
    top_inclusive: list[tuple[str, float]] = field(default_factory=list)
    by_area_self: list[tuple[str, float]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, object]:
        return {
            "samples": self.samples,
            "top_self_pct": [[name, round(p, 1)] for name, p in self.top_self],
            "top_inclusive_queue_server_pct": [
                [name, round(p, 1)] for name, p in self.top_inclusive
            ],
            "self_by_package_pct": [[name, round(p, 1)] for name, p in self.by_area_self],
            "files": self.files,
        }


def summarise(collapsed: list[Path], top: int = 15) -> ProfileSummary:
    """Self time per function, inclusive time per function, self time per package."""
    self_counts: Counter[str] = Counter()
    incl_counts: Counter[str] = Counter()
    area_counts: Counter[str] = Counter()
    total = 0
    for path in collapsed:
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            stack, _, count_text = line.rpartition(" ")
            if not stack or not count_text.isdigit():
                continue
            count = int(count_text)
            frames = [_parse(f) for f in stack.split(";") if f.strip()]
            if not frames:
                continue
            total += count
            func, file = frames[-1]
            self_counts[f"{func} ({file})"] += count
            area_counts[_area(file)] += count
            # Inclusive time of the server's own code: which transition or step costs what.
            for name in {f"{f} ({p})" for f, p in frames if p.startswith("queue_server/")}:
                incl_counts[name] += count
    summary = ProfileSummary(samples=total, files=[str(p) for p in collapsed])
    if total:
        summary.top_self = [(n, 100 * c / total) for n, c in self_counts.most_common(top)]
        summary.top_inclusive = [(n, 100 * c / total) for n, c in incl_counts.most_common(top * 2)]
        summary.by_area_self = [(n, 100 * c / total) for n, c in area_counts.most_common()]
    return summary


def start(
    pids: list[int], out_dir: Path, name: str, seconds: int
) -> list[tuple[subprocess.Popen[bytes], Path]]:
    """One `py-spy record --format raw` per server process, for `seconds`."""
    started = []
    for pid in pids:
        out = out_dir / f"profile-{name}-{pid}.collapsed"
        proc = subprocess.Popen(
            [
                venv_bin("py-spy"),
                "record",
                "--pid",
                str(pid),
                "--duration",
                str(seconds),
                "--rate",
                "100",
                "--format",
                "raw",
                "--nonblocking",
                "-o",
                str(out),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        started.append((proc, out))
    return started


def finish(started: list[tuple[subprocess.Popen[bytes], Path]]) -> list[Path]:
    outputs = []
    for proc, out in started:
        try:
            _, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"py-spy failed: {err.decode(errors='replace')[-500:]}")
        outputs.append(out)
    return outputs
