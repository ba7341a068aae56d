"""Charts drawn on the server as SVG: no script, no CDN, readable offline and in a screenshot.

Every text that comes from a user (batch names) is escaped here; numbers are formatted here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from rollouts.game.crafter_env import ACHIEVEMENTS

# Okabe-Ito: told apart by people with the common colour-vision deficiencies.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000")
_LABEL_W = 150
_PLOT_W = 540
_RIGHT = 20
_WIDTH = _LABEL_W + _PLOT_W + _RIGHT


@dataclass(frozen=True)
class Series:
    label: str
    rates: Mapping[str, float]  # percent
    intervals: Mapping[str, tuple[float, float]]  # percent


def _x(percent: float, top: float = 100.0) -> float:
    return _LABEL_W + _PLOT_W * max(0.0, min(percent, top)) / top


def _legend(labels: Sequence[str], y: float) -> list[str]:
    parts, x = [], float(_LABEL_W)
    for i, label in enumerate(labels):
        text = escape(label[:40])
        parts.append(
            f'<rect x="{x:.1f}" y="{y - 9:.1f}" width="10" height="10" '
            f'fill="{PALETTE[i % len(PALETTE)]}"/>'
            f'<text x="{x + 14:.1f}" y="{y:.1f}" class="legend">{text}</text>'
        )
        x += 24 + 7 * min(len(label), 40)
    return parts


def rates_chart(series: Sequence[Series], *, title: str) -> SafeString:
    """Success rate per achievement, one bar per series, grouped; whiskers: 95% interval."""
    k = max(len(series), 1)
    bar = 8 if k <= 3 else 5
    group = k * bar + 8
    top = 40
    height = top + group * len(ACHIEVEMENTS) + 10
    out = [
        f'<svg class="chart" viewBox="0 0 {_WIDTH} {height}" role="img" '
        f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title>",
        *_legend([s.label for s in series], 14),
    ]
    for tick in (0, 25, 50, 75, 100):
        x = _x(tick)
        out.append(
            f'<line x1="{x:.1f}" y1="{top - 6}" x2="{x:.1f}" y2="{height - 10}" class="grid"/>'
            f'<text x="{x:.1f}" y="{top - 9}" class="tick" text-anchor="middle">{tick}%</text>'
        )
    for row, name in enumerate(ACHIEVEMENTS):
        y0 = top + row * group
        out.append(
            f'<text x="{_LABEL_W - 6}" y="{y0 + group / 2 + 3:.1f}" class="label" '
            f'text-anchor="end">{name}</text>'
        )
        for i, s in enumerate(series):
            rate = s.rates.get(name, 0.0)
            low, high = s.intervals.get(name, (rate, rate))
            y = y0 + 4 + i * bar
            mid = y + bar / 2
            colour = PALETTE[i % len(PALETTE)]
            tip = escape(f"{name} · {s.label}: {rate:.1f}% (95% interval {low:.1f} to {high:.1f}%)")
            out.append(
                f"<g><title>{tip}</title>"
                f'<rect x="{_LABEL_W}" y="{y:.1f}" width="{_x(rate) - _LABEL_W:.1f}" '
                f'height="{bar - 1}" fill="{colour}"/>'
                f'<line x1="{_x(low):.1f}" y1="{mid:.1f}" x2="{_x(high):.1f}" y2="{mid:.1f}" '
                f'class="whisker"/>'
                f'<line x1="{_x(low):.1f}" y1="{mid - 2:.1f}" x2="{_x(low):.1f}" '
                f'y2="{mid + 2:.1f}" class="whisker"/>'
                f'<line x1="{_x(high):.1f}" y1="{mid - 2:.1f}" x2="{_x(high):.1f}" '
                f'y2="{mid + 2:.1f}" class="whisker"/></g>'
            )
    out.append("</svg>")
    return mark_safe("".join(out))  # every interpolated text is escaped above


def score_chart(
    points: Sequence[tuple[str, float, tuple[float, float]]], *, title: str
) -> SafeString:
    """One dot per row with its 95% interval, on a common 0-based percent axis."""
    row_h = 22
    top = 24
    height = top + row_h * max(len(points), 1) + 6
    peak = max([hi for _, _, (_, hi) in points] + [value for _, value, _ in points] + [1.0])
    scale = _nice(peak)
    out = [
        f'<svg class="chart" viewBox="0 0 {_WIDTH} {height}" role="img" '
        f'aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title>",
    ]
    for i in range(5):
        tick = scale * i / 4
        x = _x(tick, scale)
        out.append(
            f'<line x1="{x:.1f}" y1="{top - 6}" x2="{x:.1f}" y2="{height - 4}" class="grid"/>'
            f'<text x="{x:.1f}" y="{top - 9}" class="tick" text-anchor="middle">'
            f"{tick:.3g}%</text>"
        )
    for i, (label, value, (low, high)) in enumerate(points):
        y = top + i * row_h + row_h / 2
        colour = PALETTE[i % len(PALETTE)]
        tip = escape(f"{label}: {value:.2f}% (95% interval {low:.2f} to {high:.2f}%)")
        out.append(
            f"<g><title>{tip}</title>"
            f'<text x="{_LABEL_W - 6}" y="{y + 4:.1f}" class="label" text-anchor="end">'
            f"{escape(label[:24])}</text>"
            f'<line x1="{_x(low, scale):.1f}" y1="{y:.1f}" x2="{_x(high, scale):.1f}" '
            f'y2="{y:.1f}" class="whisker"/>'
            f'<circle cx="{_x(value, scale):.1f}" cy="{y:.1f}" r="5" fill="{colour}"/></g>'
        )
    out.append("</svg>")
    return mark_safe("".join(out))  # every interpolated text is escaped above


def _nice(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k at or above `value`: round axis ends."""
    magnitude = 10 ** len(str(int(max(value, 1)))) / 10
    for step in (1, 2, 2.5, 5, 10):
        if step * magnitude >= value:
            return step * magnitude
    return 10 * magnitude
