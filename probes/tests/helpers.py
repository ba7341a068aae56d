"""What the probe tests share: recorded games and a command run as from a shell."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass

from django.core.management import call_command

from rollouts.models import RolloutBatch
from rollouts.tests.helpers import record_batch


def recorded(*, seeds: tuple[int, ...] = (1, 2, 3), steps: int = 40, **kwargs) -> RolloutBatch:
    """A batch played for real, here (`rollout --inline`)."""
    batch = record_batch(seeds=seeds, steps=steps, **kwargs)
    assert batch.episodes_finished == batch.episodes_total, batch.error
    return batch


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str

    @property
    def summary(self) -> dict:
        return json.loads(self.stdout.strip().splitlines()[-1])


def run(name: str, *args: str) -> Outcome:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command(name, *args, stdout=out, stderr=err)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    except Exception as exc:  # CommandError outside of run_from_argv: what the shell shows
        code = int(getattr(exc, "returncode", 1))
        err.write(f"{type(exc).__name__}: {exc}\n")
    return Outcome(code, out.getvalue(), err.getvalue())
