"""Cancel of a `trl` job mid-training: the train worker reads the request after every step
and stops within a step or two; the job ends CANCELED through the normal cancel path (the
cancel task on a core worker, the provider, the poll)."""

from __future__ import annotations

import pytest

from studio.testing import wait_until
from training import services
from training.models import LocalRun, TrainingEvent
from training.tests.test_submit import wait_for
from training.tests.test_trl_train import (
    logs,
    submit_trl,
    trl_config,
    worker_env,
    workers,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_cancel_stops_the_run_within_a_step_or_two(
    settings,
    fast_training,
    tmp_path,
    tiny_model,
    train_version,
):
    config = trl_config(tmp_path, tiny_model, max_steps=60, save_steps=50)
    with workers(worker_env(settings, tmp_path), tmp_path):
        job = submit_trl(config, train_version)
        wait_until(
            lambda: LocalRun.objects.filter(job=job, step__gte=4).first(),
            timeout=150,
            every=0.1,
            what=lambda: f"the run to reach step 4; logs:\n{logs(tmp_path)}",
        )
        asked_at = LocalRun.objects.get(job=job).step
        services.training_job_cancel(job=job)
        job = wait_for(job, "canceled", "failed", "succeeded", timeout=60)
    assert job.status == "canceled", (job.error, logs(tmp_path))
    run = LocalRun.objects.get(job=job)
    assert run.status == "canceled" and run.cancel_requested
    # One step may be under way when Cancel is pressed, and one more between the request's
    # write and the worker's read after it.
    assert asked_at <= run.step <= asked_at + 2, (asked_at, run.step)
    assert run.step < 60 and not run.fine_tuned_model and not job.fine_tuned_model
    assert TrainingEvent.objects.filter(job=job, type="studio.cancel_sent").exists()
    assert not TrainingEvent.objects.filter(job=job, type="model_stored").exists()
