"""The probe pages' chart, drawn on the server as SVG like the compare page's
(`evaluation.charts`: its two layouts, its palette; the stylesheet shows the layout that fits).

Accuracy per kind: one bar per run, its 95% interval as a whisker, and chance (what picking a
choice at random scores on the kind's questions) as a dashed mark across the kind's bars, so
that "better than chance" is read at a glance.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from evaluation.charts import PALETTE, Layout, for_every_screen

Interval = tuple[float, float]


@dataclass(frozen=True)
class KindRow:
    kind: str  # the row's label
    chance: float  # percent


@dataclass(frozen=True)
class RunSeries:
    label: str
    accuracy: Mapping[str, float]  # kind -> percent; a kind missing: not answered yet
    intervals: Mapping[str, Interval]  # kind -> percent


def accuracy_svg(rows: Sequence[KindRow], series: Sequence[RunSeries], *, title: str) -> SafeString:
    """The chart in both layouts (see `evaluation.charts.for_every_screen`)."""
    return for_every_screen(lambda layout: accuracy_chart(rows, series, title=title, layout=layout))


def _legend(labels: Sequence[str], layout: Layout) -> tuple[list[str], float]:
    """The runs' swatches and chance's dashed mark; returns the parts and the height used."""
    entries = [(label, PALETTE[i % len(PALETTE)]) for i, label in enumerate(labels)]
    parts, x, y = [], float(layout.plot_left), 14.0
    for label, colour in entries:
        text = escape(label[:40])
        parts.append(
            f'<rect x="{x:.1f}" y="{y - 9:.1f}" width="10" height="10" fill="{colour}"/>'
            f'<text x="{x + 14:.1f}" y="{y:.1f}" class="legend">{text}</text>'
        )
        if layout.legend_row:
            y += layout.legend_row
        else:
            x += 24 + 7 * min(len(label), 40)
    parts.append(
        f'<line x1="{x:.1f}" y1="{y - 9:.1f}" x2="{x:.1f}" y2="{y + 1:.1f}" class="chance"/>'
        f'<text x="{x + 6:.1f}" y="{y:.1f}" class="legend">chance</text>'
    )
    return parts, y + 4


def accuracy_chart(
    rows: Sequence[KindRow],
    series: Sequence[RunSeries],
    *,
    title: str,
    layout: Layout,
) -> SafeString:
    k = max(len(series), 1)
    bar = 10 if k <= 2 else 6
    name_line = 16 if layout.labels_above else 0  # the kind's name above its bars
    group = name_line + k * bar + 10
    legend, legend_bottom = _legend([s.label for s in series], layout)
    top = legend_bottom + 22
    height = top + group * max(len(rows), 1) + 8
    out = [
        f'<svg class="chart {layout.name}" viewBox="0 0 {layout.width} {height:.0f}" '
        f'role="img" aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">',
        f"<title>{escape(title)}</title>",
        *legend,
    ]
    for tick in (0, 25, 50, 75, 100):
        x = layout.x(tick)
        out.append(
            f'<line x1="{x:.1f}" y1="{top - 6:.1f}" x2="{x:.1f}" y2="{height - 8:.1f}" '
            f'class="grid"/><text x="{x:.1f}" y="{top - 9:.1f}" class="tick" '
            f'text-anchor="middle">{tick}%</text>'
        )
    for r, row in enumerate(rows):
        y0 = top + r * group
        name = escape(row.kind[: layout.label_chars])
        if layout.labels_above:
            out.append(
                f'<text x="{layout.plot_left}" y="{y0 + 13:.1f}" class="label">{name}</text>'
            )
        else:
            out.append(
                f'<text x="{layout.plot_left - 6}" y="{y0 + group / 2 + 3:.1f}" class="label" '
                f'text-anchor="end">{name}</text>'
            )
        bars_top = y0 + name_line + 4
        for i, s in enumerate(series):
            if row.kind not in s.accuracy:
                continue
            rate = s.accuracy[row.kind]
            low, high = s.intervals.get(row.kind, (rate, rate))
            y = bars_top + i * bar
            mid = y + (bar - 1) / 2
            tip = escape(
                f"{row.kind} · {s.label}: {rate:.1f}% (95% interval {low:.1f} to {high:.1f}%; "
                f"chance {row.chance:.1f}%)"
            )
            x_low, x_high = layout.x(low), layout.x(high)
            out.append(
                f"<g><title>{tip}</title>"
                f'<rect x="{layout.plot_left}" y="{y:.1f}" '
                f'width="{layout.x(rate) - layout.plot_left:.1f}" height="{bar - 1}" '
                f'fill="{PALETTE[i % len(PALETTE)]}"/>'
                f'<line x1="{x_low:.1f}" y1="{mid:.1f}" x2="{x_high:.1f}" y2="{mid:.1f}" '
                f'class="whisker"/>'
                f'<line x1="{x_low:.1f}" y1="{mid - 3:.1f}" x2="{x_low:.1f}" y2="{mid + 3:.1f}" '
                f'class="whisker"/>'
                f'<line x1="{x_high:.1f}" y1="{mid - 3:.1f}" x2="{x_high:.1f}" '
                f'y2="{mid + 3:.1f}" class="whisker"/></g>'
            )
        x_chance = layout.x(row.chance)
        out.append(
            f'<line x1="{x_chance:.1f}" y1="{bars_top - 3:.1f}" x2="{x_chance:.1f}" '
            f'y2="{bars_top + k * bar + 2:.1f}" class="chance">'
            f"<title>{escape(f'{row.kind}: chance {row.chance:.1f}%')}</title></line>"
        )
    out.append("</svg>")
    return mark_safe("".join(out))  # every interpolated text is escaped above
