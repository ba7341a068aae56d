"""A GRPO `Player` for Django-free tests: Crafter played directly, nothing recorded.

Test scaffolding only: the product's player records every episode through the studio's
recorder. This one plays `StudioEnv` as the studio does (a seed's world, the text observation
and the frame each turn, the answer's actions read with the studio's own text reader, noop
when there are none), for up to `steps` of the game's steps an episode.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from rollouts.game.crafter_env import ACTION_INDEX, StudioEnv, text_observation
from rollouts.game.text_actions import actions_from_text
from training.open_models.grpo_play import EpisodeModel, IterationCanceled, PlayedEpisode
from training.open_models.tiny import build_tiny_vlm


@dataclass
class CrafterPlayer:
    # The game's steps an episode (a turn of several actions takes several), as the
    # product's player plays `steps_per_episode`.
    steps: int
    image_size: int = 64
    # Cancel asked before this iteration's second episode (None: never).
    cancel_in_iteration: int | None = None
    calls: list[tuple[int, int, tuple[tuple[int, int], ...]]] = field(default_factory=list)

    def play(
        self,
        *,
        iteration: int,
        checkpoint_step: int,
        episodes: Sequence[tuple[int, int]],
        model_for: Callable[[int, int], EpisodeModel],
    ) -> list[PlayedEpisode]:
        self.calls.append((iteration, checkpoint_step, tuple(episodes)))
        played = []
        for index, (seed, member) in enumerate(episodes):
            if index == 1 and iteration == self.cancel_in_iteration:
                raise IterationCanceled()
            played.append(self.episode(seed, member, model_for(seed, member)))
        return played

    def episode(self, seed: int, member: int, model: EpisodeModel) -> PlayedEpisode:
        env = StudioEnv(seed=seed, size=self.image_size)
        frame = env.reset()
        total, actions, steps, done = 0.0, [], 0, False
        while steps < self.steps and not done:
            # The text observation, then the frame: the order the product's policy sends.
            answer = model.reply(
                [
                    {"type": "text", "text": text_observation(env)},
                    {"type": "image", "image": Image.fromarray(frame)},
                ]
            )
            turn = []
            for action in (actions_from_text(answer) or ["noop"])[: self.steps - steps]:
                frame, reward, done, _ = env.step(ACTION_INDEX[action])
                total += reward
                steps += 1
                turn.append(action)
                if done:
                    break
            actions.append(tuple(turn))
        unlocked = tuple(env.unlocked())
        env.close()
        return PlayedEpisode(
            seed=seed,
            member=member,
            episode_id=None,
            model=model,
            crafter_reward=total,
            achievements=unlocked,
            actions=tuple(actions),
        )


def tool_call_text(action: str) -> str:
    """The studio's `interact_many` call of one action, one token of the choosing model."""
    return '{"name": "interact_many", "arguments": {"actions": ["' + action + '"]}}'


def choice_ids(processor: Any, actions: Sequence[str]) -> list[int]:
    return [processor.tokenizer.convert_tokens_to_ids(tool_call_text(a)) for a in actions]


def choosing_tiny_vlm(directory: Path, actions: Sequence[str]) -> Path:
    """A tiny Qwen2-VL whose every answer is `<tool_call>`, then one of `actions`' tool calls
    (one added token each), all with the same logit, then `</tool_call>` and the end of turn:
    the answer a Qwen model writes, which the policy's parser reads.

    Built as `training.tests.served_models.answering_tiny_vlm` builds its chain: the text
    layers add nothing to the residual stream (attention and MLP outputs zeroed), so the next
    token depends on the last one alone; each token's embedding is one axis and the output
    head maps that axis to the tokens that may follow. Training moves all of it."""
    import torch
    from transformers import AutoProcessor, Qwen2VLForConditionalGeneration

    build_tiny_vlm(directory)
    processor = AutoProcessor.from_pretrained(directory)
    tokenizer = processor.tokenizer
    tokenizer.add_tokens([tool_call_text(action) for action in actions])
    newline = tokenizer.convert_tokens_to_ids("\u010a")  # byte-level "\n": the prompt's last
    assert tokenizer.decode([newline]) == "\n"
    opening, closing, end = tokenizer.convert_tokens_to_ids(
        ["<tool_call>", "</tool_call>", "<|im_end|>"]
    )
    calls = choice_ids(processor, actions)
    model = Qwen2VLForConditionalGeneration.from_pretrained(directory)
    model.resize_token_embeddings(len(tokenizer))
    embed, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert embed.data_ptr() != head.data_ptr()
    axes = [newline, opening, *calls, closing]
    with torch.no_grad():
        for name, module in model.named_modules():
            if "language_model" in name and name.endswith(("o_proj", "down_proj")):
                module.weight.zero_()
                if module.bias is not None:
                    module.bias.zero_()
        head.zero_()
        for axis, token in enumerate(axes):
            embed[token] = 0.0
            # Large beside what the zeroed layers add once trained (RMSNorm removes the
            # scale): a few updates move the choice, not the whole residual stream.
            embed[token, axis] = 30.0
        head[opening, 0] = 50.0
        for axis, token in enumerate(calls, start=2):
            head[token, 1] = 5.0  # equal logits after `<tool_call>`
            head[closing, axis] = 50.0
        head[end, len(axes) - 1] = 50.0
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    return directory
