"""One GRPO run of the trl provider: TRL's GRPOTrainer, the model playing Crafter episodes.

Django-free: the train worker gives a `GrpoSpec`, a `GrpoSink` and a `Player`
(`training.open_models.grpo_play`) and gets a `TrainResult`. Torch, transformers, TRL and
PEFT are imported inside the functions (the `.[train]` extra).

- The trainer's rows are seeds: `iterations x seeds_per_iteration` of them, in order, which
  TRL's sampler repeats `group_size` times each, unshuffled. Iteration k (its step k) plays
  the k-th `seeds_per_iteration` seeds, `group_size` episodes each (a member is its place in
  its group), and makes one optimizer step from them.
- TRL's `rollout_func` hands the episodes to the player: each is played by a
  `grpo_turns.TurnModel` on the trainer's own model, whose tokens (the first turn as the
  prompt, answers and later user turns as the completion, the env mask telling them apart)
  are what the update scores. The reward is the TOML's (`rewards`), TRL computes the group
  advantages, and the sink gets every episode with both before the update.
- Cancel, checkpoints, resuming and the saved model are `runner.py`'s; the card says the
  model learned from its own episodes, under which reward.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollouts.game.tools import INTERACT_MANY_TOOL, system_prompt
from training.config import config_is_grpo
from training.open_models.arguments import (
    config_refusals,
    deepspeed_config,
    runtime_refusals,
    train_kind,
)
from training.open_models.card import GrpoCardFacts, grpo_card_text
from training.open_models.grpo_arguments import (
    GrpoSettings,
    grpo_arguments,
    grpo_settings,
)
from training.open_models.grpo_play import (
    GrpoSink,
    IterationCanceled,
    PlayedEpisode,
    Player,
    ScoredEpisode,
)
from training.open_models.grpo_trainer import grpo_trainer_class, sink_callback
from training.open_models.grpo_turns import TurnModel
from training.open_models.rewards import RewardSpec, episode_reward, parse_reward
from training.open_models.runner import (
    TrainingRefused,
    TrainResult,
    _has_cuda,
    _is_local,
    _model,
    _peft_config,
    _save,
)

PLACEHOLDER_PROMPT = [{"role": "user", "content": "Play Crafter."}]


@dataclass(frozen=True)
class GrpoSpec:
    base_model: str  # a Hugging Face model id or a local directory
    sections: dict[str, dict]  # the job's effective config (`[training] mode = "grpo"`)
    work_dir: Path  # local scratch: checkpoints are written here by the Trainer


class EpisodeRun:
    """What the trainer's rollout needs of the run: the player, the reward, the models."""

    def __init__(
        self,
        *,
        player: Player,
        sink: GrpoSink,
        settings: GrpoSettings,
        reward: RewardSpec,
        processor: Any,
        seed: int,
    ) -> None:
        self.player = player
        self.sink = sink
        self.settings = settings
        self.reward = reward
        self.processor = processor
        self.seed = seed
        self.system_prompt = system_prompt(observation_mode="image_text", history_frames=0)
        self.played: list[PlayedEpisode] = []
        self.rewards: list[float] = []

    def episodes(self, seeds: list[int]) -> list[tuple[int, int]]:
        """(seed, member) pairs of a generation batch: each seed `group_size` times in a row."""
        size = self.settings.group_size
        pairs = [(int(seed), index % size) for index, seed in enumerate(seeds)]
        if len(pairs) % size or any(
            pairs[i][0] != pairs[i - i % size][0] for i in range(len(pairs))
        ):
            raise RuntimeError(f"the trainer's batch is not groups of {size} equal seeds: {seeds}")
        return pairs

    def play(self, trainer: Any, seeds: list[int]) -> dict[str, Any]:
        """Play one iteration's episodes with the trainer's model: TRL's rollout output."""
        step = int(trainer.state.global_step)
        iteration = step + 1
        model = trainer.accelerator.unwrap_model(trainer.model)

        def model_for(seed: int, member: int) -> TurnModel:
            return TurnModel(
                model=model,
                processor=self.processor,
                system_prompt=self.system_prompt,
                tool=INTERACT_MANY_TOOL,
                max_answer_tokens=self.settings.max_answer_tokens,
                temperature=self.settings.temperature,
                seed=_episode_seed(self.seed, iteration, seed, member),
            )

        wanted = self.episodes(seeds)
        played = self.player.play(
            iteration=iteration, checkpoint_step=step, episodes=wanted, model_for=model_for
        )
        got = [(episode.seed, episode.member) for episode in played]
        if got != wanted:
            raise RuntimeError(f"the player returned episodes {got[:8]}, not {wanted[:8]}")
        for episode in played:
            if not isinstance(episode.model, TurnModel) or not episode.model.turns:
                raise RuntimeError(f"episode (seed {episode.seed}) has no turn of the model")
        self.played = list(played)
        self.rewards = [
            episode_reward(
                self.reward,
                crafter_reward=episode.crafter_reward,
                achievements=episode.achievements,
                actions=episode.actions,
            )
            for episode in played
        ]
        return {
            "prompt_ids": [list(e.model.prompt_ids) for e in played],
            "completion_ids": [list(e.model.completion_ids) for e in played],
            "logprobs": None,  # accepted without vLLM: the trainer scores the tokens itself
            "env_mask": [list(e.model.env_mask) for e in played],
            "episode_reward": list(self.rewards),
        }

    def scored(self, iteration: int, advantages: list[float]) -> None:
        scored = [
            ScoredEpisode(episode=episode, reward=reward, advantage=float(advantage))
            for episode, reward, advantage in zip(
                self.played, self.rewards, advantages, strict=True
            )
        ]
        self.sink.iteration_scored(iteration, scored)


def _episode_seed(run_seed: int, iteration: int, seed: int, member: int) -> int:
    """An episode's sampling seed: the same episode of the same iteration samples the same."""
    value = 0
    for part in (run_seed, iteration, seed, member):
        value = (value * 1_000_003 + int(part)) % (2**31 - 1)
    return value


def _rows(settings: GrpoSettings) -> list[dict[str, Any]]:
    count = settings.iterations * settings.seeds_per_iteration
    return [{"prompt": PLACEHOLDER_PROMPT, "seed": settings.first_seed + i} for i in range(count)]


def run_grpo(
    spec: GrpoSpec, sink: GrpoSink, player: Player, *, resume_from: Path | None = None
) -> TrainResult:
    """Train `spec` with TRL's GRPOTrainer on episodes `player` plays; TrainingRefused (one
    line each) before any episode when the config cannot be honoured here."""
    refused = [] if config_is_grpo(spec.sections) else ['[training] mode: run_grpo needs "grpo"']
    refused += config_refusals(spec.sections) + runtime_refusals(spec.sections)
    if refused:
        raise TrainingRefused(refused)
    import datasets  # the train extra
    from transformers import AutoProcessor
    from trl import GRPOConfig

    kind = train_kind(spec.sections)
    settings = grpo_settings(spec.sections)
    processor = AutoProcessor.from_pretrained(
        spec.base_model, local_files_only=_is_local(spec.base_model)
    )
    arguments = grpo_arguments(spec.sections, output_dir=str(spec.work_dir / "checkpoints"))
    parallelism = spec.sections.get("hyperparameters.parallelism", {})
    if parallelism.get("use_deepspeed"):
        arguments["deepspeed"] = deepspeed_config(int(parallelism.get("deepspeed_stage", 2)))
    # Pinned memory only helps a GPU; on a CPU worker it is a warning per run.
    arguments["dataloader_pin_memory"] = _has_cuda()
    run = EpisodeRun(
        player=player,
        sink=sink,
        settings=settings,
        reward=parse_reward(settings.reward),
        processor=processor,
        seed=arguments["seed"],
    )
    callback = sink_callback(sink)
    trainer = grpo_trainer_class()(
        run,
        model=_model(spec, kind, resume_from=resume_from),
        args=GRPOConfig(**arguments),
        train_dataset=datasets.Dataset.from_list(_rows(settings)),
        processing_class=processor,
        peft_config=_peft_config(spec.sections) if kind in ("lora", "qlora") else None,
        callbacks=[callback],
    )
    try:
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    except IterationCanceled:
        callback.canceled = True
    steps = int(trainer.state.global_step)
    if callback.canceled:
        sink.event("canceled", f"canceled after iteration {steps}")
        return TrainResult("canceled", None, steps, callback.last_loss)
    last_seed = settings.first_seed + steps * settings.seeds_per_iteration - 1
    facts = GrpoCardFacts(
        base_model=spec.base_model,
        train_kind=kind,
        reward=settings.reward,
        iterations=steps,
        seeds=f"{settings.first_seed} to {last_seed}",
        group_size=settings.group_size,
        steps_per_episode=settings.steps_per_episode,
        kl_coef=settings.kl_coef,
        last_loss=callback.last_loss,
        sections=spec.sections,
        arguments={k: v for k, v in arguments.items() if k != "output_dir"},
        resumed_from_step=callback.start_step if resume_from else None,
        merged=kind == "lora",
    )
    model_dir = _save(
        trainer,
        processor,
        spec.work_dir / "model",
        kind=kind,
        card=grpo_card_text(facts),
        best=None,
    )
    sink.event("finished", f"trained {steps} iterations; model saved", data={"steps": steps})
    return TrainResult("succeeded", model_dir, steps, callback.last_loss)
