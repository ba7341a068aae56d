"""Reading a chat completion into a `Decision`: tool calls, text fallback, reasoning, faults."""

from __future__ import annotations

import json
import re
from typing import Any

from rollouts.crafter_env import ACTIONS
from rollouts.policies.base import Decision
from rollouts.text_actions import actions_from_text, normalize_action
from rollouts.tools import MAX_ACTIONS_PER_CALL, TOOL_NAME

_THINK = re.compile(r"<think>(.*?)(?:</think>|$)", re.DOTALL | re.IGNORECASE)


def read_answer(completion: Any, decision: Decision) -> tuple[str, str] | None:
    """Fill `decision` from a completion; return (error kind, message) for bad output."""
    usage = getattr(completion, "usage", None)
    if usage is not None:
        decision.prompt_tokens = int(getattr(usage, "prompt_tokens", 0) or 0)
        decision.completion_tokens = int(getattr(usage, "completion_tokens", 0) or 0)
    choices = getattr(completion, "choices", None)
    if not choices:
        return ("empty_answer", "the answer holds no choices")
    choice = choices[0]
    message = choice.message
    decision.finish_reason = str(choice.finish_reason or "")
    text, reasoning = split_reasoning(message)
    decision.model_text = text
    decision.reasoning_text = reasoning
    calls = message.tool_calls or []
    decision.tool_calls = [tool_call_json(call) for call in calls]
    refusal = getattr(message, "refusal", None)
    if refusal or (decision.finish_reason == "content_filter" and not calls):
        return ("refusal", f"the model refused: {refusal or '(filtered)'}")
    if calls:
        actions: list[str] = []
        for call in decision.tool_calls:
            name, raw = call["function"]["name"], call["function"]["arguments"]
            if name != TOOL_NAME:
                return ("wrong_tool", f"called unknown tool {name!r}")
            try:
                arguments = json.loads(raw) if raw else None
            except ValueError as exc:
                return ("malformed_arguments", f"arguments are not JSON ({exc}): {raw!r}")
            listed = arguments.get("actions") if isinstance(arguments, dict) else None
            if not isinstance(listed, list) or not listed:
                return (
                    "malformed_arguments",
                    f"arguments need a non-empty 'actions' list: {raw!r}",
                )
            names = [normalize_action(a) if isinstance(a, str) else a for a in listed]
            unknown = [a for a in names if a not in ACTIONS]
            if unknown:
                return ("unknown_action", f"unknown action {unknown[0]!r} in {raw!r}")
            # The schema allows 8 per call; a model that sends more gets its first 8.
            actions += names[:MAX_ACTIONS_PER_CALL]
        decision.actions = actions
        return None
    if text and text.strip():
        actions = actions_from_text(text)
        if not actions:
            return ("no_tool_call", "answered in text, without a tool call or an action")
        decision.actions = actions
        decision.text_fallback = True
        return None
    return ("empty_answer", "the answer holds neither a tool call nor text")


def split_reasoning(message: Any) -> tuple[str | None, str]:
    """(answer text, reasoning): from `reasoning_content` / `reasoning`, or `<think>` blocks."""
    text = message.content
    extra = getattr(message, "model_extra", None) or {}
    reasoning = extra.get("reasoning_content") or extra.get("reasoning") or ""
    if not isinstance(reasoning, str):
        reasoning = json.dumps(reasoning)
    if text and "<think>" in text.lower():
        thoughts = _THINK.findall(text)
        reasoning = "\n".join(filter(None, [reasoning, *(t.strip() for t in thoughts)]))
        text = _THINK.sub("", text).strip()
    return text, reasoning


def tool_call_json(call: Any) -> dict[str, Any]:
    function = getattr(call, "function", None)
    return {
        "id": str(getattr(call, "id", "") or ""),
        "type": "function",
        "function": {
            "name": str(getattr(function, "name", "") or getattr(call, "type", "")),
            "arguments": str(getattr(function, "arguments", "") or ""),
        },
    }
