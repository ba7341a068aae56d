"""`TurnModel`'s tokens, checked against the processor's own rendering of the whole episode.

The choosing tiny model answers `<tool_call>`, one action's call, `</tool_call>` and its end
of turn (four tokens, each a token of its vocabulary), so the rendering of the conversation
gives back exactly the tokens it sampled.
"""

from __future__ import annotations

import pytest
from PIL import Image

from rollouts.game.crafter_env import ACTION_INDEX, StudioEnv, text_observation
from rollouts.game.text_actions import actions_from_text
from rollouts.game.tools import INTERACT_MANY_TOOL, system_prompt
from training.open_models.grpo_turns import TurnModel
from training.tests.grpo_players import choosing_tiny_vlm, tool_call_text

ACTIONS = ("move_left", "noop", "do", "move_right")
# A 64 x 64 frame is resized to 56 x 56 (a multiple of 28): 4 x 4 patches of 14 pixels,
# merged 2 x 2 into 4 image tokens.
PADS_PER_FRAME = 4


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    directory = choosing_tiny_vlm(tmp_path_factory.mktemp("chooser") / "model", ACTIONS)
    return AutoModelForImageTextToText.from_pretrained(directory), AutoProcessor.from_pretrained(
        directory
    )


def turn_model(loaded, *, seed=3, max_answer_tokens=8) -> TurnModel:
    model, processor = loaded
    return TurnModel(
        model=model,
        processor=processor,
        system_prompt=system_prompt(observation_mode="image_text", history_frames=0),
        tool=INTERACT_MANY_TOOL,
        max_answer_tokens=max_answer_tokens,
        temperature=1.0,
        seed=seed,
    )


def play(model: TurnModel, turns: int, seed: int = 7) -> list[str]:
    env = StudioEnv(seed=seed)
    frame = env.reset()
    answers = []
    for _ in range(turns):
        content = [
            {"type": "image", "image": Image.fromarray(frame)},
            {"type": "text", "text": text_observation(env)},
        ]
        answers.append(model.reply(content))
        for action in actions_from_text(answers[-1]) or ["noop"]:
            frame, *_ = env.step(ACTION_INDEX[action])
    env.close()
    return answers


def token(processor, text: str) -> int:
    return processor.tokenizer.convert_tokens_to_ids(text)


def test_three_turns_are_the_processors_rendering_of_the_episode(loaded):
    _, processor = loaded
    model = turn_model(loaded)
    answers = play(model, 3)
    calls = {f"<tool_call>{tool_call_text(a)}</tool_call>" for a in ACTIONS}
    assert len(answers) == 3 and set(answers) <= calls  # special tokens kept
    assert [m["role"] for m in model.messages] == ["system"] + ["user", "assistant"] * 3
    assert len(model.images) == 3
    rendered = processor.apply_chat_template(
        model.messages, tools=[INTERACT_MANY_TOOL], tokenize=False
    )
    expected = processor(text=[rendered], images=model.images)["input_ids"][0]
    mine = model.prompt_ids + model.completion_ids
    # The rendering ends its last turn with a newline after the end-of-turn token.
    assert mine == expected[: len(mine)]
    assert expected[len(mine) :] == [token(processor, "\u010a")]
    pad = token(processor, "<|image_pad|>")
    assert model.prompt_ids.count(pad) == PADS_PER_FRAME
    assert mine.count(pad) == 3 * PADS_PER_FRAME
    first = processor.apply_chat_template(
        model.messages[:2], tools=[INTERACT_MANY_TOOL], add_generation_prompt=True, tokenize=False
    )
    assert first.endswith("<|im_start|>assistant\n")
    assert model.prompt_ids == processor(text=[first], images=model.images[:1])["input_ids"][0]
    # The model wrote each answer's four tokens; everything else of the completion (the
    # later user turns, frames included) is the environment's.
    opening = token(processor, "<tool_call>")
    completion = model.completion_ids
    starts = [i for i, t in enumerate(completion) if t == opening]
    assert len(starts) == 3 and starts[0] == 0
    mask = [0] * len(completion)
    for start in starts:
        mask[start : start + 4] = [1, 1, 1, 1]
    assert model.env_mask == mask
    assert completion[-1] == token(processor, "<|im_end|>")


def test_an_answer_cut_short_ends_with_an_end_of_turn_the_model_did_not_write(loaded):
    _, processor = loaded
    model = turn_model(loaded, max_answer_tokens=2)
    [answer] = play(model, 1)
    call = processor.tokenizer.convert_tokens_to_ids(tool_call_text(ACTIONS[0]))
    assert model.completion_ids[0] == token(processor, "<tool_call>")
    assert model.completion_ids[1] in {call, call + 1, call + 2, call + 3}
    assert model.completion_ids[2] == token(processor, "<|im_end|>")
    assert model.env_mask == [1, 1, 0]
    assert answer.startswith("<tool_call>{") and "</tool_call>" not in answer


def test_the_episodes_seed_decides_its_answers(loaded):
    model, _ = loaded
    model.train()
    first, again, other = (play(turn_model(loaded, seed=s), 6) for s in (11, 11, 12))
    assert first == again
    assert first != other
    assert model.training  # sampling put it back as it found it
