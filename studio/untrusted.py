"""Text from outside (a model server, an upload): made storable, bounded, and never a secret.

PostgreSQL refuses NUL in text and JSON, UTF-8 cannot encode a lone surrogate (JSON's
`"\\ud800"` decodes to one), and a field with no bound fills a worker's memory and every
page that shows it. Everything from outside goes through `clean_text` before it is stored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Code points UTF-8 cannot hold: lone surrogates.
_SURROGATES = re.compile("[\ud800-\udfff]")
# What a terminal obeys instead of showing: C0 (ESC starts `ESC[2J`, an OSC title), DEL, C1.
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f]")
_CONTROLS_BUT_NEWLINE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")
REPLACEMENT = "\ufffd"


@dataclass(frozen=True)
class Cleaned:
    text: str
    # The UTF-8 size before it was cut, when it was cut; else None.
    original_bytes: int | None = None
    # NUL removed or invalid code points replaced.
    altered: bool = False


def clean_text(value: str, *, max_bytes: int) -> Cleaned:
    """NUL removed, lone surrogates replaced, cut to at most `max_bytes` of UTF-8."""
    text = value
    altered = False
    if "\x00" in text:
        text = text.replace("\x00", "")
        altered = True
    # An ASCII string (CPython knows it without looking) has no surrogates to search for.
    if not text.isascii() and _SURROGATES.search(text):
        text = _SURROGATES.sub(REPLACEMENT, text)
        altered = True
    # Cheap test first: a string of n code points is at least n bytes and at most 4n.
    if len(text) * 4 <= max_bytes:
        return Cleaned(text, None, altered)
    encoded = text.encode("utf-8")
    if len(encoded) <= max_bytes:
        return Cleaned(text, None, altered)
    # A cut inside a multi-byte character drops that character, never leaves half of it.
    cut = encoded[:max_bytes].decode("utf-8", errors="ignore")
    return Cleaned(cut, len(encoded), altered)


def storable(value: str, *, max_bytes: int) -> str:
    """`clean_text` when only the text matters (error messages, one-line summaries)."""
    return clean_text(value, max_bytes=max_bytes).text


def terminal_safe(text: str, *, keep_lines: bool = False) -> str:
    """Text from outside as a terminal or a log shows it: every control character escaped
    (`\\x1b`), so none clears the screen, retitles the window or rewrites a line; with
    `keep_lines`, a newline still ends a line (a carriage return or a tab is escaped too)."""
    pattern = _CONTROLS_BUT_NEWLINE if keep_lines else _CONTROLS
    return pattern.sub(lambda match: f"\\x{ord(match.group()):02x}", text)
