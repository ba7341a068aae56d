"""Fixtures for the training tests: finished dataset versions and local provider servers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User

from curation import services as dataset_services
from curation.export_options import ExportOptions
from curation.models import DatasetVersion
from curation.tests.conftest import record
from rollouts.models import RolloutBatch
from rollouts.review.turn_selection import TurnSelection
from training.tests.servers import OpenAIFineTuningServer, SynthServer

REFERENCE = Path(__file__).resolve().parents[1] / "configs" / "crafter_vlm_gpt4o.toml"
SYNTH_KEY = "sk-synth-SECRET-4f1c9a77e2"
OPENAI_KEY = "sk-openai-SECRET-0b3d5e8f91"


def version_of(*, seeds: tuple[int, ...], steps: int, name: str, **playing) -> DatasetVersion:
    """A dataset over a freshly played batch, exported for real (the studio format);
    `playing`: how it is played (`record`'s policy, model, ...), scripted by default."""
    return version_over(record(seeds=seeds, steps=steps, **playing), name=name)


def version_over(*batches: RolloutBatch, name: str) -> DatasetVersion:
    """A dataset over these batches, exported for real (the studio format)."""
    filters = TurnSelection(batches=tuple(batch.id for batch in batches))
    dataset = dataset_services.dataset_create(name=name, filters=filters, options=ExportOptions())
    version = dataset_services.dataset_version_create(dataset=dataset, enqueue=False)
    assert dataset_services.dataset_version_export(version_id=version.id) == "done"
    version.refresh_from_db()
    return version


@pytest.fixture
def train_version(db) -> DatasetVersion:
    return version_of(seeds=(1,), steps=12, name="crafter train")


@pytest.fixture
def val_version(db) -> DatasetVersion:
    return version_of(seeds=(2,), steps=4, name="crafter val")


@pytest.fixture
def fast_training(settings, monkeypatch) -> None:
    settings.STUDIO_OPENAI_BACKOFF_BASE = 0.01
    settings.STUDIO_OPENAI_BACKOFF_MAX = 0.05
    settings.STUDIO_TRAINING_POLL_SECONDS = 0.2
    settings.STUDIO_TRAINING_MAX_RETRIES = 3
    monkeypatch.setenv("SYNTH_API_KEY", SYNTH_KEY)
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)


@pytest.fixture
def synth_server(fast_training) -> Iterator[SynthServer]:
    server = SynthServer().start()
    yield server
    server.stop()


@pytest.fixture
def openai_server(fast_training) -> Iterator[OpenAIFineTuningServer]:
    server = OpenAIFineTuningServer().start()
    yield server
    server.stop()


@pytest.fixture
def submitter(db) -> User:
    user = User.objects.create_user("trainer", password="trainer-pass-123")
    user.user_permissions.add(Permission.objects.get(codename="submit_job"))
    return user


@pytest.fixture
def reference_toml() -> str:
    return REFERENCE.read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """The tiny Qwen2-VL (random weights of seed 0), built once: runs only read it."""
    from training.open_models.tiny import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("tiny-vlm") / "model", seed=0)
