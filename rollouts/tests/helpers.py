"""Ways to make real rollout data in tests: the real services, the real recorder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from django.db import connection

from rollouts import services
from rollouts.models import RolloutBatch
from rollouts.rollout_settings import RolloutSettings

ROOT = Path(__file__).resolve().parents[2]


def record_batch(**settings_kwargs) -> RolloutBatch:
    """Create a batch and play its episodes here, as `rollout --inline` does."""
    settings_kwargs.setdefault("policy", "scripted")
    return services.batch_run_inline(settings=RolloutSettings(**settings_kwargs))


def subprocess_env(**extra: str) -> dict[str, str]:
    """The environment for a child process that uses this test's database."""
    db = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    env = {**os.environ, "DATABASE_URL": url, "SECRET_KEY": "test-only", **extra}
    return env


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=600,
    )
