"""`TrainedPolicy`: the model being trained, read as a turn's tool call, prose, garbage or
hostile bytes, with the same error kinds as the `openai` policy; and what one turn sends the
model and records."""

from __future__ import annotations

import io
import json

import pytest
from PIL import Image

from rollouts.game.tools import system_prompt
from rollouts.policies.base import Decision, Observation
from training.grpo_policy import TrainedPolicy, read_model_text

MAX = 65536


def read(text, **kwargs):
    decision = Decision(actions=[])
    bad = read_model_text(text, decision, turn=3, max_answer_bytes=kwargs.pop("max", MAX), **kwargs)
    return bad, decision


def test_a_tool_call_in_the_text_is_the_turns_tool_call():
    text = (
        'Wood is left of me. <tool_call>{"name": "interact_many", "arguments": '
        '{"actions": ["move_left", "Do"]}}</tool_call>'
    )
    bad, decision = read(text, usage={"prompt_tokens": 120, "completion_tokens": 31})
    assert bad is None
    assert decision.actions == ["move_left", "do"]
    assert decision.tool_calls == [
        {
            "id": "call_3_0",
            "type": "function",
            "function": {
                "name": "interact_many",
                "arguments": '{"actions": ["move_left", "Do"]}',
            },
        }
    ]
    assert decision.model_text == "Wood is left of me."
    assert not decision.text_fallback
    assert (decision.prompt_tokens, decision.completion_tokens) == (120, 31)


def test_a_bare_tool_call_has_no_text_and_two_calls_add_up():
    call = '<tool_call>{"name": "interact_many", "arguments": {"actions": ["%s"]}}</tool_call>'
    bad, decision = read(call % "noop" + "\n" + call % "sleep")
    assert bad is None
    assert decision.actions == ["noop", "sleep"]
    assert [c["id"] for c in decision.tool_calls] == ["call_3_0", "call_3_1"]
    assert decision.model_text is None


def test_prose_is_read_by_the_text_fallback():
    bad, decision = read("I should move up, then move up again.")
    assert bad is None
    assert decision.actions == ["move_up", "move_up"]
    assert decision.text_fallback
    assert decision.tool_calls == []
    assert decision.model_text == "I should move up, then move up again."


def test_a_block_that_is_not_json_stays_text():
    bad, decision = read("<tool_call>move_right, please</tool_call>")
    assert bad is None
    assert decision.actions == ["move_right"]
    assert decision.text_fallback and decision.tool_calls == []


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("qwxz 17 !!", "no_tool_call"),
        ("", "empty_answer"),
        ("   \n", "empty_answer"),
        (None, "empty_answer"),
        (
            '<tool_call>{"name": "craft", "arguments": {"actions": ["do"]}}</tool_call>',
            "wrong_tool",
        ),
        (
            '<tool_call>{"name": "interact_many", "arguments": {}}</tool_call>',
            "malformed_arguments",
        ),
        (
            '<tool_call>{"name": "interact_many", "arguments": {"actions": ["fly"]}}</tool_call>',
            "unknown_action",
        ),
        (
            '<tool_call>{"name": "interact_many", "arguments": "{oops"}</tool_call>',
            "malformed_arguments",
        ),
    ],
)
def test_nothing_usable_is_bad_output_of_the_openai_policys_kinds(text, kind):
    bad, _ = read(text)
    assert bad is not None and bad[0] == kind


def test_hostile_bytes_are_cleaned_and_bounded():
    # A NUL and a lone surrogate: removed or replaced, and the turn says so.
    bad, decision = read("move_left\x00 \ud800")
    assert bad[0] == "invalid_text"
    assert decision.model_text == "move_left \ufffd"
    # Longer than the bound: cut to it, on a character's edge, the original size kept.
    bad, decision = read("é" * 40, max=25)
    assert bad[0] == "truncated_answer"
    assert decision.model_text == "é" * 12
    assert decision.truncated == {"model_text": 80}
    # A count that is not one is 0, never a crash or a negative column.
    bad, decision = read("noop", usage={"prompt_tokens": -5, "completion_tokens": "many"})
    assert (decision.prompt_tokens, decision.completion_tokens) == (0, 0)


class ScriptedModel:
    """An `EpisodeModel` that answers from a list and keeps what it was sent."""

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)
        self.sent: list[list[dict]] = []

    def reply(self, content):
        self.sent.append(content)
        return self.answers.pop(0)


def observation(turn: int, frame_step: int) -> Observation:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 64), (10, 200, 30)).save(buffer, format="PNG")
    return Observation(
        seed=7,
        turn=turn,
        step=frame_step,
        step_limit=8,
        text=f"You see grass (turn {turn}).",
        frame_step=frame_step,
        png=buffer.getvalue(),
    )


def test_a_turn_sends_the_text_and_the_frame_and_records_the_conversation_it_saw():
    call = json.dumps({"name": "interact_many", "arguments": {"actions": ["do"]}})
    model = ScriptedModel(f"<tool_call>{call}</tool_call>", "bzzt")
    policy = TrainedPolicy(model, max_answer_bytes=MAX)
    first = policy.decide(observation(0, 0))
    second = policy.decide(observation(1, 1))

    text, image = model.sent[0]
    assert text == {"type": "text", "text": "You see grass (turn 0)."}
    assert image["type"] == "image" and image["image"].size == (64, 64)
    assert image["image"].getpixel((5, 5)) == (10, 200, 30)

    user = {
        "role": "user",
        "content": [
            {"type": "text", "text": "You see grass (turn 0)."},
            {"type": "image_url", "image_url": {"frame_step": 0, "detail": "auto"}},
        ],
    }
    assert first.request_messages == [
        {"role": "system", "content": system_prompt(observation_mode="image_text")},
        user,
    ]
    assert first.actions == ["do"] and first.model_called and first.error_kind == ""
    # The second turn was answered on the whole episode so far: so its request says.
    assert second.request_messages == [
        {"role": "system", "content": system_prompt(observation_mode="image_text")},
        user,
        {
            "role": "assistant",
            "content": '<tool_call>{"name": "interact_many", "arguments": '
            '{"actions": ["do"]}}</tool_call>',
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "You see grass (turn 1)."},
                {"type": "image_url", "image_url": {"frame_step": 1, "detail": "auto"}},
            ],
        },
    ]
    # Nothing usable: noop, the kind and its message on the turn.
    assert second.actions == ["noop"]
    assert second.error_kind == "no_tool_call"
    assert second.error == "answered in text, without a tool call or an action"
