"""A GRPO run's TOML (`[training] mode = "grpo"`) as TRL `GRPOConfig` arguments. Pure.

`[training.grpo]` says how episodes are played: each iteration plays `seeds_per_iteration`
seeds, `group_size` episodes each, and makes one optimizer step from them (one generation
per step: `gradient_accumulation_steps` is the seeds of an iteration, the per-device batch
one group). The learning rate, `train_kind` and the LoRA keys come from `[hyperparameters]`
as for SFT. The SFT batch and length keys and `[training.validation]` have no meaning here
and are refused with one line each; `[hyperparameters] n_epochs` is required by every config
and is ignored (a GRPO run lasts `iterations`).

`training.open_models.arguments.config_refusals` hands a GRPO config's keys to
`grpo_refusals`; the shared checks (compute, parallelism, LoRA keys) stay there, as does
the DeepSpeed config `training.open_models.grpo` adds (this module imports nothing of it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from training.open_models.rewards import DEFAULT_REWARD, parse_reward

SECTION = "training.grpo"
REQUIRED = ("group_size", "seeds_per_iteration", "steps_per_episode", "iterations")
# TRL 1.16 GRPOConfig's own default beta: no reference model, no KL term.
DEFAULT_KL_COEF = 0.0
DEFAULT_LEARNING_RATE = 1e-6  # TRL's GRPO default: RL updates are far smaller than SFT's
DEFAULT_SAVE_STEPS = 1  # a checkpoint per iteration
DEFAULT_SEED = 42
# SFT keys a GRPO run has no use for, and why.
_SFT_ONLY = {
    "per_device_batch": "a GRPO step is one group per device ([training.grpo] group_size)",
    "gradient_accumulation_steps": "a GRPO step accumulates [training.grpo] seeds_per_iteration",
    "batch_size": "a GRPO step is [training.grpo] seeds_per_iteration x group_size episodes",
    "sequence_length": "GRPO episodes are bounded by [training.grpo] steps_per_episode",
    "max_steps": "GRPO runs [training.grpo] iterations",
    "logging_steps": "GRPO logs every iteration",
}


@dataclass(frozen=True)
class GrpoSettings:
    group_size: int
    seeds_per_iteration: int
    steps_per_episode: int
    iterations: int
    reward: str = DEFAULT_REWARD
    kl_coef: float = DEFAULT_KL_COEF
    first_seed: int = 0
    max_answer_tokens: int = 64
    temperature: float = 1.0

    @property
    def episodes_per_iteration(self) -> int:
        return self.group_size * self.seeds_per_iteration


def _line(section: str, key: str, message: str) -> str:
    return f"[{section}] {key}: {message}"


def grpo_settings(sections: dict[str, dict]) -> GrpoSettings:
    """The `[training.grpo]` keys, defaults filled in (for a config grpo_refusals accepted)."""
    grpo = sections.get(SECTION, {})
    defaults = GrpoSettings(1, 1, 1, 1)
    return GrpoSettings(
        group_size=int(grpo["group_size"]),
        seeds_per_iteration=int(grpo["seeds_per_iteration"]),
        steps_per_episode=int(grpo["steps_per_episode"]),
        iterations=int(grpo["iterations"]),
        reward=parse_reward(grpo.get("reward")).text,
        kl_coef=float(grpo.get("kl_coef", defaults.kl_coef)),
        first_seed=int(grpo.get("first_seed", defaults.first_seed)),
        max_answer_tokens=int(grpo.get("max_answer_tokens", defaults.max_answer_tokens)),
        temperature=float(grpo.get("temperature", defaults.temperature)),
    )


def grpo_refusals(sections: dict[str, dict]) -> list[str]:
    """One line per GRPO setting missing or meaningless; empty: `grpo_arguments` maps it."""
    grpo = sections.get(SECTION)
    if grpo is None:
        return [f'[{SECTION}]: mode = "grpo" needs this section ({", ".join(REQUIRED)})']
    lines = [
        _line(SECTION, key, 'required with mode = "grpo"') for key in REQUIRED if key not in grpo
    ]
    try:
        parse_reward(grpo.get("reward"))
    except ValueError as exc:
        lines.append(_line(SECTION, "reward", str(exc)))
    if "temperature" in grpo and grpo["temperature"] <= 0:
        lines.append(
            _line(SECTION, "temperature", "must be above 0 (a group needs sampled answers)")
        )
    hp = sections.get("hyperparameters", {})
    for key, why in _SFT_ONLY.items():
        if key in hp:
            lines.append(_line("hyperparameters", key, f"{why}; remove it"))
    if "training.validation" in sections:
        lines.append(
            "[training.validation]: GRPO plays its own episodes, there is no validation data; "
            "remove the section"
        )
    if "validation_path" in sections.get("data", {}):
        lines.append(_line("data", "validation_path", "GRPO plays its own episodes; remove it"))
    return lines


def grpo_arguments(sections: dict[str, dict], *, output_dir: str) -> dict[str, Any]:
    """The GRPOConfig keyword arguments for a config grpo_refusals accepted."""
    settings = grpo_settings(sections)
    hp = sections.get("hyperparameters", {})
    parallelism = sections.get("hyperparameters.parallelism", {})
    args: dict[str, Any] = {
        "output_dir": output_dir,
        "num_generations": settings.group_size,
        "per_device_train_batch_size": settings.group_size,
        # One generation (all of an iteration's episodes) and one optimizer step per iteration.
        "gradient_accumulation_steps": settings.seeds_per_iteration,
        "max_steps": settings.iterations,
        "learning_rate": float(hp.get("learning_rate", DEFAULT_LEARNING_RATE)),
        "warmup_steps": float(hp.get("warmup_ratio", 0.0)),
        "weight_decay": float(hp.get("weight_decay", 0.0)),
        "beta": settings.kl_coef,
        "temperature": settings.temperature,
        # Iteration k plays the seeds after iteration k - 1's, in order.
        "shuffle_dataset": False,
        # The rows' `seed` column reaches the rollout.
        "remove_unused_columns": False,
        # Written out: TRL's own defaults turn both on, which nobody asked for.
        "bf16": bool(parallelism.get("bf16", False)),
        "fp16": bool(parallelism.get("fp16", False)),
        "activation_checkpointing": bool(parallelism.get("activation_checkpointing", False)),
        "logging_steps": 1,
        "save_strategy": "steps",
        "save_steps": int(hp.get("save_steps", DEFAULT_SAVE_STEPS)),
        "seed": int(sections.get("job", {}).get("seed", DEFAULT_SEED)),
        "report_to": "none",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }
    return args
