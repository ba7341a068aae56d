"""Charts drawn on the server as SVG: no script, no CDN, readable offline and in a screenshot.

Every text that comes from a user (batch names) is escaped here; numbers are formatted here.
Each chart is drawn in two layouts (`for_every_screen`): labels beside the bars for a wide
screen, above them for a phone, where a wide chart scaled down to fit would shrink its text
to a few pixels. The stylesheet shows the one that fits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from rollouts.game.crafter_env import ACHIEVEMENTS

# Okabe-Ito: told apart by people with the common colour-vision deficiencies.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000")


@dataclass(frozen=True)
class Layout:
    """Where a chart's parts go, in the units of its viewBox (about pixels where it is shown)."""

    name: str  # the svg's class, which the stylesheet shows or hides by screen width
    width: int
    plot_left: int
    plot_width: int
    labels_above: bool  # a row's label on a line of its own above its bars, not beside them
    legend_row: int  # the height of a legend line; on a phone each series has a line of its own
    label_chars: int  # the longest label drawn

    def x(self, percent: float, top: float = 100.0) -> float:
        return self.plot_left + self.plot_width * max(0.0, min(percent, top)) / top


# Shown 710 to 900 px wide (see evaluation.css): text of 11 units is 11 to 14 px.
WIDE = Layout(
    name="chart-wide",
    width=710,
    plot_left=150,
    plot_width=540,
    labels_above=False,
    legend_row=0,
    label_chars=20,  # right-aligned in the 144 units left of the plot
)
# Shown 300 to 420 px wide on a phone: text of 12 units stays 11 px or more.
NARROW = Layout(
    name="chart-narrow",
    width=320,
    plot_left=12,
    plot_width=286,
    labels_above=True,
    legend_row=16,
    label_chars=30,  # with the score after it: about 290 units of text at 12
)


@dataclass(frozen=True)
class Series:
    label: str
    rates: Mapping[str, float]  # percent
    intervals: Mapping[str, tuple[float, float]]  # percent


def for_every_screen(draw: Callable[[Layout], SafeString]) -> SafeString:
    """The chart in both layouts, one after the other; the stylesheet shows one of them."""
    return mark_safe(draw(WIDE) + draw(NARROW))  # both are escaped SVG from this module


def _open(layout: Layout, height: float, title: str) -> list[str]:
    return [
        f'<svg class="chart {layout.name}" viewBox="0 0 {layout.width} {height:.0f}" '
        f'role="img" aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title>",
    ]


def _legend(labels: Sequence[str], y: float, layout: Layout) -> list[str]:
    """Wide: the series side by side on one line. Narrow: one line each, from `y` down."""
    parts, x = [], float(layout.plot_left)
    for i, label in enumerate(labels):
        text = escape(label[:40])
        parts.append(
            f'<rect x="{x:.1f}" y="{y - 9:.1f}" width="10" height="10" '
            f'fill="{PALETTE[i % len(PALETTE)]}"/>'
            f'<text x="{x + 14:.1f}" y="{y:.1f}" class="legend">{text}</text>'
        )
        if layout.legend_row:
            y += layout.legend_row
        else:
            x += 24 + 7 * min(len(label), 40)
    return parts


def _legend_height(count: int, layout: Layout) -> int:
    return layout.legend_row * count if layout.legend_row else 14


def rates_chart(series: Sequence[Series], *, title: str, layout: Layout = WIDE) -> SafeString:
    """Success rate per achievement, one bar per series, grouped; whiskers: 95% interval."""
    k = max(len(series), 1)
    bar = 8 if k <= 3 else 5
    name_line = 16 if layout.labels_above else 0  # the achievement's name above its bars
    group = name_line + k * bar + 8
    top = _legend_height(len(series), layout) + 26
    height = top + group * len(ACHIEVEMENTS) + 10
    out = [*_open(layout, height, title), *_legend([s.label for s in series], 14, layout)]
    for tick in (0, 25, 50, 75, 100):
        x = layout.x(tick)
        out.append(
            f'<line x1="{x:.1f}" y1="{top - 6}" x2="{x:.1f}" y2="{height - 10}" class="grid"/>'
            f'<text x="{x:.1f}" y="{top - 9}" class="tick" text-anchor="middle">{tick}%</text>'
        )
    for row, name in enumerate(ACHIEVEMENTS):
        y0 = top + row * group
        if layout.labels_above:
            out.append(
                f'<text x="{layout.plot_left}" y="{y0 + 13:.1f}" class="label">{name}</text>'
            )
        else:
            out.append(
                f'<text x="{layout.plot_left - 6}" y="{y0 + group / 2 + 3:.1f}" class="label" '
                f'text-anchor="end">{name}</text>'
            )
        for i, s in enumerate(series):
            rate = s.rates.get(name, 0.0)
            low, high = s.intervals.get(name, (rate, rate))
            y = y0 + name_line + 4 + i * bar
            mid = y + bar / 2
            colour = PALETTE[i % len(PALETTE)]
            tip = escape(f"{name} · {s.label}: {rate:.1f}% (95% interval {low:.1f} to {high:.1f}%)")
            x_low, x_high = layout.x(low), layout.x(high)
            out.append(
                f"<g><title>{tip}</title>"
                f'<rect x="{layout.plot_left}" y="{y:.1f}" '
                f'width="{layout.x(rate) - layout.plot_left:.1f}" '
                f'height="{bar - 1}" fill="{colour}"/>'
                f'<line x1="{x_low:.1f}" y1="{mid:.1f}" x2="{x_high:.1f}" y2="{mid:.1f}" '
                f'class="whisker"/>'
                f'<line x1="{x_low:.1f}" y1="{mid - 2:.1f}" x2="{x_low:.1f}" '
                f'y2="{mid + 2:.1f}" class="whisker"/>'
                f'<line x1="{x_high:.1f}" y1="{mid - 2:.1f}" x2="{x_high:.1f}" '
                f'y2="{mid + 2:.1f}" class="whisker"/></g>'
            )
    out.append("</svg>")
    return mark_safe("".join(out))  # every interpolated text is escaped above


def score_chart(
    points: Sequence[tuple[str, float, tuple[float, float]]],
    *,
    title: str,
    layout: Layout = WIDE,
) -> SafeString:
    """One dot per row with its 95% interval, on a common 0-based percent axis."""
    name_line = 16 if layout.labels_above else 0  # the row's label above its dot
    row_h = 22 + name_line
    top = 24
    height = top + row_h * max(len(points), 1) + 6
    peak = max([hi for _, _, (_, hi) in points] + [value for _, value, _ in points] + [1.0])
    scale = _nice(peak)
    out = _open(layout, height, title)
    for i in range(5):
        tick = scale * i / 4
        x = layout.x(tick, scale)
        out.append(
            f'<line x1="{x:.1f}" y1="{top - 6}" x2="{x:.1f}" y2="{height - 4}" class="grid"/>'
            f'<text x="{x:.1f}" y="{top - 9}" class="tick" text-anchor="middle">'
            f"{tick:.3g}%</text>"
        )
    for i, (label, value, (low, high)) in enumerate(points):
        y = top + i * row_h + name_line + (row_h - name_line) / 2
        colour = PALETTE[i % len(PALETTE)]
        tip = escape(f"{label}: {value:.2f}% (95% interval {low:.2f} to {high:.2f}%)")
        text = escape(_clipped(label, layout.label_chars))
        if layout.labels_above:
            caption = (
                f'<text x="{layout.plot_left}" y="{y - 10:.1f}" class="label">{text} · '
                f"{value:.2f}%</text>"
            )
        else:
            caption = (
                f'<text x="{layout.plot_left - 6}" y="{y + 4:.1f}" class="label" '
                f'text-anchor="end">{text}</text>'
            )
        out.append(
            f"<g><title>{tip}</title>{caption}"
            f'<line x1="{layout.x(low, scale):.1f}" y1="{y:.1f}" '
            f'x2="{layout.x(high, scale):.1f}" y2="{y:.1f}" class="whisker"/>'
            f'<circle cx="{layout.x(value, scale):.1f}" cy="{y:.1f}" r="5" fill="{colour}"/></g>'
        )
    out.append("</svg>")
    return mark_safe("".join(out))  # every interpolated text is escaped above


def _clipped(label: str, chars: int) -> str:
    return label if len(label) <= chars else label[: chars - 1] + "…"


def _nice(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k at or above `value`: round axis ends."""
    magnitude = 10 ** len(str(int(max(value, 1)))) / 10
    for step in (1, 2, 2.5, 5, 10):
        if step * magnitude >= value:
            return step * magnitude
    return 10 * magnitude
