"""TRL's GRPOTrainer made to train on Crafter episodes, and the callback speaking to the sink.

Both are built inside functions: TRL and transformers are imported lazily (the `.[train]`
extra). `training.open_models.grpo` runs them.

TRL's `rollout_func` gets only the prompts, and its multimodal path takes the images from
dataset columns fixed before the rollout, while Crafter's frames appear during it. So:

- `_generate_and_score_completions` keeps its batch's rows (their seeds) for the rollout, and
  after TRL has scored them hands every episode's reward and advantage to the sink;
- `_generate` replaces, in the caller's own list, each placeholder prompt by its episode's
  whole conversation, and returns its frames as the images: TRL then renders those
  conversations through the processor, whose pixel values and `image_grid_thw` hold every
  frame of the episode, in order, matching the image tokens of its prompt and completion;
- the image tokens (`mm_token_type_ids`, which Qwen2-VL's multimodal positions read) are
  marked from the scored tokens themselves, in the batch and in every forward pass: TRL
  builds them from that rendering, as wide as the whole conversation's text and not as the
  prompt it expects, so they would not line up with the tokens.

Checked with the tiny Qwen2-VL: an iteration of 4 episodes of 3 turns gives the forward pass
12 frames' pixel values and grids, 4 image tokens of each frame in each episode's tokens,
and Qwen2-VL's own check that image tokens and image features agree passes.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from training.open_models.grpo_play import GrpoSink
from training.open_models.runner import finite_or_none


def episode_reward(prompts: Any, completions: Any, episode_reward: list[float], **kwargs):
    """TRL's reward function: the reward the rollout computed for each episode."""
    return [float(value) for value in episode_reward]


def _rollout(prompts: list, trainer: Any) -> dict[str, Any]:
    seeds = [row["seed"] for row in trainer.crafter_rows]
    if len(seeds) != len(prompts):
        raise RuntimeError(f"{len(prompts)} prompts for {len(seeds)} seeds")
    return trainer.crafter_run.play(trainer, seeds)


def grpo_trainer_class() -> type:
    import torch  # the train extra
    from trl import GRPOTrainer

    class CrafterGRPOTrainer(GRPOTrainer):
        def __init__(self, run: Any, **kwargs: Any) -> None:
            self.crafter_run = run
            self.crafter_rows: list[dict[str, Any]] = []
            with warnings.catch_warnings():
                # Its warning that rollout_func is experimental, once per run: known here.
                warnings.filterwarnings("ignore", message=".*rollout_func.*experimental")
                super().__init__(reward_funcs=[episode_reward], rollout_func=_rollout, **kwargs)
            self._image_token_id = self.processing_class.tokenizer.convert_tokens_to_ids(
                "<|image_pad|>"
            )

        def _generate_and_score_completions(self, inputs):
            self.crafter_rows = list(inputs)
            iteration = self.state.global_step + 1
            output = super()._generate_and_score_completions(inputs)
            if "mm_token_type_ids" in output:
                tokens = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
                output["mm_token_type_ids"] = (tokens == self._image_token_id).long()
            self.crafter_run.scored(iteration, output["advantages"].tolist())
            return output

        def _generate(self, prompts):
            result = list(super()._generate(prompts))
            played = self.crafter_run.played
            # The caller renders these for its forward pass's pixel values (see above).
            prompts[:] = [list(episode.model.messages) for episode in played]
            result[6] = [list(episode.model.images) for episode in played]
            return tuple(result)

        def _get_per_token_logps_and_entropies(self, model, input_ids, *args, **kwargs):
            if kwargs.get("mm_token_type_ids") is not None:
                kwargs["mm_token_type_ids"] = (input_ids == self._image_token_id).long()
            return super()._get_per_token_logps_and_entropies(model, input_ids, *args, **kwargs)

    return CrafterGRPOTrainer


def sink_callback(sink: GrpoSink) -> Any:
    """A TrainerCallback speaking to the sink: Cancel after every iteration, its loss and
    KL, its checkpoints, and a resumed run's step."""
    from transformers import TrainerCallback  # the train extra

    class GrpoSinkCallback(TrainerCallback):
        def __init__(self) -> None:
            self.canceled = False
            self.start_step = 0
            self.last_loss: float | None = None

        def on_train_begin(self, args, state, control, **kwargs):
            self.start_step = state.global_step
            if state.global_step:
                sink.resuming(state.global_step)
                sink.event(
                    "resumed", f"resumed at iteration {state.global_step} of {state.max_steps}"
                )
            sink.event(
                "started",
                f"training {state.max_steps} iterations",
                data={"steps": state.max_steps},
            )

        def on_step_end(self, args, state, control, **kwargs):
            if sink.should_stop():
                self.canceled = True
                # Nothing more after this step: no checkpoint, no next iteration.
                control.should_training_stop = True
                control.should_evaluate = False
                control.should_save = False

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = logs or {}
            if "loss" not in logs:
                return
            loss = finite_or_none(logs.get("loss"))
            if loss is None:
                sink.event(
                    "warning",
                    f"the loss is not a number at step {state.global_step}",
                    level="warning",
                )
            self.last_loss = loss if loss is not None else self.last_loss
            sink.iteration_logged(state.global_step, loss=loss, kl=finite_or_none(logs.get("kl")))

        def on_save(self, args, state, control, **kwargs):
            directory = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            sink.checkpoint_saved(state.global_step, directory)

    return GrpoSinkCallback()
