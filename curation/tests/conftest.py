"""Fixtures for the dataset tests: real recorded episodes, and a helper to run commands."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.core.management import call_command

from rollouts.models import RolloutBatch
from rollouts.recording import services
from rollouts.rollout_settings import RolloutSettings


def record(*, seeds: tuple[int, ...] = (1, 2, 3), steps: int = 30, **kwargs) -> RolloutBatch:
    """A batch played for real, here (`rollout --inline`)."""
    kwargs.setdefault("policy", "scripted")
    batch = services.batch_run_inline(settings=RolloutSettings(seeds=seeds, steps=steps, **kwargs))
    assert batch.episodes_finished == batch.episodes_total, batch.error
    return batch


@pytest.fixture
def scripted_batch(db) -> RolloutBatch:
    return record()


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str

    @property
    def summary(self) -> dict:
        return json.loads(self.stdout.strip().splitlines()[-1])


def run(name: str, *args: str) -> Outcome:
    """Run a management command as from a shell: exit status, stdout and stderr."""
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command(name, *args, stdout=out, stderr=err)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    except Exception as exc:  # CommandError outside of run_from_argv: report like the CLI
        code = int(getattr(exc, "returncode", 1))
        err.write(f"{type(exc).__name__}: {exc}\n")
    return Outcome(code, out.getvalue(), err.getvalue())


def read_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]
