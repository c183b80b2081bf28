"""Charts drawn on the server as inline SVG (no script, no CDN): a sparkline's points."""

from __future__ import annotations

from collections.abc import Sequence

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
