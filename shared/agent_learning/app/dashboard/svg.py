"""Charts as inline SVG, generated here: no script, no network, every label escaped.

A chart is a plot area with a y range, drawn from series of (x, y) points. Long series are
thinned to :data:`MAX_POINTS` (each kept point the mean of its stretch), so a chart of 1,000
versions is as light as one of 300.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

WIDTH, HEIGHT = 640, 220
"""A chart's size in pixels (it scales with the page: ``viewBox``)."""
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 44, 12, 10, 24
MAX_POINTS = 300
"""Most points a line keeps; longer series are averaged down to it."""
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf")

Point = tuple[float, float]


def thin(points: Sequence[Point], most: int = MAX_POINTS) -> list[Point]:
    """``points`` with at most ``most`` left: consecutive stretches averaged (x and y alike)."""
    if len(points) <= most:
        return list(points)
    size = math.ceil(len(points) / most)
    out = []
    for i in range(0, len(points), size):
        chunk = points[i : i + size]
        out.append((sum(p[0] for p in chunk) / len(chunk), sum(p[1] for p in chunk) / len(chunk)))
    return out


@dataclass
class Chart:
    """One chart being drawn: x from ``x_low`` to ``x_high``, y from ``y_low`` to ``y_high``."""

    title: str
    x_low: float
    x_high: float
    y_low: float
    y_high: float
    parts: list[str] = field(default_factory=list)
    legend: list[tuple[str, str, str]] = field(default_factory=list)
    """(colour, label, CSS class of the swatch)."""

    def __post_init__(self) -> None:
        if self.x_high <= self.x_low:
            self.x_low, self.x_high = self.x_low - 1, self.x_low + 1
        if self.y_high <= self.y_low:
            self.y_low, self.y_high = self.y_low - 0.5, self.y_low + 0.5

    def x(self, value: float) -> float:
        span = WIDTH - MARGIN_LEFT - MARGIN_RIGHT
        return round(MARGIN_LEFT + (value - self.x_low) / (self.x_high - self.x_low) * span, 1)

    def y(self, value: float) -> float:
        span = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM
        clipped = min(max(value, self.y_low), self.y_high)
        return round(HEIGHT - MARGIN_BOTTOM - (clipped - self.y_low) / (self.y_high - self.y_low) * span, 1)

    def line(self, points: Sequence[Point], colour: str, label: str, css: str = "series") -> None:
        """A line through ``points`` (thinned); a lone point is drawn as a dot."""
        kept = thin(points)
        if not kept:
            return
        if len(kept) == 1:
            self.dot(kept[0], colour, css)
        else:
            path = " ".join(f"{self.x(px)},{self.y(py)}" for px, py in kept)
            self.parts.append(f'<polyline class="{css}" fill="none" stroke="{colour}" stroke-width="1.6" '
                              f'points="{path}"/>')
        self.legend.append((colour, label, css))

    def band(self, lows: Sequence[Point], highs: Sequence[Point], colour: str, css: str = "band") -> None:
        """A shaded band between two lines of the same xs (an interval)."""
        low, high = thin(lows), thin(highs)
        if len(low) < 2:
            for (px, lo), (_, hi) in zip(low, high, strict=True):
                self.parts.append(f'<line class="{css}" x1="{self.x(px)}" x2="{self.x(px)}" y1="{self.y(lo)}" '
                                  f'y2="{self.y(hi)}" stroke="{colour}" stroke-width="3" opacity="0.4"/>')
            return
        outline = [*low, *reversed(high)]
        path = " ".join(f"{self.x(px)},{self.y(py)}" for px, py in outline)
        self.parts.append(f'<polygon class="{css}" fill="{colour}" opacity="0.18" points="{path}"/>')

    def dot(self, point: Point, colour: str, css: str = "dot", title: str = "", radius: float = 3) -> None:
        tip = f"<title>{html.escape(title)}</title>" if title else ""
        self.parts.append(f'<circle class="{css}" cx="{self.x(point[0])}" cy="{self.y(point[1])}" r="{radius}" '
                          f'fill="{colour}">{tip}</circle>')

    def interval(self, x: float, low: float, high: float, colour: str, css: str, title: str = "") -> None:
        """A vertical bar from ``low`` to ``high`` at ``x``."""
        tip = f"<title>{html.escape(title)}</title>" if title else ""
        self.parts.append(f'<line class="{css}" x1="{self.x(x)}" x2="{self.x(x)}" y1="{self.y(low)}" '
                          f'y2="{self.y(high)}" stroke="{colour}" stroke-width="1.2">{tip}</line>')

    def mark(self, x: float, colour: str, label: str, css: str) -> None:
        """A dashed vertical line across the chart at ``x`` (a rollback, a pin)."""
        self.parts.append(f'<line class="{css}" x1="{self.x(x)}" x2="{self.x(x)}" y1="{MARGIN_TOP}" '
                          f'y2="{HEIGHT - MARGIN_BOTTOM}" stroke="{colour}" stroke-dasharray="4 3">'
                          f"<title>{html.escape(label)}</title></line>")
        if not any(entry[1] == label.split(" ")[0] for entry in self.legend):
            self.legend.append((colour, label.split(" ")[0], css))

    def svg(self, x_label: str = "version") -> str:
        """The chart as an ``<svg>`` element with its axes, and its legend below it."""
        bottom, left = HEIGHT - MARGIN_BOTTOM, MARGIN_LEFT
        axes = [
            f'<line x1="{left}" y1="{MARGIN_TOP}" x2="{left}" y2="{bottom}" stroke="#888"/>',
            f'<line x1="{left}" y1="{bottom}" x2="{WIDTH - MARGIN_RIGHT}" y2="{bottom}" stroke="#888"/>',
        ]
        for value in (self.y_low, (self.y_low + self.y_high) / 2, self.y_high):
            axes.append(f'<text x="{left - 4}" y="{self.y(value) + 4}" text-anchor="end">{value:.2f}</text>')
        for value in (self.x_low, self.x_high):
            axes.append(f'<text x="{self.x(value)}" y="{HEIGHT - 6}" text-anchor="middle">{value:g}</text>')
        axes.append(f'<text x="{(WIDTH + left) / 2}" y="{HEIGHT - 6}" text-anchor="middle">{html.escape(x_label)}'
                    "</text>")
        legend = "".join(
            f'<span class="key {html.escape(css)}"><i style="background:{colour}"></i>{html.escape(label)}</span>'
            for colour, label, css in self.legend
        )
        return (f'<figure class="chart"><figcaption>{html.escape(self.title)}</figcaption>'
                f'<svg role="img" aria-label="{html.escape(self.title)}" viewBox="0 0 {WIDTH} {HEIGHT}" '
                f'width="{WIDTH}" height="{HEIGHT}">{"".join(axes)}{"".join(self.parts)}</svg>'
                f'<div class="legend">{legend}</div></figure>')
