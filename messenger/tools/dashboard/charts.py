"""Server-rendered SVG charts of a channel's history (`messenger.operations.history`): no
script, no chart library, nothing from a CDN; the page's Content-Security-Policy allows them as
they are (no inline styles: presentation attributes and the dashboard's stylesheet).

Each chart is one series over its window: a bar per bucket CloudWatch has a datapoint for (a
missing bucket is a gap, not zero), the peak and the window's bounds labelled in UTC; each bar's
`<title>` says its time and value (shown on hover).
"""

from __future__ import annotations

import time
from html import escape

from markupsafe import Markup

from messenger.operations.history import ChannelHistory, Series
from messenger.tools.format import duration_text

WIDTH, HEIGHT = 560, 140
LEFT, RIGHT, TOP, BOTTOM = 48, 8, 18, 22


def _stamp(at: float, period: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M" if period >= 900 else "%H:%M", time.gmtime(at))


def _value(series: Series, value: float) -> str:
    if series.spec.unit == "seconds":
        return duration_text(value)
    return f"{value:g}"


def chart(history: ChannelHistory, series: Series) -> Markup:
    """One series as an <svg> element (data-metric, data-total and data-points for tests)."""
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    span = max(1.0, history.end - history.start)
    peak = series.peak or 0.0
    scale = plot_h / peak if peak > 0 else 0.0
    bar_w = max(1.0, plot_w * history.period / span - 1)
    title = f"{series.spec.title} ({series.spec.unit})"
    total = "" if series.total is None else f"{series.total:g}"
    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
        f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(title)}" data-metric="{series.spec.key}" '
        f'data-total="{total}" data-points="{len(series.points)}">',
        f'<text x="{LEFT}" y="12" class="chart-title">{escape(title)}</text>',
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{LEFT + plot_w}" y2="{TOP + plot_h}" '
        f'stroke="#99a" />',
        f'<text x="{LEFT - 4}" y="{TOP + 8}" text-anchor="end" class="chart-axis">'
        f'{escape(_value(series, peak)) if peak else "0"}</text>',
        f'<text x="{LEFT - 4}" y="{TOP + plot_h}" text-anchor="end" class="chart-axis">0</text>',
        f'<text x="{LEFT}" y="{HEIGHT - 6}" class="chart-axis">'
        f'{_stamp(history.start, history.period)} UTC</text>',
        f'<text x="{LEFT + plot_w}" y="{HEIGHT - 6}" text-anchor="end" class="chart-axis">'
        f'{_stamp(history.end, history.period)} UTC</text>',
    ]
    if not series.points:
        parts.append(f'<text x="{LEFT + plot_w / 2}" y="{TOP + plot_h / 2}" '
                     f'text-anchor="middle" class="chart-empty">no datapoints in this window'
                     f'</text>')
    for at, value in series.points:
        x = LEFT + plot_w * (at - history.start) / span
        h = max(1.0 if value else 0.0, value * scale)
        parts.append(
            f'<rect x="{x:.1f}" y="{TOP + plot_h - h:.1f}" width="{bar_w:.1f}" '
            f'height="{h:.1f}" fill="#3b6fd8"><title>{_stamp(at, 60)} UTC: '
            f'{escape(_value(series, value))}</title></rect>')
    parts.append("</svg>")
    return Markup("".join(parts))
