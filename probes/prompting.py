"""What a probe run sends for one question, and how its answer is read: Django-free.

The request is one user message: the frame as an image part (`observation` "image"), the
turn's text observation instead (`"text"`, a control), or nothing but the question
(`"none"`, the other control), then the question with its choices lettered A, B, C, ... A
model answers with one choice; `parse_choice` reads it strictly: a letter (`B`, `b`, `(B)`,
`B.`), a choice's own text (`cow`), or both (`B. cow`). Anything else names no choice.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from typing import Any

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
OBSERVATIONS = ("image", "text", "none")

SYSTEM_PROMPT = (
    "You answer multiple-choice questions about a moment of the game Crafter. "
    "Reply with the letter of exactly one choice and nothing else."
)
# Said before what the model is shown, per observation.
_SHOWN = {
    "image": "The game's frame at that moment:",
    "text": "The game at that moment, as text:",
}


def lettered(choices: Sequence[str]) -> str:
    """`A. cow` / `B. tree` / ..., one a line."""
    if len(choices) > len(LETTERS):
        raise ValueError(f"{len(choices)} choices: at most {len(LETTERS)} can be lettered")
    return "\n".join(f"{LETTERS[i]}. {choice}" for i, choice in enumerate(choices))


def answer_letter(choices: Sequence[str], answer: str) -> str:
    """The letter of `answer` among the lettered choices: what the prompt asks a model for."""
    return LETTERS[list(choices).index(answer)]


def question_prompt(text: str, choices: Sequence[str]) -> str:
    """The question as the model reads it: the question, its lettered choices, the rule."""
    return f"{text}\n\n{lettered(choices)}\n\nAnswer with one letter."


def png_data_url(png: bytes) -> str:
    """Exactly the stored PNG, as an `image_url` part's URL."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def question_messages(
    *,
    observation: str,
    text: str,
    choices: Sequence[str],
    png: bytes | None = None,
    observation_text: str = "",
    image_detail: str = "auto",
) -> list[dict[str, Any]]:
    """The chat messages of one question, as sent."""
    if observation not in OBSERVATIONS:
        raise ValueError(f"observation: {observation!r} is not one of {', '.join(OBSERVATIONS)}")
    parts: list[dict[str, Any]] = []
    if observation == "image":
        if png is None:
            raise ValueError("observation image: the frame's PNG is needed")
        parts.append({"type": "text", "text": _SHOWN["image"]})
        parts.append(
            {"type": "image_url", "image_url": {"url": png_data_url(png), "detail": image_detail}}
        )
    elif observation == "text":
        parts.append({"type": "text", "text": f"{_SHOWN['text']}\n{observation_text}"})
    parts.append({"type": "text", "text": question_prompt(text, choices)})
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": parts},
    ]


# `B`, `(B)`, `B.`, `B)`, `B:`; then optionally the choice's own text after it.
_LETTER = re.compile(r"\(?([A-Za-z])(?:\)|\.|:|\))?")
# Markdown emphasis, quotes and a closing full stop around an otherwise plain answer.
_WRAPPING = "*_`\"' \t\r\n"


def parse_choice(answer: str, choices: Sequence[str]) -> str | None:
    """The choice `answer` names, or None when it names none (or more than one way)."""
    text = answer.strip().strip(_WRAPPING).strip()
    if text.endswith(".") and len(text) > 1:
        text = text[:-1].rstrip()
    if not text:
        return None
    folded = {choice.casefold(): choice for choice in choices}
    match = _LETTER.fullmatch(text)
    if match:
        return _by_letter(match.group(1), choices)
    if text.casefold() in folded:
        return folded[text.casefold()]
    # A letter with its choice's text: `B. cow`, `(B) cow`, `B) cow`, `B: cow`.
    prefix = re.match(r"\(?([A-Za-z])(?:\)|\.|:)\s*(.+)$", text, re.DOTALL)
    if prefix:
        chosen = _by_letter(prefix.group(1), choices)
        rest = prefix.group(2).strip().strip(_WRAPPING).strip()
        if chosen is not None and rest.casefold() == chosen.casefold():
            return chosen
    return None


def _by_letter(letter: str, choices: Sequence[str]) -> str | None:
    index = LETTERS.find(letter.upper())
    return choices[index] if 0 <= index < len(choices) else None
