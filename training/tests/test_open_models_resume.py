"""Cancel, checkpoints and resuming of `run_training`, for real on the CPU."""

from __future__ import annotations

import shutil

import pytest

from training.open_models.runner import TrainingRefused, run_training
from training.tests import test_open_models_training as trained
from training.tests.test_open_models_training import RecordingSink, sections, spec

# The same module-scoped model and export, built once for this module too.
base_model = trained.base_model
export = trained.export


def test_cancel_after_step_three_stops_there_without_evaluating_or_saving(
    base_model, export, tmp_path
):
    config = sections(max_steps=20, save_steps=2)
    config["training.validation"] = {"enabled": True, "evaluation_strategy": "steps"}
    config["training.validation"]["eval_steps"] = 3
    sink = RecordingSink(stop_after=3)
    result = run_training(spec(base_model, export, tmp_path, config), sink)
    assert (result.status, result.steps, result.model_dir) == ("canceled", 3, None)
    assert sink.asked == 3
    assert sorted(sink.train_losses()) == [1, 2, 3]
    # Step 3 would have been evaluated; Cancel came first.
    assert sink.validation_losses() == {}
    assert [step for step, _ in sink.checkpoints] == [2]
    saved = (tmp_path / "checkpoints").glob("checkpoint-*")
    assert sorted(p.name for p in saved) == ["checkpoint-2"]
    assert not (tmp_path / "model").exists()
    assert [e[0] for e in sink.events] == ["started", "canceled"]
    assert result.train_loss == sink.train_losses()[3]


def test_a_run_resumed_from_step_five_logs_the_losses_of_the_uninterrupted_run(
    base_model, export, tmp_path
):
    config = sections(max_steps=10, save_steps=5)
    whole = RecordingSink()
    first = run_training(spec(base_model, export, tmp_path / "whole", config), whole)
    assert first.status == "succeeded"
    assert [step for step, _ in whole.checkpoints] == [5, 10]
    # The caller stored checkpoint 5 and fetched it back elsewhere.
    fetched = tmp_path / "fetched" / "checkpoint-5"
    shutil.copytree(tmp_path / "whole" / "checkpoints" / "checkpoint-5", fetched)
    resumed = RecordingSink()
    second = run_training(
        spec(base_model, export, tmp_path / "resumed", config), resumed, resume_from=fetched
    )
    assert (second.status, second.steps) == ("succeeded", 10)
    after = resumed.train_losses()
    assert sorted(after) == [6, 7, 8, 9, 10]
    expected = {step: loss for step, loss in whole.train_losses().items() if step > 5}
    assert after == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert ("resumed", "resumed at step 5 of 10", "info") in resumed.events
    assert [step for step, _ in resumed.checkpoints] == [10]
    card = (second.model_dir / "README.md").read_text()
    assert "- Optimizer steps run: 10 (resumed from the checkpoint of step 5)\n" in card
    # The export has a validation split, but this config does not evaluate.
    assert "- Validation: none ([training.validation] does not ask for it)\n" in card
    assert whole.validation_losses() == {} == resumed.validation_losses()


def test_a_config_it_cannot_honour_is_refused_before_any_step(base_model, export, tmp_path):
    config = sections(max_steps=2)
    config["hyperparameters.parallelism"] = {"fsdp": True}
    config["compute"] = {"nodes": 2}
    sink = RecordingSink()
    with pytest.raises(TrainingRefused) as caught:
        run_training(spec(base_model, export, tmp_path, config), sink)
    assert caught.value.lines == [
        "[compute] nodes: the trl provider trains on one machine; remove it or set 1",
        "[hyperparameters.parallelism] fsdp: the trl provider trains in one process, FSDP "
        "shards across several; remove it or set false",
    ]
    assert sink.events == [] and not (tmp_path / "checkpoints").exists()


def test_rows_with_images_need_the_image_modality(base_model, export, tmp_path):
    config = sections(max_steps=2)
    config["job"]["modalities"] = ["text"]
    with pytest.raises(TrainingRefused) as caught:
        run_training(spec(base_model, export, tmp_path, config), RecordingSink())
    assert caught.value.lines == ['[job] modalities: the dataset\'s rows carry images; add "image"']


def test_a_validation_version_named_by_the_job_is_measured_whole(base_model, export, tmp_path):
    from dataclasses import replace

    config = sections(max_steps=2, save_steps=2)
    config["training.validation"] = {"eval_steps": 2}
    other = tmp_path / "other-version"
    shutil.copytree(export, other)
    sink = RecordingSink()
    run = replace(spec(base_model, export, tmp_path / "work", config), validation_dir=other)
    result = run_training(run, sink)
    assert sorted(sink.validation_losses()) == [2]
    card = (result.model_dir / "README.md").read_text()
    # Its train and validation splits, three rows each: all six are validation rows here.
    assert (
        "- Validation: every row of another dataset version's export (other-version), 6 rows\n"
        in card
    )
