"""Error texts users read: no object reprs, no memory addresses. Pure, no Django."""

from __future__ import annotations

import re

# `<_io.BytesIO object at 0x7f...>`, `<Foo object at 0x...>`: say nothing to a reader.
_OBJECT_REPR = re.compile(r"<[\w.]+ object at 0x[0-9a-fA-F]+>")


def plain_error(exc: BaseException) -> str:
    """An exception as a user may read it: its kind and message, no object reprs."""
    text = _OBJECT_REPR.sub("the data", str(exc)).strip() or type(exc).__name__
    return text if text.startswith(type(exc).__name__) else f"{type(exc).__name__}: {text}"
