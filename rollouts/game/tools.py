"""The agent's prompt and its one tool, `interact_many`: the single source for policy and export."""

from __future__ import annotations

import json
from typing import Any

from crafter import constants

from rollouts.game.crafter_env import ACHIEVEMENTS, ACTIONS

# Bumped whenever the wording of the system prompt changes; each batch records the version
# and the text it was sent (RolloutBatch.prompt_version / system_prompt).
# 1: hand-written rules (told the model stone tools need a furnace: wrong).
# 2: rules generated from crafter's data.yaml (`game_rules`).
PROMPT_VERSION = 2

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


def _amounts(items: dict[str, int]) -> str:
    return ", ".join(f"{n} {name}" for name, n in items.items())


def _either(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def game_rules() -> list[str]:
    """The recipes, generated from crafter's own data.yaml (`crafter.constants`): never retyped.

    A hand-written copy once told every model that stone tools need a furnace; here the
    rules cannot drift from the game (rollouts/tests/test_prompt.py reads the yaml itself).
    """
    lines = ["Rules of the game (from crafter's data):"]
    collect = []
    for material, info in constants.collect.items():
        text = f"{material} gives {_amounts(info['receive'])}"
        if info.get("require"):
            text += f" (needs {_amounts(info['require'])} in your inventory)"
        if info.get("probability", 1) < 1:
            text += f" ({round(100 * info['probability'])}% of the time)"
        collect.append(text)
    lines.append("- 'do' facing " + "; ".join(collect) + ".")
    for name, info in constants.place.items():
        lines.append(
            f"- place_{name} uses {_amounts(info['uses'])}; the cell you face must be "
            f"{_either(list(info['where']))}."
        )
    for name, info in constants.make.items():
        lines.append(
            f"- make_{name} uses {_amounts(info['uses'])}; needs a "
            f"{' and a '.join(info['nearby'])} next to you (within 1 cell)."
        )
    return lines


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
            f"You also see up to your last {history_frames} turns (fewer at the start), "
            "oldest first, and the actions you took after each."
        )
    lines += [
        "Keep health, food, drink and energy up: eat cows or plants, drink water, sleep when "
        "energy is low, avoid or fight zombies and skeletons. Collect resources and craft "
        "tools to unlock achievements.",
        f"Actions: {', '.join(ACTIONS)}. 'do' collects, attacks or interacts with the cell "
        "you face; moving into a blocked cell only turns you to face it.",
        *game_rules(),
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
