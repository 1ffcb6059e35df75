"""Small line charts drawn on the server as SVG: no script, so they render under the strict CSP and without JS.

`line_chart()` takes plot-ready series (`telemetry.series` points, None where the data has a gap) and returns
the geometry a template draws: one path per line (broken at gaps), axis ticks and labels. Colours are the
Okabe-Ito palette the Plotly drill-downs use, so a GPU keeps its colour between pages.
"""

from __future__ import annotations

import math
from datetime import datetime

PALETTE = ("#0072b2", "#e69f00", "#009e73", "#cc79a7", "#56b4e9", "#d55e00", "#f0e442", "#000000")
WIDTH, HEIGHT = 640, 180
LEFT, RIGHT, TOP, BOTTOM = 48, 8, 8, 24


def _nice_max(value: float) -> float:
    """The smallest 1, 2 or 5 × 10^n at or above `value`, so the top tick reads round."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= value)


def _path(points: list[tuple[float, float | None]]) -> str:
    parts, pen_down = [], False
    for x, y in points:
        if y is None:
            pen_down = False
            continue
        parts.append(f"{'L' if pen_down else 'M'}{x:.1f},{y:.1f}")
        pen_down = True
    return " ".join(parts)


def line_chart(lines: list[dict], start: datetime, end: datetime, *, marks: list[datetime] = ()) -> dict:
    """Geometry of one chart: `lines` are {label, points: [(time, value | None)]}; `marks` are vertical lines
    at moments worth seeing against the data (the fault, the action)."""
    span = max((end - start).total_seconds(), 1.0)
    values = [v for line in lines for _, v in line["points"] if v is not None]
    top = _nice_max(max(values, default=0.0))
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x_of(t: datetime) -> float:
        return LEFT + plot_w * min(max((t - start).total_seconds() / span, 0.0), 1.0)

    def y_of(v: float) -> float:
        return TOP + plot_h * (1 - min(max(v / top, 0.0), 1.0))

    paths = [{"label": line["label"], "colour": PALETTE[i % len(PALETTE)],
              "d": _path([(x_of(t), None if v is None else y_of(v)) for t, v in line["points"]])}
             for i, line in enumerate(lines)]
    x_ticks = [{"x": round(x_of(t), 1), "text": t.strftime("%H:%M")}
               for t in (start + (end - start) * k / 4 for k in range(5))]
    y_ticks = [{"y": round(y_of(top * k / 2), 1), "text": f"{top * k / 2:g}"} for k in range(3)]
    return {"width": WIDTH, "height": HEIGHT, "left": LEFT, "right": WIDTH - RIGHT, "top": TOP,
            "bottom": HEIGHT - BOTTOM, "paths": paths, "x_ticks": x_ticks, "y_ticks": y_ticks,
            "marks": [round(x_of(m), 1) for m in marks if start <= m <= end]}
