"""Number formats of the evaluation pages."""

from __future__ import annotations

from django import template

register = template.Library()


@register.filter
def signed(value: float, digits: int = 2) -> str:
    """+1.25 / -0.50 / 0.00: a difference always shows its direction."""
    number = float(value)
    text = f"{number:+.{int(digits)}f}"
    return (
        text.lstrip("+") if float(text) == 0 else text.replace("-", "\u2212")
    )  # a true minus sign


@register.filter
def seeds_text(seeds: list[int], limit: int = 30) -> str:
    """Seeds as a short list: `1, 2, 7 … and 40 more`."""
    shown = ", ".join(str(s) for s in seeds[: int(limit)])
    more = len(seeds) - int(limit)
    return f"{shown} … and {more} more" if more > 0 else shown


@register.filter
def get_item(mapping: dict, key: object) -> object:
    return mapping.get(key, "")
