"""The config's rule for a GRPO run: no epochs (it trains for `[training.grpo] iterations`
on the episodes it plays), so `[hyperparameters]` and its `n_epochs` may be absent; every
other config still needs both. Pure: no database."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.config import ConfigError, config_is_grpo, config_load

GRPO_TOML = Path(__file__).resolve().parents[1] / "configs" / "crafter_vlm_grpo.toml"

GRPO_BARE = """\
[job]
model = "tiny"

[training]
mode = "grpo"

[training.grpo]
group_size = 2
"""


def errors(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        config_load(text)
    return caught.value.lines()


def test_a_grpo_config_needs_no_hyperparameters_section():
    config = config_load(GRPO_BARE)
    assert config.sections["training"] == {"mode": "grpo"}
    assert config.get("training.grpo", "group_size") == 2
    assert "hyperparameters" not in config.sections
    assert config_is_grpo(config.sections)


def test_a_grpo_config_needs_no_epochs_in_its_hyperparameters():
    config = config_load(GRPO_BARE + "\n[hyperparameters]\nlearning_rate = 1e-5\n")
    assert config.sections["hyperparameters"] == {"learning_rate": 1e-5}


def test_any_other_config_still_needs_the_section_and_its_epochs():
    sft = GRPO_BARE.replace('mode = "grpo"', 'mode = "sft_offline"').replace(
        "[training.grpo]\ngroup_size = 2\n", ""
    )
    assert errors(sft) == ["[hyperparameters]: missing section"]
    # The section present without n_epochs: the key is named, with the section's line
    # (two blank lines after `mode`, then the header on line 8).
    assert errors(sft + "\n[hyperparameters]\nlearning_rate = 1e-5\n") == [
        "[hyperparameters] n_epochs (line 8): missing required key"
    ]
    # No [training] at all is not GRPO either.
    no_mode = '[job]\nmodel = "tiny"\n'
    assert errors(no_mode) == ["[hyperparameters]: missing section"]


def test_the_grpo_keys_are_still_checked_one_line_each():
    text = GRPO_BARE.replace("group_size = 2", "group_size = 1\nseeds_per_iteration = 0")
    assert errors(text) == [
        "[training.grpo] group_size (line 8): 1 is below the minimum 2",
        "[training.grpo] seeds_per_iteration (line 9): 0 is below the minimum 1",
    ]
    assert errors(GRPO_BARE.replace('"grpo"', '"grpo2"'))[0].startswith(
        "[training] mode (line 5): 'grpo2' is not one of 'sft_offline', 'grpo'"
    )


def test_the_sample_grpo_config_loads_as_shipped():
    config = config_load(GRPO_TOML.read_text())
    assert config_is_grpo(config.sections)
    # Values read by hand from training/configs/crafter_vlm_grpo.toml.
    assert config.get("training.grpo", "reward") == "crafter"
    assert config.get("training.grpo", "group_size") == 4
    assert config.get("training.grpo", "seeds_per_iteration") == 2
    assert config.get("training.grpo", "steps_per_episode") == 32
    assert config.get("training.grpo", "iterations") == 10
    assert config.get("hyperparameters", "n_epochs") is None


def test_is_grpo_reads_a_raw_table_of_any_shape():
    assert not config_is_grpo({})
    assert not config_is_grpo({"training": "grpo"})
    assert not config_is_grpo({"training": {"mode": "sft_offline"}})
    assert config_is_grpo({"training": {"mode": "grpo"}})
