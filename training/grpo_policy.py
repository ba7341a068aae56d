"""`TrainedPolicy`: the model a GRPO job is training, as a rollouts `Policy` for one episode.

Each turn is one `EpisodeModel.reply` (`training.open_models.grpo_play`): the user turn is
the text observation and the frame, as the `openai` policy's request shows them with
observation `image_text`; the model answers it on the whole episode so far. What a turn
records as its request is that whole conversation, as the model saw it: the system message,
every earlier turn's user message and the model's own answer text, and this turn's user
message, each frame as a `{"frame_step": N}` reference (the frame row is the one copy). An
exported row of the turn is then what the model answered from, not a single-turn row it
never saw; the cost is a request that grows with the turn's index.

The answer is the model's own text, read as a server that parses Qwen-style tool calls
would give it: each `<tool_call>{"name": ..., "arguments": ...}</tool_call>` block that is
JSON is a tool call, the rest is the message's text. From there it is read by the `openai`
policy's reader (`read_answer`), so the same checks, bounds and error kinds apply: a call
to `interact_many` gives the actions; without one, actions named in the text
(`text_fallback`); nothing usable, `noop` with the error kind (`no_tool_call`,
`malformed_arguments`, `unknown_action`, `wrong_tool`, `empty_answer`, `truncated_answer`,
`invalid_text`).
"""

from __future__ import annotations

import io
import json
import re
import time
from typing import Any

from django.conf import settings as django_settings
from PIL import Image

from rollouts.game.tools import system_prompt
from rollouts.policies.base import Decision, Observation
from rollouts.policies.openai.answers import read_answer
from studio.untrusted import storable

# What the policy's batch shows the model (`RolloutSettings.observation_mode`).
OBSERVATION_MODE = "image_text"
IMAGE_DETAIL = "auto"
_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def first_messages() -> list[dict[str, Any]]:
    """The system message a GRPO episode starts with (before the chat template's tool block)."""
    return [
        {
            "role": "system",
            "content": system_prompt(observation_mode=OBSERVATION_MODE, history_frames=0),
        }
    ]


class TrainedPolicy:
    """One episode of the model being trained; `model` is its `EpisodeModel`."""

    # Played on the train worker that holds the model: no paid call, nothing to resume.
    calls_model = False

    def __init__(self, model: Any, *, max_answer_bytes: int | None = None) -> None:
        self.model = model
        self.max_answer_bytes = (
            django_settings.STUDIO_MAX_ANSWER_BYTES
            if max_answer_bytes is None
            else max_answer_bytes
        )
        self._conversation: list[dict[str, Any]] = first_messages()

    def close(self) -> None:
        pass  # the model is the trainer's; the episode's tokens stay with it for the update

    def decide(self, observation: Observation) -> Decision:
        user = {
            "role": "user",
            "content": [
                {"type": "text", "text": observation.text},
                {
                    "type": "image_url",
                    "image_url": {"frame_step": observation.frame_step, "detail": IMAGE_DETAIL},
                },
            ],
        }
        seen = [*self._conversation, user]
        content = [
            {"type": "text", "text": observation.text},
            {"type": "image", "image": _image(observation.png)},
        ]
        started = time.monotonic()
        text = self.model.reply(content)
        decision = Decision(actions=[], request_messages=seen, model_called=True)
        # The answer as the model wrote it (its tool call text included) is what later
        # turns are answered on; bounded like any answer text before it is kept.
        answer = storable(text if isinstance(text, str) else "", max_bytes=self.max_answer_bytes)
        self._conversation = [*seen, {"role": "assistant", "content": answer}]
        decision.latency_ms = int((time.monotonic() - started) * 1000)
        bad = read_model_text(
            text,
            decision,
            turn=observation.turn,
            usage=_usage(self.model),
            max_answer_bytes=self.max_answer_bytes,
        )
        if bad is not None:
            decision.error_kind = bad[0]
            decision.error = storable(bad[1], max_bytes=4000)
            decision.actions = ["noop"]
        return decision


def _image(png: bytes) -> Image.Image:
    with Image.open(io.BytesIO(png)) as image:
        return image.convert("RGB")


def _usage(model: Any) -> dict[str, Any]:
    """The last answer's token counts, when the model says them (read as a server's usage:
    anything that is not a count is 0)."""
    return {
        "prompt_tokens": getattr(model, "last_prompt_tokens", 0),
        "completion_tokens": getattr(model, "last_completion_tokens", 0),
    }


def read_model_text(
    text: Any,
    decision: Decision,
    *,
    turn: int,
    usage: dict[str, Any] | None = None,
    max_answer_bytes: int,
) -> tuple[str, str] | None:
    """Fill `decision` from the model's answer text; (error kind, message) for bad output.

    The text becomes a chat completion's message (its tool calls lifted out of it) and is
    read by `read_answer`: every field cleaned and bounded there, never here."""
    text = text if isinstance(text, str) else ""
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    at = 0
    for match in _TOOL_CALL.finditer(text):
        call = _tool_call(match.group(1), f"call_{turn}_{len(calls)}")
        if call is None:
            continue  # not JSON: it stays in the text, where the fallback may read it
        kept.append(text[at : match.start()])
        at = match.end()
        calls.append(call)
    kept.append(text[at:])
    rest = "".join(kept).strip()
    message = {"role": "assistant", "content": rest if rest or not calls else None}
    if calls:
        message["tool_calls"] = calls
    body = {"choices": [{"message": message, "finish_reason": ""}], "usage": usage or {}}
    # ASCII JSON: a lone surrogate or a NUL travels as an escape, for the reader to find.
    encoded = json.dumps(body).encode("ascii")
    return read_answer(encoded, decision, max_field_bytes=max_answer_bytes)


def _tool_call(body: str, call_id: str) -> dict[str, Any] | None:
    """A `<tool_call>` block's JSON as a chat completion's tool call; None if it is not an
    object. Its name and arguments are passed on as written: the reader judges them."""
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(value, dict):
        return None
    arguments = value.get("arguments")
    if not isinstance(arguments, str):
        try:
            arguments = json.dumps(arguments)
        except (ValueError, RecursionError):
            arguments = ""
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": value.get("name"), "arguments": arguments},
    }
