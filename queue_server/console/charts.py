"""Charts drawn on the server as inline SVG (no script, no CDN): a sparkline's points, and
a queue's figures (rates, depth, oldest ready age, latency) with axes and a title."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from markupsafe import Markup

WIDTH = 120
HEIGHT = 28


def points(values: Sequence[int], top: int | None = None) -> str:
    """An SVG polyline's points for `values`, left to right across the chart, scaled so
    that `top` (default: their largest) touches the top; zero lies on the bottom edge."""
    if not values:
        return ""
    top = max(top if top is not None else max(values), 1)
    step = WIDTH / max(len(values) - 1, 1)
    return " ".join(
        f"{i * step:.1f},{HEIGHT - 1 - (HEIGHT - 2) * v / top:.1f}" for i, v in enumerate(values)
    )


def chart(completed: Sequence[int], failed: Sequence[int]) -> dict[str, object]:
    """What a queue's sparkline needs: both series' points on one scale, and the totals."""
    top = max([*completed, *failed, 1])
    return {
        "completed": points(completed, top),
        "failed": points(failed, top),
        "peak": top,
        "done_hour": sum(completed),
        "failed_hour": sum(failed),
    }


# -- a queue's charts: an SVG figure per measure, with axes, a title and its latest value --

FIG_WIDTH = 400
FIG_HEIGHT = 160
LEFT, RIGHT, TOP, BOTTOM = 50, 8, 38, 24


@dataclass(frozen=True, slots=True)
class Line:
    """One series of a figure: its CSS class (`done`, `failed`, `ready`, `age`, `latency`),
    what it counts, and a value per step, oldest first (None: no value in that step)."""

    css: str
    label: str
    values: Sequence[float | None]


def nice_top(peak: float, least: float = 1) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above `peak` (at least `least`)."""
    if peak <= least:
        return least
    scale = 10.0 ** math.floor(math.log10(peak))
    return next(step * scale for step in (1, 2, 5, 10) if peak <= step * scale)


def seconds_text(value: float | None) -> str:
    """A duration on an axis or in a sentence: `0.25 s`, `42 s`, `3m 5s`, `2h 10m`."""
    if value is None:
        return "—"
    if value < 10:
        return f"{value:.2f}".rstrip("0").rstrip(".") + " s"
    if value < 60:
        return f"{value:.0f} s"
    whole = int(value)
    if whole < 3600:
        return f"{whole // 60}m {whole % 60}s"
    return f"{whole // 3600}h {whole % 3600 // 60}m"


def count_text(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"


def _path(values: Sequence[float | None], top: float) -> str:
    """An SVG path across the plot, a point per value, broken where a value is None."""
    width = FIG_WIDTH - LEFT - RIGHT
    height = FIG_HEIGHT - TOP - BOTTOM
    step = width / max(len(values) - 1, 1)
    parts: list[str] = []
    pen_up = True
    for i, value in enumerate(values):
        if value is None:
            pen_up = True
            continue
        x = LEFT + i * step
        y = TOP + height - height * min(value, top) / top
        parts.append(f"{'M' if pen_up else 'L'}{x:.1f},{y:.1f}")
        pen_up = False
    return " ".join(parts)


def figure(
    key: str,
    title: str,
    lines: Sequence[Line],
    *,
    span: str,
    summary: str,
    seconds: bool = False,
) -> Markup:
    """A chart as inline SVG: the lines on one scale from zero, the scale's top and zero on
    the left axis, the span's start, middle and end below, a legend, and a <title> (also
    its aria-label) that says what it shows and its latest value (`summary`)."""
    peak = max([v for line in lines for v in line.values if v is not None] or [0])
    # Counts start from a scale of 1; durations from 10 ms.
    top = nice_top(peak, 0.01 if seconds else 1)
    label = seconds_text if seconds else count_text
    bottom = FIG_HEIGHT - BOTTOM
    right = FIG_WIDTH - RIGHT
    middle = TOP + (bottom - TOP) / 2
    ago = {"1h": ("60 min ago", "30 min ago"), "24h": ("24 h ago", "12 h ago")}[span]
    described = f"{title}, the last {'hour' if span == '1h' else 'day'}: {summary}"
    parts = [
        Markup(
            '<svg class="figure" data-figure="{key}" data-top="{top}" viewBox="0 0 {w} {h}"'
            ' role="img" aria-label="{described}" xmlns="http://www.w3.org/2000/svg">'
            "<title>{described}</title>"
        ).format(key=key, top=f"{top:g}", w=FIG_WIDTH, h=FIG_HEIGHT, described=described),
        Markup('<text class="heading" x="{x}" y="15">{title}</text>').format(x=LEFT, title=title),
        Markup(
            '<line class="grid" x1="{l}" y1="{t}" x2="{r}" y2="{t}"/>'
            '<line class="grid" x1="{l}" y1="{m}" x2="{r}" y2="{m}"/>'
            '<line class="axis" x1="{l}" y1="{b}" x2="{r}" y2="{b}"/>'
            '<line class="axis" x1="{l}" y1="{t}" x2="{l}" y2="{b}"/>'
            '<text class="tick" x="{lx}" y="{ty}" text-anchor="end">{top}</text>'
            '<text class="tick" x="{lx}" y="{by}" text-anchor="end">0</text>'
            '<text class="tick" x="{l}" y="{xy}">{start}</text>'
            '<text class="tick" x="{c}" y="{xy}" text-anchor="middle">{half}</text>'
            '<text class="tick" x="{r}" y="{xy}" text-anchor="end">now</text>'
        ).format(
            l=LEFT,
            r=right,
            t=TOP,
            m=f"{middle:.1f}",
            b=bottom,
            lx=LEFT - 5,
            ty=TOP + 4,
            by=bottom,
            top=label(top),
            xy=FIG_HEIGHT - 6,
            c=f"{LEFT + (right - LEFT) / 2:.1f}",
            start=ago[0],
            half=ago[1],
        ),
    ]
    # A legend, under the title, where lines share a figure.
    x = LEFT
    for line in lines if len(lines) > 1 else ():
        parts.append(
            Markup('<text class="legend {css}" x="{x}" y="31">■ {label}</text>').format(
                css=line.css, x=x, label=line.label
            )
        )
        x += 32 + 8 * len(line.label)
    for line in lines:
        parts.append(
            Markup('<path class="line {css}" data-series="{css}" d="{d}"/>').format(
                css=line.css, d=_path(line.values, top)
            )
        )
    parts.append(Markup("</svg>"))
    return Markup("").join(parts)


# -- a workflow's graph: its items in layers, each after every item it depends on ---------

NODE_W, NODE_H, GAP_X, GAP_Y, PAD = 170, 30, 40, 12, 8  # a box holds "…12345678 quarantined"


def workflow_svg(nodes: Sequence[dict[str, object]], focus: str, href: str) -> Markup:
    """The graph as inline SVG: an item per box (the end of its id and its state, a link to
    its page: `href` with `{id}`), in columns by the length of the longest chain of
    dependencies before it, an arrow from each dependency; `focus` drawn bold."""
    ids = [str(n["item_id"]) for n in nodes]
    known = set(ids)
    deps = {
        str(n["item_id"]): [str(d) for d in n["depends_on"] if str(d) in known]  # type: ignore[attr-defined]
        for n in nodes
    }
    layer: dict[str, int] = {}

    def depth(item: str, seen: frozenset[str] = frozenset()) -> int:
        if item not in layer:
            before = [d for d in deps[item] if d not in seen]
            layer[item] = 1 + max((depth(d, seen | {item}) for d in before), default=-1)
        return layer[item]

    for item in ids:
        depth(item)
    columns: dict[int, list[str]] = {}
    for item in ids:
        columns.setdefault(layer[item], []).append(item)
    at: dict[str, tuple[int, int]] = {}
    for col, members in columns.items():
        for row, item in enumerate(members):
            at[item] = (PAD + col * (NODE_W + GAP_X), PAD + row * (NODE_H + GAP_Y))
    width = PAD * 2 + (max(columns, default=0) + 1) * (NODE_W + GAP_X) - GAP_X
    height = PAD * 2 + max((len(m) for m in columns.values()), default=1) * (NODE_H + GAP_Y) - GAP_Y
    state = {str(n["item_id"]): str(n["state"]) for n in nodes}
    parts = [
        f'<svg class="workflow" role="img" viewBox="0 0 {width} {height}" width="{width}"'
        f' height="{height}" aria-label="The workflow: {len(ids)} items">'
    ]
    for item in ids:
        x2, y2 = at[item]
        for dep in deps[item]:
            x1, y1 = at[dep]
            parts.append(
                f'<line class="edge" x1="{x1 + NODE_W}" y1="{y1 + NODE_H // 2}"'
                f' x2="{x2}" y2="{y2 + NODE_H // 2}"/>'
            )
    for item in ids:
        x, y = at[item]
        bold = " focus" if item == focus else ""
        link = Markup.escape(href.replace("{id}", item))
        parts.append(
            f'<a href="{link}" data-item="{item}" data-state="{state[item]}">'
            f'<rect class="node s-{state[item]}{bold}" x="{x}" y="{y}" width="{NODE_W}"'
            f' height="{NODE_H}" rx="6"/>'
            f'<text x="{x + 8}" y="{y + 19}">…{item[-8:]} {state[item]}</text></a>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))
