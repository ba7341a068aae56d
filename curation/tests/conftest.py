"""Fixtures for the dataset tests: real recorded episodes, and a helper to run commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollouts.models import RolloutBatch
from rollouts.recording import services
from rollouts.rollout_settings import RolloutSettings
from studio.testing import CommandOutcome, run_command


def record(*, seeds: tuple[int, ...] = (1, 2, 3), steps: int = 30, **kwargs) -> RolloutBatch:
    """A batch played for real, here (`rollout --inline`)."""
    kwargs.setdefault("policy", "scripted")
    batch = services.batch_run_inline(settings=RolloutSettings(seeds=seeds, steps=steps, **kwargs))
    assert batch.episodes_finished == batch.episodes_total, batch.error
    return batch


@pytest.fixture
def scripted_batch(db) -> RolloutBatch:
    return record()


# Commands run as from a shell, here; `run` and `Outcome` are what these tests call them.
run = run_command
Outcome = CommandOutcome


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]
