"""Values of an import line as the export can write them back. Pure, no Django.

Finite numbers (no `NaN`, `Infinity`, `1e999`), integers within PostgreSQL's bigint, nesting
within MAX_DEPTH, and strings PostgreSQL stores (no NUL) that are valid Unicode (no lone
surrogates), keys included.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from curation.importing.errors import LineError

# Export rows nest 9 deep (tools -> function -> parameters -> ... -> enum); a file nesting
# deeper than this is not rows of ours, and would blow the stack of whatever reads it next.
MAX_DEPTH = 32
# Integers as PostgreSQL's bigint holds them; Turn.index is an integer column.
MAX_INT = 2**63 - 1
_SURROGATE = re.compile("[\\ud800-\\udfff]")


def _refuse_constant(name: str) -> None:
    raise LineError(f"{name} is not a number JSON allows")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise LineError(f"the number {text[:40]} is out of range")
    return value


def _bounded_int(text: str) -> int:
    # Checked on the digits first: int() of thousands of digits is slow, and refused anyway.
    if len(text.lstrip("-")) > 19 or abs(int(text)) > MAX_INT:
        raise LineError(f"the integer {text[:40]}{'...' if len(text) > 40 else ''} is out of range")
    return int(text)


def load_json(raw: bytes) -> Any:
    """One line's JSON, refused (LineError) unless every value is one the export writes."""
    try:
        value = json.loads(
            raw,
            parse_constant=_refuse_constant,
            parse_float=_finite_float,
            parse_int=_bounded_int,
        )
    except LineError:
        raise
    except RecursionError:
        raise LineError(f"nested deeper than {MAX_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise LineError(f"not JSON ({exc})") from exc
    _check_tree(value)
    return value


def _check_tree(value: Any) -> None:
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise LineError(f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(item, str):
            _check_text(item, where)
        elif isinstance(item, dict):
            for key, child in item.items():
                _check_text(key, f"a key in {where}" if where else "a key")
                stack.append((child, f"{where}.{key[:40]}" if where else key[:40], depth + 1))
        elif isinstance(item, list):
            stack.extend((child, f"{where}[{n}]", depth + 1) for n, child in enumerate(item))


def _check_text(text: str, where: str) -> None:
    if "\x00" in text:
        raise LineError(f"{where or 'the row'} holds a NUL character")
    # ASCII-only strings (base64 images, most text) cannot hold one; isascii() is O(1).
    if not text.isascii() and _SURROGATE.search(text):
        raise LineError(f"{where or 'the row'} holds a lone surrogate (not valid Unicode)")
