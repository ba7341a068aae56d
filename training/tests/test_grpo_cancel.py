"""Cancel of a GRPO job while its first iteration is being played: the train worker reads it
before the next episode and stops there, within the iteration (no update, no step 2); the
iteration and its batch are marked canceled and the job ends CANCELED through the normal
cancel path (the cancel task on a core worker, the provider, the poll)."""

from __future__ import annotations

import pytest

from rollouts.models import Episode
from studio.testing import wait_until
from training import services
from training.models import GrpoIteration, LocalRun, TrainingEvent
from training.tests.test_grpo_train import grpo_job, grpo_toml, job_episodes
from training.tests.test_submit import wait_for
from training.tests.test_trl_train import logs, worker_env, workers

pytestmark = pytest.mark.django_db(transaction=True)

SEEDS = 4  # 8 episodes an iteration: Cancel lands while some are still to be played


def test_cancel_stops_the_job_within_the_iteration_being_played(
    settings, fast_training, tmp_path, tiny_model
):
    with workers(worker_env(settings, tmp_path), tmp_path):
        job = grpo_job(grpo_toml(tiny_model, iterations=3, seeds=SEEDS))
        wait_until(
            lambda: job_episodes(job).filter(status=Episode.Status.FINISHED).exists(),
            timeout=150,
            every=0.05,
            what=lambda: f"the first episode to finish; logs:\n{logs(tmp_path)}",
        )
        services.training_job_cancel(job=job)
        job = wait_for(job, "canceled", "failed", "succeeded", timeout=90)
    assert job.status == "canceled", (job.error, logs(tmp_path))
    run = LocalRun.objects.get(job=job)
    assert run.status == "canceled" and run.cancel_requested
    assert run.step == 0 and not run.fine_tuned_model

    iteration = GrpoIteration.objects.get(job=job)  # the one iteration: no step 2
    assert iteration.number == 1 and iteration.status == "canceled"
    assert iteration.loss is None and iteration.batch.status == "canceled"
    statuses = list(job_episodes(job).values_list("status", flat=True))
    assert len(statuses) == 2 * SEEDS
    # Stopped between two episodes: the played ones finished, the rest never started.
    assert "canceled" in statuses and "running" not in statuses and "pending" not in statuses
    assert not TrainingEvent.objects.filter(job=job, type="model_stored").exists()
