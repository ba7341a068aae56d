"""The agent's prompt and its one tool, `interact_many`: the single source for policy and export."""

from __future__ import annotations

import json
from typing import Any

from rollouts.crafter_env import ACHIEVEMENTS, ACTIONS

TOOL_NAME = "interact_many"
MAX_ACTIONS_PER_CALL = 8

INTERACT_MANY_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": TOOL_NAME,
        "description": (
            "Execute one or more Crafter actions in order. Use several actions when the next "
            "moves are obvious (e.g. walk three cells, then 'do')."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "actions": {
                    "type": "array",
                    "items": {"type": "string", "enum": list(ACTIONS)},
                    "minItems": 1,
                    "maxItems": MAX_ACTIONS_PER_CALL,
                    "description": "Action names, executed first to last.",
                }
            },
            "required": ["actions"],
            "additionalProperties": False,
        },
    },
}


def system_prompt(*, observation_mode: str = "image_text", history_frames: int = 0) -> str:
    """The system message, worded for what the user message will show (see RolloutSettings)."""
    seen = {
        "image_text": "the current frame and a text description of your state",
        "image": "the current frame (an image only, no text description)",
        "text": "a text description of your state and the map around you (no image)",
    }[observation_mode]
    lines = [
        "You play Crafter, a 2D survival game seen from above on a 64x64 world. "
        f"Each turn you see {seen}.",
    ]
    if observation_mode != "text":
        lines.append(
            "A frame is a 9x9 grid: the 9x7 area around you (you are in the middle), and your "
            "inventory in the two bottom rows."
        )
    if history_frames:
        lines.append(
            f"You also see your last {history_frames} turns, oldest first, and the actions "
            "you took after each."
        )
    lines += [
        "Keep health, food, drink and energy up: eat cows or plants, drink water, sleep when "
        "energy is low, avoid or fight zombies and skeletons. Collect resources and craft "
        "tools to unlock achievements.",
        f"Actions: {', '.join(ACTIONS)}. 'do' collects, attacks or interacts with the cell "
        "you face; moving into a blocked cell only turns you to face it. Crafting needs a "
        "nearby table (and a furnace for stone and iron tools).",
        f"Achievements: {', '.join(ACHIEVEMENTS)}.",
        f"Answer by calling the tool `{TOOL_NAME}` with 1 to {MAX_ACTIONS_PER_CALL} actions.",
    ]
    return "\n".join(lines)


SYSTEM_PROMPT = system_prompt()


def tool_call(actions: list[str], call_id: str) -> dict[str, Any]:
    """An assistant tool call as the chat completions API writes it."""
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": TOOL_NAME, "arguments": json.dumps({"actions": list(actions)})},
    }
