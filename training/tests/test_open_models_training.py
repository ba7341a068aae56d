"""`run_training` for real: TRL's SFTTrainer on the CPU, the tiny Qwen2-VL, a real export.

The export is written by curation's own writer from rows a real export produced (the golden
JSONL of curation's tests: a recorded episode with a short prompt, so a step is quick).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from curation.hf_export import write_hf_dataset
from training.open_models.runner import TrainSpec, run_training
from training.open_models.tiny import build_tiny_vlm

GOLDEN = Path(__file__).resolve().parents[2] / "curation" / "tests" / "golden"
SHA256 = "5" * 64
LABEL = "crafter-sft v3 (version 12)"


@dataclass
class RecordingSink:
    """A RunSink that keeps what it is told; `stop_after` steps, it asks to stop."""

    stop_after: int | None = None
    events: list[tuple[str, str, str]] = field(default_factory=list)
    metrics_seen: list[tuple[int, float | None, float | None]] = field(default_factory=list)
    checkpoints: list[tuple[int, list[str]]] = field(default_factory=list)
    asked: int = 0

    def event(self, type, message, *, level="info", data=None):
        self.events.append((type, message, level))

    def metrics(self, step, *, train_loss, validation_loss):
        self.metrics_seen.append((step, train_loss, validation_loss))

    def should_stop(self):
        self.asked += 1
        return self.stop_after is not None and self.asked >= self.stop_after

    def checkpoint_saved(self, step, directory):
        # The caller stores it now: it must be complete when it is handed over.
        self.checkpoints.append((step, sorted(p.name for p in Path(directory).iterdir())))

    def train_losses(self) -> dict[int, float]:
        return {step: loss for step, loss, _ in self.metrics_seen if loss is not None}

    def validation_losses(self) -> dict[int, float]:
        return {step: loss for step, _, loss in self.metrics_seen if loss is not None}


def sections(**hyperparameters) -> dict[str, dict]:
    hp = {"n_epochs": 1, "logging_steps": 1, "learning_rate": 5e-3, **hyperparameters}
    return {"job": {"model": "tiny", "modalities": ["text", "image"]}, "hyperparameters": hp}


@pytest.fixture(scope="module")
def base_model(tmp_path_factory) -> Path:
    return build_tiny_vlm(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("export")
    rows = GOLDEN / "recorded_only.jsonl"
    write_hf_dataset(sources={"train": rows, "val": rows}, output=root / "hf", kind="sft")
    return root / "hf"


def spec(base_model: Path, export: Path, work_dir: Path, config: dict) -> TrainSpec:
    return TrainSpec(
        base_model=str(base_model),
        sections=config,
        dataset_dir=export,
        dataset_sha256=SHA256,
        dataset_label=LABEL,
        work_dir=work_dir,
    )


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def thirty_steps(base_model, export, tmp_path_factory):
    config = sections(max_steps=30, save_steps=30)
    config["training.validation"] = {"enabled": True, "evaluation_strategy": "steps"}
    config["training.validation"]["eval_steps"] = 10
    sink = RecordingSink()
    work = tmp_path_factory.mktemp("work")
    result = run_training(spec(base_model, export, work, config), sink)
    return result, sink, config


def test_the_loss_falls_over_thirty_steps(thirty_steps):
    result, sink, _ = thirty_steps
    assert (result.status, result.steps) == ("succeeded", 30)
    losses = sink.train_losses()
    assert sorted(losses) == list(range(1, 31))
    # Untrained, the model spreads its guess over 1,024 tokens: about ln(1024) = 6.9 nats.
    # Three fixed answers seen ten times each are learned by heart; a run that learned
    # nothing would stay within the few tenths rows differ by. Half is a wide margin.
    assert losses[30] < losses[1] / 2
    assert result.train_loss == losses[30]
    validation = sink.validation_losses()
    assert sorted(validation) == [10, 20, 30] and validation[30] < validation[10]
    assert [c[0] for c in sink.checkpoints] == [30]
    assert {"optimizer.pt", "scheduler.pt", "rng_state.pth"} <= set(sink.checkpoints[0][1])
    assert [e[0] for e in sink.events] == ["started", "finished"]


def test_the_card_names_the_data_the_base_and_every_setting(thirty_steps, base_model):
    result, sink, config = thirty_steps
    card = (result.model_dir / "README.md").read_text(encoding="utf-8")
    assert card.startswith("---\n") and f'base_model: "{base_model}"' in card
    assert f"- Dataset: {LABEL}\n" in card and f"- Export sha256: `{SHA256}`\n" in card
    assert "- Training: fft\n" in card
    assert "- Train rows in the export: 3\n" in card
    assert "- Optimizer steps run: 30\n" in card
    # 30 steps of one row over 3 rows: ten epochs, though the config asked for one.
    assert "- Epochs run: 10 (rows per step: 1; rows seen, at most: 30)" in card
    assert "- Validation: the dataset version's own validation split, 3 rows\n" in card
    assert f"- Last validation loss: {sink.validation_losses()[30]:.6g}\n" in card
    blocks = card.split("```json\n")
    given = json.loads(blocks[1].split("```")[0])
    used = json.loads(blocks[2].split("```")[0])
    assert given == json.loads(json.dumps(config))
    assert used["learning_rate"] == 5e-3 and used["max_steps"] == 30
    assert used["eval_steps"] == 10 and "output_dir" not in used


def test_the_saved_model_reloads_with_the_auto_classes_and_generates(thirty_steps, export):
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from trl.data_utils import prepare_multimodal_messages

    from training.open_models.rows import load_splits, training_rows

    result, _, _ = thirty_steps
    processor = AutoProcessor.from_pretrained(result.model_dir, local_files_only=True)
    model = AutoModelForImageTextToText.from_pretrained(result.model_dir, local_files_only=True)
    row = training_rows(
        load_splits(export, cache_dir=result.model_dir.parent / "c")["train"],
        processor,
        split="train",
        cache_file=result.model_dir.parent / "again.arrow",
    )[0]
    messages = prepare_multimodal_messages(row["prompt"], images=row["images"])
    inputs = processor.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
    )
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    new = out[0, inputs["input_ids"].shape[1] :]
    assert 0 < len(new) <= 12
    assert processor.decode(new, skip_special_tokens=True).strip()


def test_lora_trains_an_adapter_and_leaves_the_base_weights_alone(base_model, export, tmp_path):
    from safetensors.torch import load_file

    before = {p.name: file_sha256(p) for p in base_model.iterdir() if p.is_file()}
    config = sections(max_steps=3, save_steps=3, train_kind="lora", lora_r=4, lora_alpha=8)
    result = run_training(spec(base_model, export, tmp_path, config), RecordingSink())
    assert result.status == "succeeded"
    assert {p.name: file_sha256(p) for p in base_model.iterdir() if p.is_file()} == before
    adapter = result.model_dir / "adapter"
    settings = json.loads((adapter / "adapter_config.json").read_text())
    assert (settings["r"], settings["lora_alpha"]) == (4, 8)
    trained = load_file(adapter / "adapter_model.safetensors")
    assert trained and all("lora_" in name for name in trained)
    # LoRA's B starts at zero: a B that is no longer zero was trained.
    assert any(t.abs().sum() > 0 for name, t in trained.items() if "lora_B" in name)
    merged = load_file(result.model_dir / "model.safetensors")
    base = load_file(base_model / "model.safetensors")
    assert merged.keys() == base.keys()
    assert any(not merged[k].equal(base[k]) for k in base if k.endswith("q_proj.weight"))
    assert (
        "- Training: lora (merged into these weights"
        in (result.model_dir / "README.md").read_text()
    )


def test_the_best_checkpoint_is_the_model_saved_when_the_config_asks(base_model, export, tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText

    config = sections(max_steps=4, save_steps=2)
    # "Greater is better" on a falling loss makes the first evaluation the best: the saved
    # model must then be step 2's, not the last step's.
    config["training.validation"] = {
        "eval_steps": 2,
        "save_best_model_at_end": True,
        "greater_is_better": True,
    }
    sink = RecordingSink()
    result = run_training(spec(base_model, export, tmp_path, config), sink)
    validation = sink.validation_losses()
    assert sorted(validation) == [2, 4] and validation[2] > validation[4]
    saved = load_file(result.model_dir / "model.safetensors")

    def weights(step: int) -> dict:
        directory = tmp_path / "checkpoints" / f"checkpoint-{step}"
        model = AutoModelForImageTextToText.from_pretrained(directory, local_files_only=True)
        model.save_pretrained(tmp_path / f"again-{step}")
        return load_file(tmp_path / f"again-{step}" / "model.safetensors")

    best, last = weights(2), weights(4)
    assert saved.keys() == best.keys()
    assert all(saved[k].equal(best[k]) for k in best)
    assert not all(saved[k].equal(last[k]) for k in last)
    card = (result.model_dir / "README.md").read_text()
    assert (
        "- The saved weights are the best checkpoint's (checkpoint-2) by validation loss\n" in card
    )
