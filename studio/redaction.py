"""Keeping a key out of anything a server says back (error messages end up in rows and logs).

Servers echo keys in masked forms too ("Incorrect API key provided: sk-SECR******T123"): the
visible head and tail still narrow the key down, so they are redacted like the key itself.
"""

from __future__ import annotations

import re

REDACTED = "[key]"
# A run of key characters with a masked middle: `sk-ab***yz`, `sk-proj-****abcd`, `****1234`.
_MASKED = re.compile(r"[A-Za-z0-9_\-]*[*•]{3,}[A-Za-z0-9_\-]*")
# Anything shaped like an OpenAI-style secret key, whoever's it is.
_KEY_SHAPED = re.compile(r"\bsk-(?:[A-Za-z0-9_\-]{8,}|[A-Za-z0-9_\-]*[*•]{3,}[A-Za-z0-9_\-]*)")


def redact_key(text: str, key: str) -> str:
    """`text` without `key`, its masked echoes, or anything shaped like a secret key."""
    if key:
        text = text.replace(key, REDACTED)
        text = _MASKED.sub(lambda m: _mask_of(m.group(0), key), text)
    return _KEY_SHAPED.sub(REDACTED, text)


def _mask_of(candidate: str, key: str) -> str:
    """The candidate redacted when its visible parts are the key's own head and tail."""
    parts = re.split(r"[*•]{3,}", candidate)
    head, tail = parts[0], parts[-1]
    if not head and not tail:
        return candidate
    if key.startswith(head) and key.endswith(tail) and len(head) + len(tail) < len(key):
        return REDACTED
    return candidate
