"""A GRPO TOML's reading: its GRPOConfig arguments, written out by hand, or one line each."""

from __future__ import annotations

import pytest

from training.config import config_load
from training.open_models.arguments import config_refusals
from training.open_models.grpo_arguments import (
    GrpoSettings,
    grpo_arguments,
    grpo_refusals,
    grpo_settings,
)

TOML = """
[job]
model = "tiny"

[training]
mode = "grpo"

[training.grpo]
group_size = 4
seeds_per_iteration = 8
steps_per_episode = 32
iterations = 50

[hyperparameters]
n_epochs = 1
"""


def grpo(**values) -> dict[str, dict]:
    sections = {
        "job": {"model": "tiny"},
        "training": {"mode": "grpo"},
        "training.grpo": {
            "group_size": 4,
            "seeds_per_iteration": 8,
            "steps_per_episode": 32,
            "iterations": 50,
        },
        "hyperparameters": {"n_epochs": 1},
    }
    for name, more in values.items():
        sections.setdefault(name.replace("__", "."), {}).update(more)
    return sections


def test_the_smallest_grpo_config_maps_with_the_defaults():
    sections = config_load(TOML).sections
    assert config_refusals(sections) == []
    assert grpo_settings(sections) == GrpoSettings(
        group_size=4,
        seeds_per_iteration=8,
        steps_per_episode=32,
        iterations=50,
        reward="crafter",
        kl_coef=0.0,
        first_seed=0,
        max_answer_tokens=64,
        temperature=1.0,
    )
    assert grpo_arguments(sections, output_dir="/scratch/ckpt") == {
        "output_dir": "/scratch/ckpt",
        "num_generations": 4,
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 8,
        "max_steps": 50,
        "learning_rate": 1e-6,
        "warmup_steps": 0.0,
        "weight_decay": 0.0,
        "beta": 0.0,
        "temperature": 1.0,
        "shuffle_dataset": False,
        "remove_unused_columns": False,
        "bf16": False,
        "fp16": False,
        "activation_checkpointing": False,
        "logging_steps": 1,
        "save_strategy": "steps",
        "save_steps": 1,
        "seed": 42,
        "report_to": "none",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }


def test_every_key_given_reaches_its_field():
    sections = grpo(
        training__grpo={
            "reward": "achievements: collect_wood , place_table",
            "kl_coef": 0.04,
            "first_seed": 1000,
            "max_answer_tokens": 128,
            "temperature": 0.7,
        },
        hyperparameters={
            "learning_rate": 3e-6,
            "warmup_ratio": 0.1,
            "weight_decay": 0.01,
            "save_steps": 5,
            "train_kind": "lora",
            "lora_r": 8,
        },
        hyperparameters__parallelism={"bf16": True, "activation_checkpointing": True},
    )
    assert config_refusals(sections) == []
    settings = grpo_settings(sections)
    assert settings.reward == "achievements:collect_wood,place_table"
    assert (settings.first_seed, settings.max_answer_tokens) == (1000, 128)
    arguments = grpo_arguments(sections, output_dir="/o")
    picked = {
        key: arguments[key]
        for key in (
            "learning_rate",
            "warmup_steps",
            "weight_decay",
            "beta",
            "temperature",
            "save_steps",
            "bf16",
            "activation_checkpointing",
        )
    }
    assert picked == {
        "learning_rate": 3e-6,
        "warmup_steps": 0.1,
        "weight_decay": 0.01,
        "beta": 0.04,
        "temperature": 0.7,
        "save_steps": 5,
        "bf16": True,
        "activation_checkpointing": True,
    }


def test_missing_keys_and_sft_keys_are_refused_one_line_each():
    sections = grpo(
        hyperparameters={
            "per_device_batch": 2,
            "gradient_accumulation_steps": 4,
            "batch_size": 8,
            "sequence_length": 4096,
            "max_steps": 10,
            "logging_steps": 5,
        },
        training__validation={"enabled": True},
        data={"validation_path": "crafter val"},
    )
    del sections["training.grpo"]["group_size"]
    del sections["training.grpo"]["iterations"]
    assert grpo_refusals(sections) == [
        '[training.grpo] group_size: required with mode = "grpo"',
        '[training.grpo] iterations: required with mode = "grpo"',
        "[hyperparameters] per_device_batch: a GRPO step is one group per device "
        "([training.grpo] group_size); remove it",
        "[hyperparameters] gradient_accumulation_steps: a GRPO step accumulates "
        "[training.grpo] seeds_per_iteration; remove it",
        "[hyperparameters] batch_size: a GRPO step is [training.grpo] seeds_per_iteration x "
        "group_size episodes; remove it",
        "[hyperparameters] sequence_length: GRPO episodes are bounded by [training.grpo] "
        "steps_per_episode; remove it",
        "[hyperparameters] max_steps: GRPO runs [training.grpo] iterations; remove it",
        "[hyperparameters] logging_steps: GRPO logs every iteration; remove it",
        "[training.validation]: GRPO plays its own episodes, there is no validation data; "
        "remove the section",
        "[data] validation_path: GRPO plays its own episodes; remove it",
    ]
    # config_refusals hands them on, and does not add the SFT batch line of its own.
    assert config_refusals(sections) == grpo_refusals(sections)


@pytest.mark.parametrize(
    ("grpo_keys", "line"),
    [
        (
            {"reward": "wood"},
            "[training.grpo] reward: 'wood' is not a reward; write 'crafter', 'score', "
            "'achievements:NAME,NAME' or 'action:NAME'",
        ),
        (
            {"reward": "action:fly"},
            "[training.grpo] reward: 'fly' is not a Crafter action",
        ),
        (
            {"temperature": 0.0},
            "[training.grpo] temperature: must be above 0 (a group needs sampled answers)",
        ),
    ],
)
def test_a_bad_reward_or_temperature_is_one_line(grpo_keys, line):
    assert config_refusals(grpo(training__grpo=grpo_keys)) == [line]


def test_a_grpo_config_without_its_section_says_what_it_needs():
    sections = grpo()
    del sections["training.grpo"]
    assert grpo_refusals(sections) == [
        '[training.grpo]: mode = "grpo" needs this section '
        "(group_size, seeds_per_iteration, steps_per_episode, iterations)"
    ]


def test_shared_checks_still_apply_to_grpo():
    sections = grpo(hyperparameters={"lora_r": 8}, compute={"nodes": 2})
    assert config_refusals(sections) == [
        "[compute] nodes: the trl provider trains on one machine; remove it or set 1",
        '[hyperparameters] lora_r: only for train_kind "lora" or "qlora"; remove it',
    ]


def test_the_arguments_build_a_real_grpo_config(tmp_path):
    from trl import GRPOConfig

    args = GRPOConfig(**grpo_arguments(grpo(), output_dir=str(tmp_path)))
    # One generation of every episode of an iteration, and one optimizer step from it.
    assert args.generation_batch_size == 32
    assert args.steps_per_generation == 8
    assert args.num_generations == 4
    assert args.beta == 0.0 and args.bf16 is False
    assert args.activation_checkpointing is False
