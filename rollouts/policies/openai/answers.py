"""Reading a chat completion's raw body into a `Decision`: tool calls, text, reasoning, faults.

The body is hostile until read here: it is parsed from bytes by us (not by the client
library's loosely typed models), every field is checked for its type, every string is
cleaned (NUL removed, lone surrogates replaced) and bounded (`STUDIO_MAX_ANSWER_BYTES` each
for text, reasoning and tool arguments; 40 characters for the finish reason), and every
number is clamped to what a column holds. An answer that needed any of this is recorded, as
cleaned, and counted as bad output: `truncated_answer` (the cuts are listed on the turn),
`invalid_text`, `invalid_response` (not JSON, or not shaped like a completion).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from rollouts.game.crafter_env import ACTIONS
from rollouts.game.text_actions import actions_from_text, normalize_action
from rollouts.game.tools import MAX_ACTIONS_PER_CALL, TOOL_NAME
from rollouts.policies.base import Decision
from studio.untrusted import clean_text

_THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.DOTALL | re.IGNORECASE)
FINISH_REASON_BYTES = 40  # the width of Turn.finish_reason
NAME_BYTES = 200  # a tool call's id and function name
MAX_TOOL_CALLS = 16  # 8 actions each; more than this is not an agent choosing moves
MAX_COUNT = 2**31 - 1  # Turn's token counters are 32-bit
PREVIEW_BYTES = 200

Bad = tuple[str, str]


class _Cleaner:
    """Cleans each field once and remembers what it had to cut or repair."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.truncated: dict[str, int] = {}
        self.altered: list[str] = []

    def text(self, name: str, value: str, *, max_bytes: int | None = None) -> str:
        cleaned = clean_text(value, max_bytes=self.max_bytes if max_bytes is None else max_bytes)
        if cleaned.original_bytes is not None:
            self.truncated[name] = cleaned.original_bytes
        if cleaned.altered:
            self.altered.append(name)
        return cleaned.text


def read_answer(body: bytes, decision: Decision, *, max_field_bytes: int) -> Bad | None:
    """Fill `decision` from a completion's body; return (error kind, message) for bad output."""
    try:
        data = json.loads(body.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):
        return ("invalid_response", f"the answer is not JSON: {_preview(body)}")
    if not isinstance(data, dict):
        return ("invalid_response", f"the answer is not a JSON object: {_preview(body)}")
    cleaner = _Cleaner(max_field_bytes)
    bad = _read(data, decision, cleaner)
    decision.truncated = cleaner.truncated
    if cleaner.truncated:
        cut = ", ".join(f"{name} ({size} bytes)" for name, size in cleaner.truncated.items())
        return ("truncated_answer", f"the answer was cut to fit: {cut}")
    if cleaner.altered:
        return (
            "invalid_text",
            "the answer held NUL bytes or invalid code points (removed) in "
            + ", ".join(dict.fromkeys(cleaner.altered)),
        )
    return bad


def _read(data: dict[str, Any], decision: Decision, cleaner: _Cleaner) -> Bad | None:
    usage = data.get("usage")
    if isinstance(usage, dict):
        decision.prompt_tokens = _count(usage.get("prompt_tokens"))
        decision.completion_tokens = _count(usage.get("completion_tokens"))
    choices = data.get("choices")
    if choices is None or choices == []:
        return ("empty_answer", "the answer holds no choices")
    if not isinstance(choices, list) or not isinstance(choices[0], dict):
        return ("invalid_response", "'choices' is not a list of objects")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        return ("invalid_response", "the first choice holds no message object")
    decision.finish_reason = cleaner.text(
        "finish_reason", _as_text(choice.get("finish_reason")), max_bytes=FINISH_REASON_BYTES
    )
    text, reasoning = split_reasoning(message)
    decision.model_text = None if text is None else cleaner.text("model_text", text)
    decision.reasoning_text = cleaner.text("reasoning_text", reasoning)
    raw_calls = message.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        return ("invalid_response", "'tool_calls' is not a list")
    if len(raw_calls) > MAX_TOOL_CALLS:
        cleaner.truncated["tool_calls"] = len(raw_calls)
        raw_calls = raw_calls[:MAX_TOOL_CALLS]
    decision.tool_calls = [tool_call_json(call, i, cleaner) for i, call in enumerate(raw_calls)]
    refusal = message.get("refusal")
    refusal = cleaner.text("refusal", _as_text(refusal), max_bytes=2000) if refusal else ""
    calls = decision.tool_calls
    if refusal or (decision.finish_reason == "content_filter" and not calls):
        return ("refusal", f"the model refused: {refusal or '(filtered)'}")
    if calls:
        actions: list[str] = []
        for call in calls:
            name, raw = call["function"]["name"], call["function"]["arguments"]
            if name != TOOL_NAME:
                return ("wrong_tool", f"called unknown tool {name[:100]!r}")
            try:
                arguments = json.loads(raw) if raw else None
            except (ValueError, RecursionError) as exc:
                return ("malformed_arguments", f"arguments are not JSON ({exc}): {raw[:500]!r}")
            listed = arguments.get("actions") if isinstance(arguments, dict) else None
            if not isinstance(listed, list) or not listed:
                return (
                    "malformed_arguments",
                    f"arguments need a non-empty 'actions' list: {raw[:500]!r}",
                )
            names = [normalize_action(a) if isinstance(a, str) else a for a in listed]
            unknown = [a for a in names if a not in ACTIONS]
            if unknown:
                return (
                    "unknown_action",
                    f"unknown action {str(unknown[0])[:100]!r} in {raw[:500]!r}",
                )
            # The schema allows 8 per call; a model that sends more gets its first 8.
            actions += names[:MAX_ACTIONS_PER_CALL]
        decision.actions = actions
        return None
    text = decision.model_text
    if text and text.strip():
        actions = actions_from_text(text)
        if not actions:
            return ("no_tool_call", "answered in text, without a tool call or an action")
        decision.actions = actions
        decision.text_fallback = True
        return None
    return ("empty_answer", "the answer holds neither a tool call nor text")


def split_reasoning(message: dict[str, Any]) -> tuple[str | None, str]:
    """(answer text, reasoning): from `reasoning_content` / `reasoning`, or `<think>` blocks."""
    content = message.get("content")
    if isinstance(content, list):
        # Some servers answer with content parts, as requests send them.
        content = "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    text = None if content is None else _as_text(content)
    reasoning = _as_text(message.get("reasoning_content") or message.get("reasoning") or "")
    if text and "<think>" in text.lower():
        thoughts = _THINK.findall(text)
        reasoning = "\n".join(filter(None, [reasoning, *(t.strip() for t in thoughts)]))
        text = _THINK.sub("", text).strip()
    return text, reasoning


def tool_call_json(call: Any, index: int, cleaner: _Cleaner) -> dict[str, Any]:
    call = call if isinstance(call, dict) else {}
    function = call.get("function")
    function = function if isinstance(function, dict) else {}
    where = f"tool_calls.{index}"
    return {
        "id": cleaner.text(f"{where}.id", _as_text(call.get("id")), max_bytes=NAME_BYTES),
        "type": "function",
        "function": {
            "name": cleaner.text(
                f"{where}.name",
                _as_text(function.get("name") or call.get("type")),
                max_bytes=NAME_BYTES,
            ),
            "arguments": cleaner.text(f"{where}.arguments", _as_text(function.get("arguments"))),
        },
    }


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except (ValueError, RecursionError):
        return ""


def _count(value: Any) -> int:
    """A token count as a column holds it: a non-negative 32-bit integer, else 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return 0
    if isinstance(value, float) and not math.isfinite(value):
        return 0
    return min(max(int(value), 0), MAX_COUNT)


def _preview(body: bytes) -> str:
    return repr(body[:PREVIEW_BYTES].decode("utf-8", errors="replace"))
