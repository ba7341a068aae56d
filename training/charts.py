"""The job page's inline SVG charts: the scale from values to pixels, and a GRPO job's reward
and update charts drawn with it. Django-free.

The loss chart (`training.selectors.job_loss_chart`) uses the same `Axis`, so every chart of
the page puts a value at the same pixel by the same rule.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# The margin every chart of the job page leaves around its plot (its axes' labels).
PAD = 24


@dataclass(frozen=True)
class Axis:
    """Values lo..hi drawn at pixels start..end (end may be below start: y grows down); a
    range of one value is drawn at the middle."""

    lo: float
    hi: float
    start: float
    end: float

    def at(self, value: float) -> float:
        share = (value - self.lo) / (self.hi - self.lo) if self.hi > self.lo else 0.5
        return self.start + (self.end - self.start) * share


def x_axis(lo: float, hi: float, width: int) -> Axis:
    return Axis(lo, hi, PAD, width - PAD)


def y_axis(lo: float, hi: float, height: int) -> Axis:
    return Axis(lo, hi, height - PAD, PAD)


def points_text(points: Iterable[tuple[float, float]]) -> str:
    """An SVG `points` attribute."""
    return " ".join(f"{px:.1f},{py:.1f}" for px, py in points)


@dataclass(frozen=True)
class RewardPoint:
    """One iteration's mean reward and its 95% interval (low and high may be absent)."""

    iteration: int
    mean: float
    low: float | None = None
    high: float | None = None


@dataclass(frozen=True)
class RewardChart:
    """The mean reward per iteration as a line, its 95% interval as a band around it."""

    width: int
    height: int
    mean_points: str = ""
    band_points: str = ""  # a polygon: the highs left to right, then the lows back
    iterations: tuple[int, int] = (0, 0)
    rewards: tuple[float, float] = (0.0, 0.0)
    count: int = 0

    @property
    def empty(self) -> bool:
        return not self.count


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def reward_chart(points: Sequence[RewardPoint], *, width: int = 640, height: int = 220):
    """The chart of `points` (in iteration order); a point without a finite mean is left out,
    an interval without finite ends is drawn as the mean alone."""
    shown = [p for p in points if _finite(p.mean)]
    if not shown:
        return RewardChart(width, height)
    lows = [p.low if _finite(p.low) else p.mean for p in shown]
    highs = [p.high if _finite(p.high) else p.mean for p in shown]
    x = x_axis(shown[0].iteration, shown[-1].iteration, width)
    y = y_axis(min(lows + [p.mean for p in shown]), max(highs + [p.mean for p in shown]), height)
    upper = [(x.at(p.iteration), y.at(high)) for p, high in zip(shown, highs, strict=True)]
    lower = [(x.at(p.iteration), y.at(low)) for p, low in zip(shown, lows, strict=True)]
    return RewardChart(
        width=width,
        height=height,
        mean_points=points_text((x.at(p.iteration), y.at(p.mean)) for p in shown),
        band_points=points_text(upper + lower[::-1]),
        iterations=(shown[0].iteration, shown[-1].iteration),
        rewards=(y.lo, y.hi),
        count=len(shown),
    )


@dataclass(frozen=True)
class UpdateChart:
    """The trainer's loss and KL per iteration, each scaled to the chart's height on its own
    (a KL is often a hundred times smaller than the loss): the legend gives both ranges."""

    width: int
    height: int
    loss_points: str = ""
    kl_points: str = ""
    iterations: tuple[int, int] = (0, 0)
    losses: tuple[float, float] = (0.0, 0.0)
    kls: tuple[float, float] = (0.0, 0.0)
    count: int = 0

    @property
    def empty(self) -> bool:
        return not self.count


def update_chart(
    rows: Sequence[tuple[int, float | None, float | None]],
    *,
    width: int = 640,
    height: int = 140,
) -> UpdateChart:
    """`rows`: (iteration, loss, kl) in iteration order; a missing value is left out."""
    losses = [(n, v) for n, v, _ in rows if _finite(v)]
    kls = [(n, v) for n, _, v in rows if _finite(v)]
    drawn = sorted({n for n, _ in losses} | {n for n, _ in kls})
    if not drawn:
        return UpdateChart(width, height)
    x = x_axis(drawn[0], drawn[-1], width)

    def line(series: list[tuple[int, float]]) -> tuple[str, tuple[float, float]]:
        if not series:
            return "", (0.0, 0.0)
        values = [v for _, v in series]
        y = y_axis(min(values), max(values), height)
        return points_text((x.at(n), y.at(v)) for n, v in series), (y.lo, y.hi)

    loss_points, loss_range = line(losses)
    kl_points, kl_range = line(kls)
    return UpdateChart(
        width=width,
        height=height,
        loss_points=loss_points,
        kl_points=kl_points,
        iterations=(drawn[0], drawn[-1]),
        losses=loss_range,
        kls=kl_range,
        count=len(drawn),
    )
