"""Read a queue's figure back from its SVG: each series' value per step, from the drawn path."""

from __future__ import annotations

import re

from queue_server.console.charts import BOTTOM, FIG_HEIGHT, FIG_WIDTH, LEFT, RIGHT, TOP

FIGURE = re.compile(r'<svg class="figure" data-figure="(?P<key>[a-z]+)".*?</svg>', re.S)
TOP_VALUE = re.compile(r'data-top="([0-9.e+]+)"')
PATH = re.compile(r'<path class="line [a-z]+" data-series="([a-z]+)" d="([^"]*)"/>')
LABEL = re.compile(r'aria-label="([^"]*)"')


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
            values[round((x - LEFT) / step)] = round((TOP + height - y) * top / height, 2)
        drawn[name] = values
    return drawn
