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

SYSTEM_PROMPT = (
    "You play Crafter, a 2D survival game seen from above on a 64x64 world. Each turn you see "
    "the current frame (a 9x9 grid: the 9x7 area around you, and your inventory in the two "
    "bottom rows) and a text description of your state. Keep health, food, drink and energy "
    "up: eat cows or plants, drink water, sleep when energy is low. Collect resources and "
    "craft tools to unlock achievements.\n"
    f"Actions: {', '.join(ACTIONS)}. 'do' collects, attacks or interacts with the cell you "
    "face; moving into a blocked cell only turns you to face it. Crafting needs a nearby "
    "table (and a furnace for stone and iron tools).\n"
    f"Achievements: {', '.join(ACHIEVEMENTS)}.\n"
    f"Answer by calling the tool `{TOOL_NAME}` with 1 to {MAX_ACTIONS_PER_CALL} actions."
)


def tool_call(actions: list[str], call_id: str) -> dict[str, Any]:
    """An assistant tool call as the chat completions API writes it."""
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": TOOL_NAME, "arguments": json.dumps({"actions": list(actions)})},
    }
