"""What the probe tests share: recorded games and a command run as from a shell."""

from __future__ import annotations

from rollouts.models import RolloutBatch
from rollouts.tests.helpers import record_batch
from studio.testing import run_command


def recorded(*, seeds: tuple[int, ...] = (1, 2, 3), steps: int = 40, **kwargs) -> RolloutBatch:
    """A batch played for real, here (`rollout --inline`)."""
    batch = record_batch(seeds=seeds, steps=steps, **kwargs)
    assert batch.episodes_finished == batch.episodes_total, batch.error
    return batch


# Commands run as from a shell, here.
run = run_command
