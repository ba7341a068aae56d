"""The New training job form with Model left empty: the model that played the dataset's turns
(and OpenAI's own config, which sends nothing OpenAI does not take)."""

from __future__ import annotations

import pytest

from curation.tests.conftest import record
from rollouts.tests.openai_server import tool_call
from studio.models import Endpoint
from training.config import config_load
from training.models import TrainingJob
from training.providers.base import JobSpec
from training.providers.openai import create_params, not_sent
from training.tests.conftest import REFERENCE, version_of, version_over

OPENAI_CONFIG = REFERENCE.with_name("crafter_vlm_openai.toml")
PLAYED_BY = "gpt-4o-2024-08-06"


@pytest.fixture
def trainer(db) -> Endpoint:
    return Endpoint.objects.create(
        name="trainer", kind="openai", base_url="http://127.0.0.1:9/v1", api_key_env="OPENAI_KEY"
    )


@pytest.fixture
def played(chat_server):
    chat_server.default = tool_call("move_left", "do")
    return lambda model, seed: record(
        policy="openai", model=model, base_url=chat_server.url, seeds=(seed,), steps=4
    )


def form_data(version, **extra) -> dict:
    return {
        "dataset_version": version.id,
        "provider": "openai",
        "endpoint": "trainer",
        "model": "",
        # synth-ai's reference: its [job] model is openai/gpt-4o-mini-2024-07-18.
        "config": REFERENCE.read_text(),
        "action": "submit",
        **extra,
    }


def test_it_fine_tunes_the_model_that_played_when_model_is_left_empty(
    client, admin_user, trainer, played
):
    version = version_over(played(PLAYED_BY, 1), name="played by one model")
    client.force_login(admin_user)
    response = client.post("/training/new/", form_data(version))
    assert response.status_code == 302, response.content.decode()[-2000:]
    assert TrainingJob.objects.get().model == PLAYED_BY


def test_it_takes_the_model_given_over_the_one_that_played(client, admin_user, trainer, played):
    version = version_over(played(PLAYED_BY, 1), name="played by one model")
    client.force_login(admin_user)
    client.post("/training/new/", form_data(version, model="gpt-4.1-mini-2025-04-14"))
    assert TrainingJob.objects.get().model == "gpt-4.1-mini-2025-04-14"


def test_it_asks_which_model_when_several_played(client, admin_user, trainer, played):
    version = version_over(played(PLAYED_BY, 1), played("gpt-4.1-2025-04-14", 2), name="two")
    client.force_login(admin_user)
    response = client.post("/training/new/", form_data(version))
    assert response.status_code == 200
    assert (
        "the dataset&#x27;s turns were played by 2 models (gpt-4.1-2025-04-14, gpt-4o-2024-08-06): "
        "name the one to fine-tune"
    ) in response.content.decode()
    assert not TrainingJob.objects.exists()


def test_it_keeps_the_configs_model_when_no_model_played(client, admin_user, trainer):
    version = version_of(seeds=(1,), steps=12, name="scripted")
    client.force_login(admin_user)
    response = client.post("/training/new/", form_data(version))
    assert response.status_code == 302
    assert TrainingJob.objects.get().model == "openai/gpt-4o-mini-2024-07-18"


def test_it_ships_an_openai_config_with_nothing_openai_does_not_take():
    config = config_load(OPENAI_CONFIG.read_text(encoding="utf-8"))
    spec = JobSpec(config=config, model=config.model, training_file_id="file-abc")
    assert not_sent(spec) == []
    assert create_params(spec) == {
        "model": "gpt-4o-2024-08-06",
        "training_file": "file-abc",
        "method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 3}}},
        "suffix": "crafter",
        "seed": 42,
    }
    # synth-ai's reference, by contrast: [job] 2, [compute] 3, [training] 1, [data] 1,
    # [hyperparameters] 5 settings and 2 whole sections that OpenAI has no place for.
    reference = config_load(REFERENCE.read_text(encoding="utf-8"))
    assert len(not_sent(JobSpec(config=reference, model="m", training_file_id="f"))) == 14
