"""Read a queue's figure back from its SVG: each series' value per step, from the drawn path."""

from __future__ import annotations

import math
import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from queue_server.console.charts import BOTTOM, FIG_HEIGHT, FIG_WIDTH, LEFT, RIGHT, TOP

FIGURE = re.compile(r'<svg class="figure" data-figure="(?P<key>[a-z]+)".*?</svg>', re.S)
TOP_VALUE = re.compile(r'data-top="([0-9.e+]+)"')
PATH = re.compile(r'<path class="line [a-z]+" data-series="([a-z]+)" d="([^"]*)"')
LABEL = re.compile(r'aria-label="([^"]*)"')
# The figures' grid: quarter hours from 2000-01-01 UTC, as the database bins them.
QUARTER = timedelta(minutes=15)
GRID = datetime(2000, 1, 1, tzinfo=UTC)


def quarter_of(t: datetime) -> datetime:
    """The start of the quarter hour `t` falls in."""
    return GRID + (t - GRID) // QUARTER * QUARTER


def clock_clear_of_the_grid(db: Any, *, lag: timedelta = timedelta(0)) -> datetime:
    """The database's clock, read at least 20 s before the next quarter hour (plus `lag`):
    what a test builds from this reading is still what the server sees in the next
    seconds, when its figures or its roll-up are read."""
    while True:
        clock = db.execute("SELECT statement_timestamp() AS t").fetchone()
        assert clock is not None
        now: datetime = clock["t"]
        edge = quarter_of(now - lag) + QUARTER + lag
        if edge - now > timedelta(seconds=20):
            return now
        time.sleep((edge - now).total_seconds() + 0.1)


def figures(html: str) -> dict[str, str]:
    """Each figure's SVG in `html`, by its data-figure key."""
    return {m.group("key"): m.group(0) for m in FIGURE.finditer(html)}


def label(svg: str) -> str:
    found = LABEL.search(svg)
    assert found, "the figure has no aria-label"
    return found.group(1)


def series(svg: str, steps: int) -> dict[str, list[float | None]]:
    """Each series of the figure as `steps` values (None where the line is broken),
    read from the path's points and the figure's scale."""
    found = TOP_VALUE.search(svg)
    assert found, "the figure names no scale"
    top = float(found.group(1))
    height = FIG_HEIGHT - TOP - BOTTOM
    step = (FIG_WIDTH - LEFT - RIGHT) / (steps - 1)
    drawn: dict[str, list[float | None]] = {}
    for name, d in PATH.findall(svg):
        values: list[float | None] = [None] * steps
        for point in d.split():
            x, y = (float(v) for v in point[1:].split(","))
            values[round((x - LEFT) / step)] = round((TOP + height - y) * top / height, 4)
        drawn[name] = values
    return drawn


def seed_history(db: Any, tenant: str, queue: str) -> None:
    """A day of a busy queue's samples, written as the sweeper would have taken them (a
    minute apart for the last hour, each quarter hour's last before), with the counters
    they end at on a shard of their own: what the screenshots of a queue's charts show."""
    now = clock_clear_of_the_grid(db)
    grid = quarter_of(now)
    day = [grid - QUARTER * q - timedelta(seconds=5) for q in range(97, 0, -1)]
    hour = [now - timedelta(minutes=m) for m in range(64, 0, -1)]
    marks = [t for t in day if t < hour[0]] + hour
    rows = []
    done = failed = spent = 0
    minute = marks[0] - timedelta(hours=1)
    for at in marks:
        while minute < at:  # a minute's work at a time, up to the sample
            ago = (now - minute).total_seconds() / 60
            rate = max(0, round(24 + 10 * math.sin(ago / 130) + 8 * math.sin(ago / 9)))
            done += rate
            failed += 2 if round(ago) % 23 == 0 else 0
            spent += round(rate * (420 + 200 * math.cos(ago / 90) + 120 * math.sin(ago / 13)))
            minute += timedelta(minutes=1)
        ago = (now - at).total_seconds() / 60
        ready = max(0, round(35 + 25 * math.sin(ago / 180 - math.pi / 2) + 8 * math.sin(ago / 7)))
        wait = timedelta(
            seconds=20 + 90 * max(0.0, math.sin(ago / 100)) + 40 * abs(math.sin(ago / 11))
        )
        rows.append((tenant, queue, at, done, failed, done, spent, ready, at - wait))
    columns = (
        "tenant_id, queue, sampled_at, completed, failed, timed_completions, completion_ms,"
        " ready, oldest_ready_at"
    )
    recent = now - timedelta(minutes=65)
    for table, kept in (("queue_day_samples", day), ("queue_samples", hour)):
        with db.cursor() as cur:
            cur.executemany(
                f"INSERT INTO {table} ({columns}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
                [
                    r
                    for r in rows
                    if r[2] in kept and (table == "queue_day_samples" or r[2] >= recent)
                ],
            )
    db.execute(
        "INSERT INTO counter_deltas (tenant_id, queue, completed, failed,"
        " timed_completions, completion_ms) VALUES (%s, %s, %s, %s, %s, %s)",
        (tenant, queue, done, failed, done, spent),
    )
