"""The training TOML (training/config.py) as TRL `SFTConfig` arguments, for the trl provider.

Every key of the shared schema either maps to its `SFTConfig` / `TrainingArguments` field or
is refused with one line naming it; nothing is silently ignored. Pure: no torch at import.

- `config_refusals` decides what it can from the text alone (one process on one machine:
  no nodes, no FSDP, no more than one GPU; DeepSpeed only when the package is installed).
- `runtime_refusals` asks the worker (CUDA, bitsandbytes, its GPUs) and imports torch.
- `sft_arguments` is the keyword arguments, once both are empty.
- A GRPO config (`[training] mode = "grpo"`) gets the shared checks here and its own from
  `training.open_models.grpo_arguments`, which makes its `GRPOConfig` arguments.

`[hyperparameters] batch_size` (OpenAI's examples per optimizer step) is mapped, not refused:
on one device it is `per_device_batch` x `gradient_accumulation_steps`, so given alone it is
the per-device batch, given with one of them it fixes the other, and all three must agree.
`[hyperparameters] warmup_ratio` is transformers 5's `warmup_steps` below 1 (a ratio).
"""

from __future__ import annotations

import importlib.util
from typing import Any

from training.config import Key, config_is_grpo
from training.open_models.grpo_arguments import grpo_refusals

# The trl provider's own keys (training.providers registers them with its kind).
TRL_CONFIG_KEYS: dict[str, dict[str, Key]] = {
    "hyperparameters": {
        "max_steps": Key("int", min=1, max=10**7, help="trl: stop after this many optimizer steps"),
        "save_steps": Key("int", min=1, max=10**7, help="trl: a checkpoint every this many steps"),
        "logging_steps": Key("int", min=1, max=10**7, help="trl: log the loss every N steps"),
        "lora_r": Key("int", min=1, max=1024, help="trl: LoRA rank"),
        "lora_alpha": Key("float", min=0.0, max=10000.0, help="trl: LoRA alpha (scale)"),
        "lora_dropout": Key("float", min=0.0, max=0.99, help="trl: LoRA dropout"),
    },
}
DEFAULT_SAVE_STEPS = 500
DEFAULT_LOGGING_STEPS = 10
DEFAULT_SEED = 42
DEFAULT_LORA = {"lora_r": 16, "lora_alpha": 32.0, "lora_dropout": 0.05}
# synth-ai's metric names for the validation loss; the Trainer calls it "loss" (eval_loss).
LOSS_METRICS = ("val.loss", "val_loss", "validation_loss", "eval_loss", "loss")
_REMOVE = "remove it"


def _line(section: str, key: str, message: str) -> str:
    return f"[{section}] {key}: {message}"


def train_kind(sections: dict[str, dict]) -> str:
    """fft, lora or qlora: `[training] use_qlora = true` without a train_kind is qlora."""
    hp = sections.get("hyperparameters", {})
    if sections.get("training", {}).get("use_qlora") and "train_kind" not in hp:
        return "qlora"
    return str(hp.get("train_kind", "fft"))


def config_refusals(sections: dict[str, dict]) -> list[str]:
    """One line per TOML setting the trl provider cannot honour, naming it; empty: all map."""
    lines: list[str] = []
    lines += _job_refusals(sections.get("job", {}))
    lines += _compute_refusals(sections.get("compute", {}))
    topology = sections.get("data", {}).get("topology")
    if topology:
        lines.append(_line("data", "topology", f"the trl provider has no data topology; {_REMOVE}"))
    lines += _training_refusals(sections)
    if config_is_grpo(sections):
        # GRPO has no SFT batch, length or validation keys: grpo_refusals names each.
        lines += grpo_refusals(sections)
        lines += _hyperparameter_refusals(sections, batch=False)
    else:
        lines += _validation_refusals(sections)
        lines += _hyperparameter_refusals(sections)
    lines += _parallelism_refusals(sections.get("hyperparameters.parallelism", {}))
    return lines


def _job_refusals(job: dict) -> list[str]:
    lines = []
    modalities = job.get("modalities")
    if modalities is not None and "text" not in modalities:
        lines.append(_line("job", "modalities", 'the trl provider trains text answers; add "text"'))
    if "suffix" in job:
        lines.append(
            _line("job", "suffix", f"an openai setting, the trl provider has none; {_REMOVE}")
        )
    return lines


def _compute_refusals(compute: dict) -> list[str]:
    lines = []
    if compute.get("nodes", 1) > 1:
        lines.append(
            _line("compute", "nodes", "the trl provider trains on one machine; remove it or set 1")
        )
    if compute.get("gpu_count", 1) > 1:
        lines.append(
            _line(
                "compute",
                "gpu_count",
                "the trl provider trains in one process on one GPU (or the CPU); "
                "remove it or set 1",
            )
        )
    return lines


def _training_refusals(sections: dict[str, dict]) -> list[str]:
    hp = sections.get("hyperparameters", {})
    if sections.get("training", {}).get("use_qlora") and hp.get("train_kind") in ("fft", "lora"):
        return [
            _line(
                "training",
                "use_qlora",
                f'true contradicts [hyperparameters] train_kind = "{hp["train_kind"]}"; '
                'set train_kind = "qlora" or use_qlora = false',
            )
        ]
    return []


def _validation_refusals(sections: dict[str, dict]) -> list[str]:
    validation = sections.get("training.validation", {})
    lines = []
    metric = validation.get("metric_for_best_model")
    if metric is not None and metric not in LOSS_METRICS:
        lines.append(
            _line(
                "training.validation",
                "metric_for_best_model",
                f'{metric!r}: the trl provider measures only the validation loss; use "val.loss"',
            )
        )
    if validation.get("save_best_model_at_end") and _evaluates(validation):
        save_steps = sections.get("hyperparameters", {}).get("save_steps")
        eval_steps = validation.get("eval_steps") or 0
        strategy = validation.get("evaluation_strategy", "steps")
        if strategy == "steps" and save_steps and eval_steps and save_steps % eval_steps:
            lines.append(
                _line(
                    "hyperparameters",
                    "save_steps",
                    f"{save_steps} must be a multiple of [training.validation] eval_steps "
                    f"({eval_steps}) to keep the best model at the end",
                )
            )
        if strategy == "steps" and not eval_steps:
            lines.append(
                _line(
                    "training.validation",
                    "eval_steps",
                    "save_best_model_at_end needs eval_steps above 0 (checkpoints follow it)",
                )
            )
    return lines


def _evaluates(validation: dict) -> bool:
    return bool(validation.get("enabled", True)) and validation.get("evaluation_strategy") != "no"


def _hyperparameter_refusals(sections: dict[str, dict], *, batch: bool = True) -> list[str]:
    hp = sections.get("hyperparameters", {})
    lines = []
    if hp.get("warmup_ratio", 0) >= 1:
        lines.append(
            _line("hyperparameters", "warmup_ratio", "must be below 1 (all warmup never trains)")
        )
    if "learning_rate_multiplier" in hp:
        lines.append(
            _line(
                "hyperparameters",
                "learning_rate_multiplier",
                "an openai setting; the trl provider takes learning_rate",
            )
        )
    if batch and "batch_size" in hp and _batch(hp) is None:
        per_device = hp.get("per_device_batch", "?")
        accumulation = hp.get("gradient_accumulation_steps", "?")
        lines.append(
            _line(
                "hyperparameters",
                "batch_size",
                f"{hp['batch_size']} is not per_device_batch x gradient_accumulation_steps "
                f"({per_device} x {accumulation})",
            )
        )
    if train_kind(sections) == "fft":
        for key in ("lora_r", "lora_alpha", "lora_dropout"):
            if key in hp:
                lines.append(
                    _line(
                        "hyperparameters", key, 'only for train_kind "lora" or "qlora"; ' + _REMOVE
                    )
                )
    return lines


def _batch(hp: dict) -> tuple[int, int] | None:
    """(per-device batch, accumulation steps), or None when batch_size cannot be split so."""
    per_device = hp.get("per_device_batch")
    accumulation = hp.get("gradient_accumulation_steps")
    total = hp.get("batch_size")
    if total is None:
        return int(per_device or 1), int(accumulation or 1)
    if per_device is None and accumulation is None:
        return int(total), 1
    if per_device is None:
        return (total // accumulation, accumulation) if total % accumulation == 0 else None
    if accumulation is None:
        return (per_device, total // per_device) if total % per_device == 0 else None
    return (per_device, accumulation) if per_device * accumulation == total else None


def _parallelism_refusals(parallelism: dict) -> list[str]:
    section = "hyperparameters.parallelism"
    lines = []
    if parallelism.get("use_deepspeed") and importlib.util.find_spec("deepspeed") is None:
        lines.append(
            _line(
                section,
                "use_deepspeed",
                "this worker lacks the deepspeed package (pip install deepspeed); "
                "remove it or set false",
            )
        )
    if "deepspeed_stage" in parallelism and not parallelism.get("use_deepspeed"):
        lines.append(_line(section, "deepspeed_stage", f"needs use_deepspeed = true; {_REMOVE}"))
    if parallelism.get("fsdp"):
        lines.append(
            _line(
                section,
                "fsdp",
                "the trl provider trains in one process, FSDP shards across several; "
                "remove it or set false",
            )
        )
    if parallelism.get("bf16") and parallelism.get("fp16"):
        lines.append(_line(section, "fp16", "bf16 and fp16 are both true; choose one"))
    return lines


def runtime_refusals(sections: dict[str, dict]) -> list[str]:
    """What this worker cannot do of an accepted config (imports torch): fp16 and QLoRA
    need CUDA, QLoRA bitsandbytes, and `[compute]` names the GPU the job expects."""
    import torch  # the train extra

    cuda = torch.cuda.is_available()
    names = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda else []
    )
    has = ", ".join(names) or "no GPU"
    lines = []
    compute = sections.get("compute", {})
    if compute.get("gpu_count", 0) >= 1 and not cuda:
        lines.append(
            _line("compute", "gpu_count", f"this worker has {has}; remove it to use the CPU")
        )
    gpu_type = compute.get("gpu_type")
    if gpu_type and not any(gpu_type.lower() in name.lower() for name in names):
        lines.append(_line("compute", "gpu_type", f"this worker has {has}, not {gpu_type}"))
    if sections.get("hyperparameters.parallelism", {}).get("fp16") and not cuda:
        lines.append(
            _line("hyperparameters.parallelism", "fp16", f"needs CUDA; this worker has {has}")
        )
    if train_kind(sections) == "qlora":
        where = "train_kind" if "train_kind" in sections.get("hyperparameters", {}) else "use_qlora"
        section = "hyperparameters" if where == "train_kind" else "training"
        if not cuda:
            lines.append(_line(section, where, f"QLoRA needs CUDA; this worker has {has}"))
        elif importlib.util.find_spec("bitsandbytes") is None:
            lines.append(
                _line(section, where, "QLoRA needs the bitsandbytes package on this worker")
            )
    return lines


def sft_arguments(
    sections: dict[str, dict], *, output_dir: str, has_validation: bool
) -> dict[str, Any]:
    """The SFTConfig keyword arguments for a config that config_refusals accepted."""
    hp = sections.get("hyperparameters", {})
    parallelism = sections.get("hyperparameters.parallelism", {})
    per_device, accumulation = _batch(hp) or (1, 1)
    args: dict[str, Any] = {
        "output_dir": output_dir,
        "num_train_epochs": float(hp.get("n_epochs", 1)),
        "max_steps": int(hp.get("max_steps", -1)),
        "per_device_train_batch_size": per_device,
        "per_device_eval_batch_size": per_device,
        "gradient_accumulation_steps": accumulation,
        # Unset, nothing is cut: TRL's 1024 would cut the studio's prompts through an image.
        "max_length": int(hp["sequence_length"]) if "sequence_length" in hp else None,
        "learning_rate": float(hp.get("learning_rate", 2e-5)),
        "warmup_steps": float(hp.get("warmup_ratio", 0.0)),
        "weight_decay": float(hp.get("weight_decay", 0.0)),
        # Written out: TRL's own defaults turn both on, which nobody asked for.
        "bf16": bool(parallelism.get("bf16", False)),
        "fp16": bool(parallelism.get("fp16", False)),
        "activation_checkpointing": bool(parallelism.get("activation_checkpointing", False)),
        "logging_steps": int(hp.get("logging_steps", DEFAULT_LOGGING_STEPS)),
        "save_strategy": "steps",
        "save_steps": int(hp.get("save_steps", DEFAULT_SAVE_STEPS)),
        "seed": int(sections.get("job", {}).get("seed", DEFAULT_SEED)),
        "report_to": "none",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }
    if parallelism.get("use_deepspeed"):
        args["deepspeed"] = deepspeed_config(int(parallelism.get("deepspeed_stage", 2)))
    args.update(_evaluation(sections, has_validation=has_validation, save_steps=args["save_steps"]))
    return args


def _evaluation(sections: dict[str, dict], *, has_validation: bool, save_steps: int) -> dict:
    validation = sections.get("training.validation")
    if validation is None or not has_validation or not _evaluates(validation):
        return {"eval_strategy": "no"}
    strategy = validation.get("evaluation_strategy", "steps")
    out: dict[str, Any] = {"eval_strategy": strategy}
    if strategy == "steps" and validation.get("eval_steps"):
        out["eval_steps"] = int(validation["eval_steps"])
    if validation.get("save_best_model_at_end"):
        out["load_best_model_at_end"] = True
        out["save_strategy"] = strategy
        if strategy == "steps" and "save_steps" not in sections.get("hyperparameters", {}):
            out["save_steps"] = out.get("eval_steps", save_steps)
    if "metric_for_best_model" in validation:
        out["metric_for_best_model"] = "loss"
    if "greater_is_better" in validation:
        out["greater_is_better"] = bool(validation["greater_is_better"])
    return out


def deepspeed_config(stage: int) -> dict[str, Any]:
    """A ZeRO config whose sizes and precision follow the Trainer's own arguments ("auto")."""
    return {
        "zero_optimization": {"stage": stage},
        "train_micro_batch_size_per_gpu": "auto",
        "train_batch_size": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
    }


def lora_settings(sections: dict[str, dict]) -> dict[str, Any]:
    """LoRA's rank, alpha and dropout, the defaults filled in."""
    hp = sections.get("hyperparameters", {})
    return {
        "r": int(hp.get("lora_r", DEFAULT_LORA["lora_r"])),
        "lora_alpha": float(hp.get("lora_alpha", DEFAULT_LORA["lora_alpha"])),
        "lora_dropout": float(hp.get("lora_dropout", DEFAULT_LORA["lora_dropout"])),
    }
