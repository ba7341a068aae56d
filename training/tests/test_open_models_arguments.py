"""The trl provider's reading of the TOML: each setting's SFTConfig field, or its one line."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch

from training.config import SCHEMA, config_load, reference_text, schema_add, schema_remove
from training.open_models.arguments import (
    TRL_CONFIG_KEYS,
    config_refusals,
    lora_settings,
    runtime_refusals,
    sft_arguments,
    train_kind,
)
from training.open_models.extra import extra_missing

HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="the lines name a CPU-only worker")


def with_base(**sections) -> dict[str, dict]:
    """A minimal accepted config plus `sections` (dotted names as keyword `a__b`)."""
    out = {"job": {"model": "tiny"}, "hyperparameters": {"n_epochs": 1}}
    for name, values in sections.items():
        out.setdefault(name.replace("__", "."), {}).update(values)
    return out


def arguments(sections: dict, *, has_validation: bool = False) -> dict:
    return sft_arguments(sections, output_dir="/scratch/ckpt", has_validation=has_validation)


def test_the_reference_config_maps_every_key_but_what_this_worker_lacks():
    sections = config_load(reference_text()).sections
    expected = []
    if not HAS_DEEPSPEED:
        expected.append(
            "[hyperparameters.parallelism] use_deepspeed: this worker lacks the deepspeed package "
            "(pip install deepspeed); remove it or set false"
        )
    assert config_refusals(sections) == expected
    sections["hyperparameters.parallelism"].pop("use_deepspeed")
    sections["hyperparameters.parallelism"].pop("deepspeed_stage")
    # Every value written out from the reference file, by hand.
    assert arguments(sections, has_validation=True) == {
        "output_dir": "/scratch/ckpt",
        "num_train_epochs": 1.0,
        "max_steps": -1,
        "per_device_train_batch_size": 1,
        "per_device_eval_batch_size": 1,
        "gradient_accumulation_steps": 32,
        "max_length": 4096,
        "learning_rate": 1e-5,
        "warmup_steps": 0.03,
        "weight_decay": 0.01,
        "bf16": True,
        "fp16": False,
        "activation_checkpointing": True,
        "logging_steps": 10,
        "save_strategy": "steps",
        "save_steps": 50,
        "seed": 42,
        "report_to": "none",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "eval_strategy": "steps",
        "eval_steps": 50,
        "load_best_model_at_end": True,
        "metric_for_best_model": "loss",
        "greater_is_better": False,
    }


def test_without_validation_data_nothing_evaluates_and_checkpoints_keep_their_own_pace():
    sections = config_load(reference_text()).sections
    args = arguments(sections, has_validation=False)
    assert args["eval_strategy"] == "no"
    assert "load_best_model_at_end" not in args and "eval_steps" not in args
    assert args["save_steps"] == 500


@pytest.mark.parametrize(
    ("sections", "expected"),
    [
        ({"hyperparameters": {"n_epochs": 3}}, {"num_train_epochs": 3.0}),
        (
            {"hyperparameters": {"per_device_batch": 4}},
            {"per_device_train_batch_size": 4, "per_device_eval_batch_size": 4},
        ),
        (
            {"hyperparameters": {"gradient_accumulation_steps": 8}},
            {"gradient_accumulation_steps": 8},
        ),
        ({"hyperparameters": {"sequence_length": 2048}}, {"max_length": 2048}),
        ({"hyperparameters": {}}, {"max_length": None}),
        ({"hyperparameters": {"learning_rate": 3e-4}}, {"learning_rate": 3e-4}),
        ({"hyperparameters": {"warmup_ratio": 0.1}}, {"warmup_steps": 0.1}),
        ({"hyperparameters": {"weight_decay": 0.05}}, {"weight_decay": 0.05}),
        (
            {"hyperparameters": {"batch_size": 8}},
            {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1},
        ),
        (
            {"hyperparameters": {"batch_size": 8, "per_device_batch": 2}},
            {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4},
        ),
        (
            {"hyperparameters": {"batch_size": 8, "gradient_accumulation_steps": 2}},
            {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2},
        ),
        (
            {"hyperparameters": {"max_steps": 7, "save_steps": 5, "logging_steps": 2}},
            {"max_steps": 7, "save_steps": 5, "logging_steps": 2},
        ),
        ({"job": {"seed": 7}}, {"seed": 7}),
        ({"hyperparameters__parallelism": {"bf16": True}}, {"bf16": True, "fp16": False}),
        ({"hyperparameters__parallelism": {"fp16": True}}, {"bf16": False, "fp16": True}),
        ({"hyperparameters__parallelism": {}}, {"bf16": False, "activation_checkpointing": False}),
        (
            {"hyperparameters__parallelism": {"activation_checkpointing": True}},
            {"activation_checkpointing": True},
        ),
        ({"hyperparameters__parallelism": {"fsdp": False}}, {}),
        ({"training__validation": {"enabled": False}}, {"eval_strategy": "no"}),
        ({"training__validation": {"evaluation_strategy": "no"}}, {"eval_strategy": "no"}),
        ({"training__validation": {"evaluation_strategy": "epoch"}}, {"eval_strategy": "epoch"}),
        (
            {"training__validation": {"eval_steps": 20, "greater_is_better": True}},
            {"eval_strategy": "steps", "eval_steps": 20, "greater_is_better": True},
        ),
        (
            {
                "training__validation": {"eval_steps": 20, "save_best_model_at_end": True},
                "hyperparameters": {"save_steps": 40},
            },
            {"load_best_model_at_end": True, "save_strategy": "steps", "save_steps": 40},
        ),
        (
            {"training__validation": {"metric_for_best_model": "val.loss"}},
            {"metric_for_best_model": "loss"},
        ),
    ],
)
def test_each_setting_maps_to_its_field(sections, expected):
    config = with_base(**sections)
    assert config_refusals(config) == []
    args = arguments(config, has_validation=True)
    assert {key: args.get(key, "absent") for key in expected} == expected


def test_deepspeed_becomes_a_zero_config_whose_sizes_follow_the_trainer():
    config = with_base(hyperparameters__parallelism={"use_deepspeed": True, "deepspeed_stage": 3})
    assert arguments(config)["deepspeed"] == {
        "zero_optimization": {"stage": 3},
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
    }


def test_the_arguments_build_a_real_sft_config_that_reads_the_warmup_as_a_ratio(tmp_path):
    from trl import SFTConfig

    config = with_base(hyperparameters={"warmup_ratio": 0.03, "max_steps": 100})
    built = SFTConfig(**sft_arguments(config, output_dir=str(tmp_path), has_validation=False))
    # 3% of 100 steps, rounded up: 3 warmup steps.
    assert built.get_warmup_steps(100) == 3
    assert built.activation_checkpointing is False and built.bf16 is False


@pytest.mark.parametrize(
    ("sections", "line"),
    [
        (
            {"compute": {"nodes": 2}},
            "[compute] nodes: the trl provider trains on one machine; remove it or set 1",
        ),
        (
            {"compute": {"gpu_count": 2}},
            "[compute] gpu_count: the trl provider trains in one process on one GPU (or the CPU); "
            "remove it or set 1",
        ),
        (
            {"data": {"topology": {"shards": 2}}},
            "[data] topology: the trl provider has no data topology; remove it",
        ),
        (
            {"job": {"suffix": "crafter"}},
            "[job] suffix: an openai setting, the trl provider has none; remove it",
        ),
        (
            {"job": {"modalities": ["image"]}},
            '[job] modalities: the trl provider trains text answers; add "text"',
        ),
        (
            {"training": {"use_qlora": True}, "hyperparameters": {"train_kind": "fft"}},
            '[training] use_qlora: true contradicts [hyperparameters] train_kind = "fft"; '
            'set train_kind = "qlora" or use_qlora = false',
        ),
        (
            {"training__validation": {"metric_for_best_model": "accuracy"}},
            "[training.validation] metric_for_best_model: 'accuracy': the trl provider measures "
            'only the validation loss; use "val.loss"',
        ),
        (
            {
                "training__validation": {"eval_steps": 20, "save_best_model_at_end": True},
                "hyperparameters": {"save_steps": 30},
            },
            "[hyperparameters] save_steps: 30 must be a multiple of [training.validation] "
            "eval_steps (20) to keep the best model at the end",
        ),
        (
            {"training__validation": {"eval_steps": 0, "save_best_model_at_end": True}},
            "[training.validation] eval_steps: save_best_model_at_end needs eval_steps above 0 "
            "(checkpoints follow it)",
        ),
        (
            {"hyperparameters": {"warmup_ratio": 1.0}},
            "[hyperparameters] warmup_ratio: must be below 1 (all warmup never trains)",
        ),
        (
            {"hyperparameters": {"learning_rate_multiplier": 2.0}},
            "[hyperparameters] learning_rate_multiplier: an openai setting; the trl provider "
            "takes learning_rate",
        ),
        (
            {"hyperparameters": {"batch_size": 10, "per_device_batch": 3}},
            "[hyperparameters] batch_size: 10 is not per_device_batch x "
            "gradient_accumulation_steps (3 x ?)",
        ),
        (
            {"hyperparameters": {"lora_r": 8}},
            '[hyperparameters] lora_r: only for train_kind "lora" or "qlora"; remove it',
        ),
        (
            {"hyperparameters__parallelism": {"deepspeed_stage": 2}},
            "[hyperparameters.parallelism] deepspeed_stage: needs use_deepspeed = true; remove it",
        ),
        (
            {"hyperparameters__parallelism": {"fsdp": True}},
            "[hyperparameters.parallelism] fsdp: the trl provider trains in one process, FSDP "
            "shards across several; remove it or set false",
        ),
        (
            {"hyperparameters__parallelism": {"bf16": True, "fp16": True}},
            "[hyperparameters.parallelism] fp16: bf16 and fp16 are both true; choose one",
        ),
    ],
)
def test_each_setting_it_cannot_honour_is_one_line_naming_it(sections, line):
    assert config_refusals(with_base(**sections)) == [line]


def test_lora_settings_and_the_kind_of_training():
    assert train_kind(with_base()) == "fft"
    assert train_kind(with_base(training={"use_qlora": True})) == "qlora"
    assert train_kind(with_base(hyperparameters={"train_kind": "lora"})) == "lora"
    lora = with_base(hyperparameters={"train_kind": "lora", "lora_r": 4, "lora_alpha": 8})
    assert config_refusals(lora) == []
    assert lora_settings(lora) == {"r": 4, "lora_alpha": 8.0, "lora_dropout": 0.05}
    assert lora_settings(with_base()) == {"r": 16, "lora_alpha": 32.0, "lora_dropout": 0.05}


@CPU_ONLY
def test_what_a_cpu_worker_cannot_do_is_refused_when_the_run_starts():
    config = with_base(
        compute={"gpu_type": "A100", "gpu_count": 1},
        hyperparameters={"train_kind": "qlora"},
        hyperparameters__parallelism={"fp16": True},
    )
    assert runtime_refusals(config) == [
        "[compute] gpu_count: this worker has no GPU; remove it to use the CPU",
        "[compute] gpu_type: this worker has no GPU, not A100",
        "[hyperparameters.parallelism] fp16: needs CUDA; this worker has no GPU",
        "[hyperparameters] train_kind: QLoRA needs CUDA; this worker has no GPU",
    ]
    assert runtime_refusals(with_base(training={"use_qlora": True})) == [
        "[training] use_qlora: QLoRA needs CUDA; this worker has no GPU"
    ]
    assert runtime_refusals(with_base(hyperparameters__parallelism={"bf16": True})) == []


def test_the_provider_keys_join_the_schema_beside_every_other_provider(tmp_path):
    added = {
        section: {name: key for name, key in keys.items() if name not in SCHEMA[section]}
        for section, keys in TRL_CONFIG_KEYS.items()
    }
    schema_add(TRL_CONFIG_KEYS)
    try:
        text = (
            '[job]\nmodel = "tiny"\n[hyperparameters]\nn_epochs = 1\nmax_steps = 5\n'
            "save_steps = 2\nlogging_steps = 1\nlora_r = 4\nlora_alpha = 8\nlora_dropout = 0.1\n"
        )
        hp = config_load(text).sections["hyperparameters"]
        assert hp["max_steps"] == 5 and hp["lora_dropout"] == 0.1
    finally:
        schema_remove(added)


def test_extra_missing_names_the_module_the_worker_lacks(monkeypatch):
    assert extra_missing() is None
    monkeypatch.setitem(sys.modules, "peft", None)
    line = extra_missing()
    assert line.startswith("this worker lacks the training extra (") and "peft" in line
    assert line.endswith("): pip install -e '.[train]'") and "\n" not in line
