"""Ways to make real rollout data in tests: the real services, the real recorder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connection

from rollouts.models import Episode, Frame, RolloutBatch, Turn
from rollouts.recording import services
from rollouts.rollout_settings import RolloutSettings

ROOT = Path(__file__).resolve().parents[2]

# The Redis the tests share (make test sets it); tests of what lives in Redis skip without it.
REDIS_URL = os.environ.get("CELERY_BROKER_URL", "")
needs_redis = pytest.mark.skipif(
    not REDIS_URL.startswith("redis://"), reason="needs CELERY_BROKER_URL=redis://..."
)


def record_batch(**settings_kwargs) -> RolloutBatch:
    """Create a batch and play its episodes here, as `rollout --inline` does."""
    settings_kwargs.setdefault("policy", "scripted")
    return services.batch_run_inline(settings=RolloutSettings(**settings_kwargs))


def seed_episode(*, turns: int, observation: str, model_text: str) -> Episode:
    """An episode of `turns` turns written with bulk_create (no game played, no PNG stored):
    turn i's observation and model text are `observation` and `model_text` formatted with
    i, its frame's sha256 is sha256(str(i)) and each of its four vitals is i % 10."""
    import hashlib

    batch = services.batch_create(
        settings=RolloutSettings(policy="scripted", seeds=(1,), steps=turns), enqueue=False
    )
    episode = batch.episodes.get()
    frames = Frame.objects.bulk_create(
        Frame(
            episode=episode,
            step=i,
            sha256=hashlib.sha256(str(i).encode()).hexdigest(),
            image=f"frames/{i}.png",
            width=64,
            height=64,
            state={"vitals": dict.fromkeys(("health", "food", "drink", "energy"), i % 10)},
        )
        for i in range(turns)
    )
    Turn.objects.bulk_create(
        (
            Turn(
                episode=episode,
                index=i,
                frame=frame,
                observation_text=observation.format(i=i),
                model_text=model_text.format(i=i),
                actions=["noop"],
            )
            for i, frame in enumerate(frames)
        ),
        batch_size=2000,
    )
    Episode.objects.filter(id=episode.id).update(status=Episode.Status.FINISHED, steps=turns)
    episode.refresh_from_db()
    return episode


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment for a child process that uses this test's database."""
    db = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    env = {**os.environ, "DATABASE_URL": url, "SECRET_KEY": "test-only", **extra}
    return env


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run_python("manage.py", *args, env=env)


def run_python(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """This interpreter in a child process, in the project's folder, its output captured."""
    return start_python(*args, env=env).communicate_all()


class _Child(subprocess.Popen):
    def communicate_all(self, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """Its output once it has exited (killed after `timeout` seconds)."""
        try:
            out, err = self.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.communicate()
            raise
        return subprocess.CompletedProcess(self.args, self.returncode, out, err)


def start_python(*args: str, env: dict[str, str]) -> _Child:
    """`run_python`, started and left running: read it with `communicate_all`."""
    return _Child(
        [sys.executable, *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
