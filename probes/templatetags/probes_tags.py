"""Number formats of the probe pages."""

from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def percent(fraction: float, digits: int = 1) -> str:
    """0.4567 -> "45.7%"."""
    return f"{100 * float(fraction):.{int(digits)}f}%"


@register.filter
def percent_short(fraction: float) -> str:
    """A share as few digits as it needs: 1.0 -> "100%", 0.2 -> "20%", 0.2063 -> "20.6%"."""
    text = f"{100 * float(fraction):.1f}"
    return f"{text.removesuffix('.0')}%"


@register.filter
def points(difference: float, digits: int = 1) -> str:
    """A difference of fractions in signed percentage points: +3.2, -1.0 (a true minus), 0.0."""
    text = f"{100 * float(difference):+.{int(digits)}f}"
    return text.lstrip("+") if float(text) == 0 else text.replace("-", "\u2212")


@register.filter
def letter(position: int) -> str:
    """The letter a choice is asked with: 0 -> A."""
    return chr(ord("A") + int(position)) if 0 <= int(position) < 26 else str(position)
