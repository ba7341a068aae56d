"""The fallback for models that answer in text instead of calling `interact_many`.

Some OpenAI-compatible servers (older vLLM tool parsers, Ollama models without tool support,
models that ignore `tool_choice`) reply with prose or a JSON blob in `content`. Rather than
throwing the turn away, the policy reads action names out of that text, in this order:

1. a JSON object with an `"actions"` list anywhere in the text (fenced or not), as the tool
   call would have carried it: its entries that name one of the 17 actions, in order;
2. otherwise, action names written as code or quoted (`` `do` ``, `"move_left"`), in order;
3. otherwise, action names as whole words, in order (`move left` and `Move-Left` count as
   `move_left`); the plain English words `do`, `sleep` and `noop` only count when the text
   names no other action, because prose like "I will do that" is not a command.

At most `MAX_ACTIONS_PER_CALL` actions are taken, as the tool would allow. Nothing found
means the turn is bad output (`no_tool_call`). The policy marks every turn that used this
fallback with `Turn.text_fallback = True`.
"""

from __future__ import annotations

import json
import re

from rollouts.game.crafter_env import ACTIONS
from rollouts.game.tools import MAX_ACTIONS_PER_CALL

_WORDY = frozenset({"do", "sleep", "noop"})
# Longest first so that `make_wood_pickaxe` is never read as a shorter name.
_NAMES = sorted(ACTIONS, key=len, reverse=True)
_NAME_PATTERN = "|".join(name.replace("_", r"[ _\-]") for name in _NAMES)
_BARE = re.compile(rf"(?<![A-Za-z0-9_])({_NAME_PATTERN})(?![A-Za-z0-9_])", re.IGNORECASE)
_MARKED = re.compile(rf"[`'\"]({_NAME_PATTERN})[`'\"]", re.IGNORECASE)
_JSON_START = re.compile(r"\{")


def normalize_action(name: str) -> str:
    """`Move-Left`, `move left`, ` MOVE_LEFT ` -> `move_left` (unknown names pass through)."""
    return re.sub(r"[ \-]+", "_", str(name).strip().lower())


def actions_from_text(text: str | None) -> list[str]:
    """Action names found in a model's text answer, in order; [] when there are none."""
    if not text:
        return []
    found = _from_json(text)
    if not found:
        found = [normalize_action(m) for m in _MARKED.findall(text)]
    if not found:
        found = [normalize_action(m) for m in _BARE.findall(text)]
        if any(a not in _WORDY for a in found):
            found = [a for a in found if a not in _WORDY]
    return found[:MAX_ACTIONS_PER_CALL]


def _from_json(text: str) -> list[str]:
    decoder = json.JSONDecoder()
    for match in _JSON_START.finditer(text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if isinstance(value, dict) and isinstance(value.get("actions"), list):
            names = [normalize_action(a) for a in value["actions"] if isinstance(a, str)]
            known = [a for a in names if a in ACTIONS]
            if known:
                return known
    return []
