"""`run_grpo` for real: TRL's GRPOTrainer on the CPU, a tiny Qwen2-VL playing Crafter.

The model is the "choosing" tiny model (`grpo_players.choosing_tiny_vlm`): every answer is a
tool call of one of four actions, each as likely, so episodes differ and the reward
`action:move_left` (the share of move_left among the episode's actions) gives every group
advantages to learn from. The player plays `StudioEnv` directly (no database).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from PIL import Image

from rollouts.game.crafter_env import StudioEnv, text_observation
from rollouts.game.tools import INTERACT_MANY_TOOL, system_prompt
from training.open_models.grpo import GrpoSpec, run_grpo
from training.open_models.runner import TrainingRefused
from training.tests.grpo_players import (
    CrafterPlayer,
    choice_ids,
    choosing_tiny_vlm,
    tool_call_text,
)

ACTIONS = ("move_left", "noop", "do", "move_right")


@dataclass
class GrpoRecorder:
    """A GrpoSink that keeps what it is told; after `stop_after` steps it asks to stop."""

    stop_after: int | None = None
    events: list[tuple[str, str]] = field(default_factory=list)
    scored: dict[int, list] = field(default_factory=dict)
    logged: list[tuple[int, float | None, float | None]] = field(default_factory=list)
    checkpoints: list[tuple[int, list[str]]] = field(default_factory=list)
    resumed: list[int] = field(default_factory=list)
    steps_ended: int = 0

    def event(self, type, message, *, level="info", data=None):
        self.events.append((type, message))

    def should_stop(self):
        self.steps_ended += 1
        return self.stop_after is not None and self.steps_ended >= self.stop_after

    def checkpoint_saved(self, step, directory):
        self.checkpoints.append((step, sorted(p.name for p in Path(directory).iterdir())))

    def resuming(self, step):
        self.resumed.append(step)

    def iteration_scored(self, iteration, scored):
        self.scored[iteration] = list(scored)

    def iteration_logged(self, iteration, *, loss, kl):
        self.logged.append((iteration, loss, kl))

    def rewards(self, iteration: int) -> list[float]:
        return [s.reward for s in self.scored[iteration]]


def config(**grpo) -> dict[str, dict]:
    values = {
        "group_size": 2,
        "seeds_per_iteration": 2,
        "steps_per_episode": 8,
        "iterations": 2,
        "reward": "action:move_left",
        "max_answer_tokens": 8,
        **grpo,
    }
    return {
        "job": {"model": "tiny"},
        "training": {"mode": "grpo"},
        "training.grpo": values,
        "hyperparameters": {"n_epochs": 1, "learning_rate": 0.05},
    }


@pytest.fixture(scope="module")
def chooser(tmp_path_factory) -> Path:
    return choosing_tiny_vlm(tmp_path_factory.mktemp("chooser") / "model", ACTIONS)


@dataclass
class Run:
    sink: GrpoRecorder
    player: CrafterPlayer
    result: object
    work_dir: Path


def grpo_run(base: Path, work_dir: Path, sections, *, steps=8, sink=None, player=None, **kw):
    sink = sink or GrpoRecorder()
    player = player or CrafterPlayer(steps=steps)
    result = run_grpo(GrpoSpec(str(base), sections, work_dir), sink, player, **kw)
    return Run(sink, player, result, work_dir)


@pytest.fixture(scope="module")
def full_run(chooser, tmp_path_factory) -> Run:
    return grpo_run(chooser, tmp_path_factory.mktemp("full"), config())


def weights(directory: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(directory / "model.safetensors"))


def test_every_episode_reaches_the_sink_with_its_groups_advantages(full_run):
    assert full_run.result.status == "succeeded" and full_run.result.steps == 2
    # Iteration k plays seeds 2k-2 and 2k-1, two members each, in order.
    assert [call[:2] for call in full_run.player.calls] == [(1, 0), (2, 1)]
    for iteration, seeds in ((1, (0, 1)), (2, (2, 3))):
        scored = full_run.sink.scored[iteration]
        pairs = [(s.episode.seed, s.episode.member) for s in scored]
        assert pairs == [(seeds[0], 0), (seeds[0], 1), (seeds[1], 0), (seeds[1], 1)]
        for group in (scored[:2], scored[2:]):
            assert abs(sum(s.advantage for s in group)) < 1e-4
            if group[0].reward != group[1].reward:
                # Two members: (r - mean) / (std + 1e-4), the sample std of two being
                # |r1 - r2| / sqrt(2): +-1/sqrt(2) each, less the epsilon.
                assert sorted(abs(s.advantage) for s in group)[0] == pytest.approx(
                    1 / math.sqrt(2), abs=1e-3
                )
        for s in scored:
            executed = [a for turn in s.episode.actions for a in turn]
            assert len(s.episode.actions) == 8 and len(executed) == 8
            assert s.reward == pytest.approx(executed.count("move_left") / 8)
    advantages = [abs(s.advantage) for it in (1, 2) for s in full_run.sink.scored[it]]
    assert max(advantages) > 0.5, "no group had different rewards: nothing was learned"


def test_each_iteration_is_a_step_logged_and_checkpointed(full_run):
    assert [step for step, _, _ in full_run.sink.logged] == [1, 2]
    assert all(loss is not None and math.isfinite(loss) for _, loss, _ in full_run.sink.logged)
    assert [step for step, _ in full_run.sink.checkpoints] == [1, 2]
    for _, names in full_run.sink.checkpoints:
        assert {"model.safetensors", "optimizer.pt", "trainer_state.json"} <= set(names)
    assert [t for t, _ in full_run.sink.events] == ["started", "finished"]


def test_the_weights_change_and_the_model_is_saved_with_its_card(full_run, chooser):
    model_dir = full_run.result.model_dir
    before, after = weights(chooser), weights(model_dir)
    assert before.keys() == after.keys()
    assert any(not before[key].equal(after[key]) for key in before)
    card = (model_dir / "README.md").read_text()
    assert "GRPOTrainer" in card and "`action:move_left`" in card
    assert "Iterations run (one optimizer step each): 2" in card
    assert "Seeds played: 0 to 3, 2 episodes each, at most 8 game steps an episode" in card
    assert (model_dir / "tokenizer.json").is_file()


def test_cancel_after_the_first_iteration_ends_at_step_one(chooser, tmp_path):
    run = grpo_run(
        chooser, tmp_path, config(steps_per_episode=2), steps=2, sink=GrpoRecorder(stop_after=1)
    )
    assert run.result.status == "canceled" and run.result.steps == 1
    assert run.result.model_dir is None
    assert [call[0] for call in run.player.calls] == [1]
    assert list(run.sink.scored) == [1]
    assert run.sink.checkpoints == []  # nothing after the step Cancel was seen at
    assert run.sink.events[-1] == ("canceled", "canceled after iteration 1")


def test_cancel_between_episodes_ends_the_run(chooser, tmp_path):
    player = CrafterPlayer(steps=2, cancel_in_iteration=2)
    run = grpo_run(chooser, tmp_path, config(steps_per_episode=2), player=player)
    assert run.result.status == "canceled" and run.result.steps == 1
    assert list(run.sink.scored) == [1]
    assert not (tmp_path / "model").exists()


def test_resuming_from_step_one_equals_the_uninterrupted_run(full_run, chooser, tmp_path):
    checkpoint = full_run.work_dir / "checkpoints" / "checkpoint-1"
    run = grpo_run(chooser, tmp_path, config(), resume_from=checkpoint)
    assert run.result.status == "succeeded" and run.result.steps == 2
    assert run.sink.resumed == [1]
    assert [call[:2] for call in run.player.calls] == [(2, 1)]
    assert run.sink.rewards(2) == full_run.sink.rewards(2)
    resumed, uninterrupted = weights(run.result.model_dir), weights(full_run.result.model_dir)
    for key, value in uninterrupted.items():
        assert (resumed[key] - value).abs().max().item() < 1e-5, key


def test_a_config_grpo_cannot_run_is_refused_before_any_episode(chooser, tmp_path):
    sections = config()
    del sections["training.grpo"]["iterations"]
    sections["hyperparameters"]["per_device_batch"] = 4
    player = CrafterPlayer(steps=1)
    with pytest.raises(TrainingRefused) as refused:
        grpo_run(chooser, tmp_path, sections, player=player)
    assert refused.value.lines == [
        '[training.grpo] iterations: required with mode = "grpo"',
        "[hyperparameters] per_device_batch: a GRPO step is one group per device "
        "([training.grpo] group_size); remove it",
    ]
    assert player.calls == []


def choice_probabilities(model_dir: Path, actions=ACTIONS) -> list[float]:
    """The model's probability of each action's call at the choice position (after
    `<tool_call>`) of a first turn, from its logits."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    env = StudioEnv(seed=1000)
    frame = Image.fromarray(env.reset())
    messages = [
        {"role": "system", "content": system_prompt(observation_mode="image_text")},
        {
            "role": "user",
            "content": [
                {"type": "image", "image": frame},
                {"type": "text", "text": text_observation(env)},
            ],
        },
    ]
    text = processor.apply_chat_template(
        messages, tools=[INTERACT_MANY_TOOL], add_generation_prompt=True, tokenize=False
    )
    encoded = processor(text=[text + "<tool_call>"], images=[frame], return_tensors="pt")
    with torch.no_grad():
        logits = model(**encoded).logits[0, -1]
    probabilities = logits.softmax(-1)
    return [probabilities[i].item() for i in choice_ids(processor, actions)]


def test_sanity_grpo_learns_to_choose_the_rewarded_action(chooser, tmp_path):
    before = choice_probabilities(chooser)
    assert before == pytest.approx([0.25] * 4, abs=1e-4)  # four equal logits
    sections = config(group_size=8, steps_per_episode=2, iterations=5)
    run = grpo_run(chooser, tmp_path, sections, steps=2)
    assert run.result.status == "succeeded" and run.result.steps == 5
    after = choice_probabilities(run.result.model_dir)
    assert after[0] > 0.5, after
    assert max(after[1:]) < 0.2, after
    # Its sampled share: the reward is the share of move_left among an episode's actions.
    first, last = (sum(run.sink.rewards(i)) / 16 for i in (1, 5))
    assert last - first > 0.3, (first, last)
    answers = [answer for s in run.sink.scored[5] for answer in s.episode.model.answers]
    assert answers and all(
        answer in {f"<tool_call>{tool_call_text(a)}</tool_call>" for a in ACTIONS}
        for answer in answers
    )


def test_every_frame_of_an_episode_reaches_the_forward_pass(chooser, tmp_path, monkeypatch):
    import torch

    import training.open_models.grpo as grpo_module

    seen = []
    built = grpo_module.grpo_trainer_class

    def watched():
        class Watched(built()):
            def _generate_and_score_completions(self, inputs):
                output = super()._generate_and_score_completions(inputs)
                seen.append(output)
                return output

        return Watched

    monkeypatch.setattr(grpo_module, "grpo_trainer_class", watched)
    sections = config(steps_per_episode=3, iterations=1, seeds_per_iteration=1)
    run = grpo_run(chooser, tmp_path, sections, steps=3)
    assert run.result.status == "succeeded"
    [output] = seen
    # Two episodes of three turns: three frames each, 4 image tokens a frame (a 64 x 64
    # frame becomes 56 x 56: 4 x 4 patches of 14 pixels, merged 2 x 2).
    assert output["num_images"] == [3, 3]
    assert output["image_grid_thw"].tolist() == [[1, 4, 4]] * 6
    assert output["pixel_values"].shape[0] == 6 * 16
    tokens = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
    pad = output["mm_token_type_ids"]
    assert pad.shape == tokens.shape
    assert pad.sum(dim=1).tolist() == [12, 12]


def test_a_lora_run_with_a_kl_term_saves_the_merged_model_and_its_adapter(chooser, tmp_path):
    sections = config(steps_per_episode=2, iterations=1, kl_coef=0.04)
    sections["hyperparameters"].update(train_kind="lora", learning_rate=0.01)
    run = grpo_run(chooser, tmp_path, sections, steps=2)
    assert run.result.status == "succeeded" and run.result.steps == 1
    [(step, _, kl)] = run.sink.logged
    assert step == 1 and kl is not None and math.isfinite(kl)
    model_dir = run.result.model_dir
    assert (model_dir / "adapter" / "adapter_model.safetensors").is_file()
    assert weights(model_dir).keys() == weights(chooser).keys()  # merged: no LoRA keys left
    assert "(merged into these weights" in (model_dir / "README.md").read_text()
