"""The model card (README.md) of a model the trl provider trained. Pure.

It says what happened, not what was asked: the steps and epochs actually run, the rows the
run could have seen, whether it resumed, what it validated on (or that it did not), beside
the dataset version's label and sha256, the base model and every setting used.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

MAX_LABEL = 300


@dataclass(frozen=True)
class CardFacts:
    base_model: str
    dataset_label: str
    dataset_sha256: str
    train_kind: str  # "fft", "lora" or "qlora"
    train_rows: int
    steps: int
    epochs: float  # as the Trainer counts them (fractional when a run stops mid-epoch)
    rows_per_step: int
    train_loss: float | None
    validation: str  # what was validated on, or why nothing was
    validation_loss: float | None
    sections: dict[str, dict[str, Any]]  # the job's TOML, as given
    arguments: dict[str, Any]  # the SFTConfig arguments it became
    resumed_from_step: int | None = None
    merged: bool = False  # LoRA merged into the weights beside its adapter
    notes: list[str] = field(default_factory=list)


def _clean(text: Any, limit: int = MAX_LABEL) -> str:
    """Text from a job's config or a dataset's name, one line, no markup that breaks out."""
    value = " ".join(str(text).split())[:limit]
    return value.replace("`", "'").replace("<", "&lt;").replace("---", "- - -")


def _number(value: float | None) -> str:
    return "not logged" if value is None else f"{value:.6g}"


def card_text(facts: CardFacts) -> str:
    """The README.md: a YAML header the Hub reads, then what was trained, on what, how."""
    header = {
        "base_model": _clean(facts.base_model),
        "library_name": "peft" if facts.train_kind in ("lora", "qlora") else "transformers",
        "tags": ["trl", "sft", facts.train_kind, "crafter"],
    }
    seen = min(facts.steps * facts.rows_per_step, int(facts.epochs * facts.train_rows + 0.5))
    lines = ["---"]
    lines += [f"{key}: {json.dumps(value)}" for key, value in header.items()]
    lines += [
        "---",
        "",
        f"# {_clean(facts.dataset_label)}: {facts.train_kind} of {_clean(facts.base_model)}",
        "",
        "Trained by the studio's trl provider (TRL's SFTTrainer) on the Hugging Face export of",
        "one dataset version:",
        "",
        f"- Dataset: {_clean(facts.dataset_label)}",
        f"- Export sha256: `{_clean(facts.dataset_sha256, 64)}`",
        f"- Base model: `{_clean(facts.base_model)}`",
        f"- Training: {facts.train_kind}"
        + (
            " (merged into these weights; the adapter alone is in `adapter/`)"
            if facts.merged
            else ""
        ),
        f"- Train rows in the export: {facts.train_rows}",
        f"- Optimizer steps run: {facts.steps}"
        + (
            f" (resumed from the checkpoint of step {facts.resumed_from_step})"
            if facts.resumed_from_step is not None
            else ""
        ),
        f"- Epochs run: {facts.epochs:.3g} (rows per step: {facts.rows_per_step}; "
        f"rows seen, at most: {seen})",
        f"- Last logged training loss: {_number(facts.train_loss)}",
        f"- Validation: {_clean(facts.validation)}",
        f"- Last validation loss: {_number(facts.validation_loss)}",
    ]
    lines += [f"- {_clean(note)}" for note in facts.notes]
    return "\n".join(lines + _settings(facts.sections, facts.arguments, "SFTConfig"))


def _settings(sections: dict, arguments: dict, config_class: str) -> list[str]:
    """The card's last part: the TOML as given and the trainer's arguments it became."""
    return [
        "",
        "## Settings",
        "",
        "The job's config (TOML sections, as given):",
        "",
        "```json",
        _clean_json(sections),
        "```",
        "",
        f"The {config_class} arguments they became:",
        "",
        "```json",
        _clean_json(arguments),
        "```",
        "",
    ]


def _clean_json(value: Any) -> str:
    text = json.dumps(value, indent=2, sort_keys=True, default=str, ensure_ascii=True)
    return text.replace("`", "'")


@dataclass(frozen=True)
class GrpoCardFacts:
    """What the card of a GRPO run says: it learned from its own episodes, not a dataset."""

    base_model: str
    train_kind: str  # "fft", "lora" or "qlora"
    reward: str  # the reward's TOML text (`training.open_models.rewards`)
    iterations: int  # optimizer steps run (one per iteration)
    seeds: str  # the seeds played, e.g. "0 to 7"
    group_size: int
    steps_per_episode: int
    kl_coef: float
    last_loss: float | None
    sections: dict[str, dict[str, Any]]
    arguments: dict[str, Any]  # the GRPOConfig arguments
    resumed_from_step: int | None = None
    merged: bool = False


def grpo_card_text(facts: GrpoCardFacts) -> str:
    """The README.md of a GRPO run's model."""
    header = {
        "base_model": _clean(facts.base_model),
        "library_name": "peft" if facts.train_kind in ("lora", "qlora") else "transformers",
        "tags": ["trl", "grpo", facts.train_kind, "crafter"],
    }
    resumed = (
        f" (resumed from the checkpoint of step {facts.resumed_from_step})"
        if facts.resumed_from_step is not None
        else ""
    )
    lines = ["---"]
    lines += [f"{key}: {json.dumps(value)}" for key, value in header.items()]
    lines += [
        "---",
        "",
        f"# GRPO on Crafter: {facts.train_kind} of {_clean(facts.base_model)}",
        "",
        "Trained by the studio's trl provider with TRL's GRPOTrainer on episodes of Crafter",
        "it played itself, each iteration's episodes compared within their seed's group:",
        "",
        f"- Base model: `{_clean(facts.base_model)}`",
        f"- Training: {facts.train_kind}"
        + (
            " (merged into these weights; the adapter alone is in `adapter/`)"
            if facts.merged
            else ""
        ),
        f"- Reward: `{_clean(facts.reward)}`",
        f"- Iterations run (one optimizer step each): {facts.iterations}{resumed}",
        f"- Seeds played: {_clean(facts.seeds)}, {facts.group_size} episodes each, "
        f"at most {facts.steps_per_episode} game steps an episode",
        f"- KL coefficient: {facts.kl_coef:g}",
        f"- Last logged loss: {_number(facts.last_loss)}",
    ]
    return "\n".join(lines + _settings(facts.sections, facts.arguments, "GRPOConfig"))
