"""The strict config loader: the reference file passes; every kind of mistake names its line."""

from __future__ import annotations

import pytest

from training.config import ConfigError, config_load, reference_text
from training.tests.conftest import REFERENCE


def errors(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        config_load(text)
    return caught.value.lines()


def test_it_loads_the_reference_file_shipped_in_the_repository():
    text = reference_text()
    assert text == REFERENCE.read_text()
    config = config_load(text)
    # Values read by hand from synth-ai's configs/crafter_vlm_gpt4o.toml.
    assert config.model == "openai/gpt-4o-mini-2024-07-18"
    assert config.get("job", "modalities") == ["text", "image"]
    assert config.sections["compute"] == {"gpu_type": "A100", "gpu_count": 1, "nodes": 1}
    assert config.get("data", "topology") == {}
    assert config.sections["training"] == {"mode": "sft_offline", "use_qlora": False}
    assert config.get("training.validation", "eval_steps") == 50
    assert config.get("training.validation", "metric_for_best_model") == "val.loss"
    assert config.get("hyperparameters", "gradient_accumulation_steps") == 32
    assert config.get("hyperparameters", "learning_rate") == 1e-5
    assert config.get("hyperparameters", "weight_decay") == 0.01
    assert config.get("hyperparameters.parallelism", "deepspeed_stage") == 2
    assert config.line_of("hyperparameters", "learning_rate") == 34


def test_it_names_an_unknown_key_its_line_and_the_likely_key():
    text = reference_text().replace("learning_rate = 1e-5", "learning_rte = 1e-5")
    assert errors(text) == [
        "[hyperparameters] learning_rte (line 34): unknown key; did you mean learning_rate?"
    ]


def test_it_reports_every_error_at_once_in_line_order():
    text = (
        reference_text()
        .replace("gpu_count = 1", 'gpu_count = "1"')
        .replace('evaluation_strategy = "steps"', 'evaluation_strategy = "step"')
        .replace("warmup_ratio = 0.03", "warmup_ratio = 1.5")
        .replace("deepspeed_stage = 2", "deepspeed_stage = 5")
        .replace("use_qlora = false", "use_qlora = 0")
    )
    assert errors(text) == [
        "[compute] gpu_count (line 9): must be an integer, not a string '1'",
        "[training] use_qlora (line 18): must be true or false, not an integer 0",
        "[training.validation] evaluation_strategy (line 22): 'step' is not one of "
        "'steps', 'epoch', 'no'; did you mean steps?",
        "[hyperparameters] warmup_ratio (line 35): 1.5 is above the maximum 1",
        "[hyperparameters.parallelism] deepspeed_stage (line 40): 5 is not one of 0, 1, 2, 3",
    ]


def test_it_refuses_unknown_sections_with_a_suggestion():
    text = reference_text().replace("[hyperparameters.parallelism]", "[hyperparameters.paralelism]")
    text += "\n[hyperparameter]\nn_epochs = 2\n"
    assert errors(text) == [
        "[hyperparameters.paralelism] (line 38): unknown section; "
        "did you mean [hyperparameters.parallelism]?",
        "[hyperparameter] (line 46): unknown section; did you mean [hyperparameters]?",
    ]


def test_it_names_missing_required_keys_and_sections():
    text = reference_text().replace('model = "openai/gpt-4o-mini-2024-07-18"\n', "")
    assert errors(text) == ["[job] model (line 1): missing required key"]
    without_hp = reference_text().split("[hyperparameters]")[0]
    assert errors(without_hp) == ["[hyperparameters]: missing section"]


def test_it_reports_toml_syntax_errors_with_their_line():
    text = reference_text().replace("nodes = 1", "nodes = = 1")
    assert errors(text) == ["config (line 10): not valid TOML: Invalid value"]


def test_it_refuses_wrong_types_in_arrays_and_values_out_of_range():
    text = (
        reference_text()
        .replace('modalities = ["text", "image"]', 'modalities = ["text", "audio"]')
        .replace("n_epochs = 1", "n_epochs = 0")
        .replace("learning_rate = 1e-5", "learning_rate = nan")
    )
    assert errors(text) == [
        "[job] modalities (line 3): 'audio' is not one of text, image",
        "[hyperparameters] n_epochs (line 29): 0 is below the minimum 1",
        "[hyperparameters] learning_rate (line 34): must be a finite number",
    ]


def test_it_says_where_a_key_outside_any_section_belongs():
    assert errors('n_epochs = 1\n[job]\nmodel = "m"\n[hyperparameters]\nn_epochs = 1\n') == [
        "config n_epochs (line 1): a key outside any section; it belongs under [hyperparameters]"
    ]


def test_it_checks_dataset_references_through_the_resolver():
    text = reference_text().replace('# data = "examples', 'data = 999\n# x = "')

    def resolve(section, key, value):
        return f"no dataset version {value}" if value == 999 else None

    with pytest.raises(ConfigError) as caught:
        config_load(text, resolve_dataset=resolve)
    assert caught.value.lines() == ["[job] data (line 4): no dataset version 999"]


def test_it_refuses_a_value_where_a_section_belongs():
    text = reference_text().replace("use_qlora = false", "use_qlora = false\nvalidation = 1")
    text = text[: text.index("[training.validation]")] + text[text.index("[hyperparameters]") :]
    assert errors(text) == [
        "[training] validation (line 19): must be the table [training.validation]"
    ]
