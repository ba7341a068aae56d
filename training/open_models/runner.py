"""One training run of the trl provider: a dataset version's export, TRL's SFTTrainer, a model.

Django-free: the provider's task gives a `TrainSpec` and a `RunSink` (its events, metrics,
Cancel and checkpoint storage) and gets a `TrainResult`. Torch, transformers, TRL and PEFT
are imported inside the functions (the `.[train]` extra).

- The model and processor load with the Auto classes, from local files only when
  `base_model` is a directory. Full fine-tuning trains every weight; `lora` wraps the model
  in a PEFT LoRA on all its linear layers; `qlora` loads the base in 4 bits first (CUDA and
  bitsandbytes, refused otherwise).
- Cancel: the sink is asked after every optimizer step; a yes stops the loop there, with no
  evaluation or checkpoint after it, and the run ends "canceled" without a model.
- Checkpoints are the Trainer's (weights, optimizer, scheduler, RNG states) in
  `work_dir/checkpoints`; each is handed to the sink as it is written. `resume_from`, a
  checkpoint the caller fetched back, continues at its step with the same data order.
- The model goes to `work_dir/model` with the processor and the card. A LoRA run is saved
  merged into full weights there, which any engine serves without PEFT or the base model's
  files, and its adapter alone in `model/adapter/`; a QLoRA run saves only the adapter (its
  base is 4-bit: merging into it would lose precision). With `save_best_model_at_end`, the
  saved model is the best checkpoint's, and the card says so.
- A full checkpoint's weights are read back with `from_pretrained`, on resuming and for the
  best model: checkpoints are saved in the checkpoint's original key layout, which the
  Trainer's own reload (a plain `load_state_dict`, not strict) misses for Qwen2-VL, going on
  silently from the weights it already had. Its warning of missing keys is harmless here.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from training.open_models.arguments import (
    config_refusals,
    lora_settings,
    runtime_refusals,
    sft_arguments,
    train_kind,
)
from training.open_models.card import CardFacts, card_text
from training.open_models.rows import RowsError, load_splits, training_rows

MAX_EVENT_TEXT = 500


@dataclass(frozen=True)
class TrainSpec:
    base_model: str  # a Hugging Face model id or a local directory
    sections: dict[str, dict]  # the job's effective config (TrainingConfig.sections)
    dataset_dir: Path  # an unzipped export_hf directory
    dataset_sha256: str  # DatasetVersion.hf_sha256 (goes into the model card)
    dataset_label: str  # e.g. "crafter-sft v3 (version 12)"
    work_dir: Path  # local scratch: checkpoints are written here by the Trainer
    # Another version's export, when the job names one; else the dataset_dir's own
    # `validation` split if it has one.
    validation_dir: Path | None = None


class RunSink(Protocol):
    def event(
        self, type: str, message: str, *, level: str = "info", data: dict | None = None
    ) -> None: ...

    def metrics(
        self, step: int, *, train_loss: float | None, validation_loss: float | None
    ) -> None: ...

    def should_stop(self) -> bool: ...

    def checkpoint_saved(self, step: int, directory: Path) -> None: ...


@dataclass(frozen=True)
class TrainResult:
    status: str  # "succeeded" or "canceled"
    model_dir: Path | None  # the final model (weights or adapter + processor + README.md card)
    steps: int
    train_loss: float | None  # the last logged training loss


class TrainingRefused(ValueError):
    """The run cannot start; `lines` says why, one line per setting or problem."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = list(lines)
        super().__init__("\n".join(self.lines))


def finite_or_none(value: Any) -> float | None:
    """A logged value as a float, or None when it is not a finite number."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _sink_callback(sink: RunSink) -> Any:
    """A TrainerCallback speaking to the sink (built here: transformers is imported lazily)."""
    from transformers import TrainerCallback  # the train extra

    class SinkCallback(TrainerCallback):
        def __init__(self) -> None:
            self.canceled = False
            self.start_step = 0
            self.train_loss: float | None = None
            self.validation_loss: float | None = None

        def on_train_begin(self, args, state, control, **kwargs):
            self.start_step = state.global_step
            if state.global_step:
                sink.event("resumed", f"resumed at step {state.global_step} of {state.max_steps}")
            sink.event(
                "started", f"training {state.max_steps} steps", data={"steps": state.max_steps}
            )

        def on_step_end(self, args, state, control, **kwargs):
            if sink.should_stop():
                self.canceled = True
                self._halt(control)

        def on_epoch_end(self, args, state, control, **kwargs):
            if self.canceled:
                self._halt(control)

        @staticmethod
        def _halt(control) -> None:
            # Nothing more after this step: no evaluation, no checkpoint, no next step.
            control.should_training_stop = True
            control.should_evaluate = False
            control.should_save = False

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = logs or {}
            if "loss" not in logs and "eval_loss" not in logs:
                return
            train_loss = finite_or_none(logs.get("loss"))
            validation_loss = finite_or_none(logs.get("eval_loss"))
            for key in ("loss", "eval_loss"):
                if key in logs and finite_or_none(logs[key]) is None:
                    sink.event(
                        "warning",
                        f"the {key.replace('_', ' ')} is not a number at step {state.global_step}",
                        level="warning",
                    )
            self.train_loss = train_loss if train_loss is not None else self.train_loss
            if validation_loss is not None:
                self.validation_loss = validation_loss
            sink.metrics(state.global_step, train_loss=train_loss, validation_loss=validation_loss)

        def on_save(self, args, state, control, **kwargs):
            directory = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            sink.checkpoint_saved(state.global_step, directory)

    return SinkCallback()


def _datasets(spec: TrainSpec, processor: Any) -> tuple[Any, Any, str]:
    """The train rows, the validation rows (or None) and what the card says of them."""
    import datasets  # the train extra

    rows_dir = spec.work_dir / "rows"
    cache = spec.work_dir / "hf-cache"
    splits = load_splits(spec.dataset_dir, cache_dir=cache)
    train = training_rows(
        splits["train"], processor, split="train", cache_file=rows_dir / "train.arrow"
    )
    if len(train) == 0:
        raise TrainingRefused(["the dataset version's train split has no rows"])
    if spec.validation_dir is not None:
        other = load_splits(spec.validation_dir, cache_dir=cache)
        raw = datasets.concatenate_datasets(list(other.values()))
        note = f"every row of another dataset version's export ({spec.validation_dir.name})"
    elif "validation" in splits:
        raw, note = splits["validation"], "the dataset version's own validation split"
    else:
        return train, None, "none (the dataset version has no validation split)"
    if len(raw) == 0:
        return train, None, "none (the validation data has no rows)"
    validation = training_rows(
        raw, processor, split="validation", cache_file=rows_dir / "val.arrow"
    )
    return train, validation, f"{note}, {len(validation)} rows"


def _image_count(dataset: Any) -> int:
    import pyarrow.compute as pc

    lengths = pc.list_value_length(dataset.data.column("images"))
    return int(pc.sum(lengths).as_py() or 0)


def _has_cuda() -> bool:
    import torch  # the train extra

    return torch.cuda.is_available()


def _is_local(base_model: str) -> bool:
    return Path(base_model).is_dir()


def _full_weights(directory: Path | None) -> bool:
    """Whether a checkpoint holds the whole model (a LoRA checkpoint holds its adapter)."""
    return directory is not None and (Path(directory) / "config.json").is_file()


def _model(spec: TrainSpec, kind: str, *, resume_from: Path | None = None) -> Any:
    import torch  # the train extra
    from transformers import AutoModelForImageTextToText

    kwargs: dict[str, Any] = {
        "local_files_only": _is_local(spec.base_model),
        "dtype": torch.float32,
    }
    if kind == "qlora":
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=torch.bfloat16,
            bnb_4bit_use_double_quant=True,
        )
    source = spec.base_model
    if kind == "fft" and _full_weights(resume_from):
        # The checkpoint's weights are in the checkpoint's own layout: from_pretrained reads
        # it; the Trainer's own reload (a plain load_state_dict) misses Qwen2-VL's renamed
        # keys and would silently go on from the base weights.
        source, kwargs["local_files_only"] = str(resume_from), True
    return AutoModelForImageTextToText.from_pretrained(source, **kwargs)


def _peft_config(sections: dict[str, dict]) -> Any:
    from peft import LoraConfig  # the train extra

    return LoraConfig(task_type="CAUSAL_LM", target_modules="all-linear", **lora_settings(sections))


def run_training(spec: TrainSpec, sink: RunSink, *, resume_from: Path | None = None) -> TrainResult:
    """Train `spec` with TRL's SFTTrainer; TrainingRefused (one line each) before any step
    when the config or the data cannot be honoured here."""
    refused = config_refusals(spec.sections) + runtime_refusals(spec.sections)
    if spec.sections.get("training", {}).get("mode") == "grpo":
        refused.insert(0, '[training] mode: "grpo" runs play episodes (run_grpo), not a dataset')
    if refused:
        raise TrainingRefused(refused)
    from transformers import AutoProcessor  # the train extra
    from trl import SFTConfig, SFTTrainer

    kind = train_kind(spec.sections)
    processor = AutoProcessor.from_pretrained(
        spec.base_model, local_files_only=_is_local(spec.base_model)
    )
    try:
        train, validation, validation_note = _datasets(spec, processor)
    except RowsError as exc:
        raise TrainingRefused([str(exc)]) from None
    modalities = spec.sections.get("job", {}).get("modalities")
    if modalities is not None and "image" not in modalities and _image_count(train):
        raise TrainingRefused(['[job] modalities: the dataset\'s rows carry images; add "image"'])
    if validation is None and spec.sections.get("training.validation", {}).get("enabled"):
        sink.event("warning", f"no validation: {validation_note}", level="warning")
    arguments = sft_arguments(
        spec.sections,
        output_dir=str(spec.work_dir / "checkpoints"),
        has_validation=validation is not None,
    )
    if validation is not None and arguments["eval_strategy"] == "no":
        # The card must not name validation data nothing was measured on.
        validation, validation_note = None, "none ([training.validation] does not ask for it)"
    # Pinned memory only helps a GPU; on a CPU worker it is a warning per run.
    arguments["dataloader_pin_memory"] = _has_cuda()
    callback = _sink_callback(sink)
    trainer = SFTTrainer(
        model=_model(spec, kind, resume_from=resume_from),
        args=SFTConfig(**arguments),
        train_dataset=train,
        eval_dataset=validation,
        processing_class=processor,
        peft_config=_peft_config(spec.sections) if kind in ("lora", "qlora") else None,
        callbacks=[callback],
    )
    trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    steps = trainer.state.global_step
    if callback.canceled:
        sink.event("canceled", f"canceled after step {steps}")
        return TrainResult("canceled", None, steps, callback.train_loss)
    best = trainer.state.best_model_checkpoint if arguments.get("load_best_model_at_end") else None
    notes = []
    if best:
        notes.append(
            f"The saved weights are the best checkpoint's ({Path(best).name}) by validation loss"
        )
    facts = CardFacts(
        base_model=spec.base_model,
        dataset_label=spec.dataset_label,
        dataset_sha256=spec.dataset_sha256,
        train_kind=kind,
        train_rows=len(train),
        steps=steps,
        epochs=float(trainer.state.epoch or 0.0),
        rows_per_step=arguments["per_device_train_batch_size"]
        * arguments["gradient_accumulation_steps"],
        train_loss=callback.train_loss,
        validation=validation_note,
        validation_loss=callback.validation_loss,
        sections=spec.sections,
        arguments={k: v for k, v in arguments.items() if k != "output_dir"},
        resumed_from_step=callback.start_step if resume_from else None,
        merged=kind == "lora",
        notes=notes,
    )
    model_dir = _save(
        trainer, processor, spec.work_dir / "model", kind=kind, card=card_text(facts), best=best
    )
    sink.event("finished", f"trained {steps} steps; model saved", data={"steps": steps})
    return TrainResult("succeeded", model_dir, steps, callback.train_loss)


def _save(
    trainer: Any, processor: Any, model_dir: Path, *, kind: str, card: str, best: str | None
) -> Path:
    """The trained model in `model_dir` (see the module's docstring), its card beside it."""
    if model_dir.exists():
        shutil.rmtree(model_dir)
    model_dir.mkdir(parents=True)
    if kind == "fft" and _full_weights(best):
        # As on resuming: the Trainer's reload of the best checkpoint misses renamed keys.
        from transformers import AutoModelForImageTextToText  # the train extra

        AutoModelForImageTextToText.from_pretrained(best, local_files_only=True).save_pretrained(
            str(model_dir)
        )
    elif kind == "lora":
        trainer.model.save_pretrained(str(model_dir / "adapter"))
        merged = trainer.model.merge_and_unload()
        merged.save_pretrained(str(model_dir))
    else:
        trainer.save_model(str(model_dir))
    processor.save_pretrained(str(model_dir))
    (model_dir / "README.md").write_text(card, encoding="utf-8")
    return model_dir
