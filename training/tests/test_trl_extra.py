"""A train worker without the `.[train]` extra: the run fails with one line saying what is
missing and how to install it, and the job page shows it as the job's error.

The worker is a real `celery -A studio worker -Q train` process whose interpreter cannot
import torch: `sys.modules["torch"] = None` is set before Celery starts (what Python does
for a module that is not installed: `import torch` raises ImportError)."""

from __future__ import annotations

import pytest

from training.models import LocalRun
from training.tests.test_submit import wait_for
from training.tests.test_trl_train import (
    TRL_TOML,
    logs,
    start_worker,
    submit_trl,
    worker_env,
    workers,
)

pytestmark = pytest.mark.django_db(transaction=True)
NO_TORCH = "import sys\nsys.modules['torch'] = None"


def test_a_worker_without_the_extra_fails_the_run_with_one_line(
    settings, fast_training, tmp_path, train_version, client, viewer
):
    env = worker_env(settings, tmp_path)
    with workers(env, tmp_path, train=False) as started:
        started["train"] = start_worker(
            env, queues="train", name="no-torch", log=tmp_path / "t.log", prelude=NO_TORCH
        )
        job = submit_trl(TRL_TOML, train_version)
        job = wait_for(job, "failed", "succeeded", "canceled", timeout=90)
    assert job.status == "failed", logs(tmp_path)
    assert "\n" not in job.error
    assert job.error.startswith("this worker lacks the training extra (")
    assert "torch" in job.error and "pip install -e '.[train]'" in job.error
    assert LocalRun.objects.get(job=job).status == "failed"
    client.force_login(viewer)
    page = client.get(f"/training/{job.id}/").content.decode()
    assert job.error.replace("'", "&#x27;") in page
