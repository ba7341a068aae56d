"""A GRPO train worker SIGKILLed during iteration 2, after iteration 1's checkpoint is in
storage: its run's claim goes stale, the periodic requeue sends the run again (never its
half-played episodes: only a train worker holds the model), and the next worker resumes
from the checkpoint: iteration 2 is removed and played again, recorded once, and every
episode is the one an uninterrupted run of the same config plays (CPU, seeded)."""

from __future__ import annotations

import pytest

from rollouts.models import Episode
from studio.jobs import jobs_requeue
from studio.testing import backdate, wait_until
from training.models import GrpoIteration, LocalRun, LocalRunEvent
from training.tests.test_grpo_train import grpo_job, grpo_toml, job_episodes, played
from training.tests.test_submit import wait_for
from training.tests.test_trl_train import logs, start_worker, worker_env, workers

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_killed_grpo_worker_is_resumed_and_plays_what_it_would_have(
    settings, fast_training, tmp_path, tiny_model
):
    env = worker_env(settings, tmp_path)
    with workers(env, tmp_path) as started:
        whole = grpo_job(grpo_toml(tiny_model))
        whole = wait_for(whole, "succeeded", "failed", "canceled", timeout=300)
        assert whole.status == "succeeded", (whole.error, logs(tmp_path))

        job = grpo_job(grpo_toml(tiny_model))
        # Iteration 1's checkpoint stored, iteration 2 under way.
        wait_until(
            lambda: (
                LocalRun.objects.filter(job=job, checkpoint_step=1).exists()
                and job_episodes(job)
                .filter(batch__grpo_iteration__number=2, status=Episode.Status.FINISHED)
                .exists()
            ),
            timeout=300,
            every=0.05,
            what=lambda: f"iteration 2 under way; logs:\n{logs(tmp_path)}",
        )
        started["train"].kill_all()
        run = LocalRun.objects.get(job=job)
        assert run.step == 1 and run.status == "running"
        half = job_episodes(job).filter(batch__grpo_iteration__number=2)
        assert half.exclude(status=Episode.Status.FINISHED).exists()

        # Nothing renews the claims: once stale, the requeue sends the run again, and none
        # of the episodes (a rollouts worker could not play them).
        backdate(run, field="heartbeat_at", seconds=settings.STUDIO_TRAINING_RUN_STALE_SECONDS + 1)
        for episode in half.filter(status=Episode.Status.RUNNING):
            backdate(
                episode, field="heartbeat_at", seconds=settings.STUDIO_EPISODE_STALE_SECONDS + 1
            )
        sent = jobs_requeue()
        assert (sent["training_local_run"], sent["episode"]) == (1, 0)
        started["again"] = start_worker(
            env, queues="train", name="train-again", log=tmp_path / "t2.log"
        )
        job = wait_for(job, "succeeded", "failed", "canceled", timeout=300)
    assert job.status == "succeeded", (job.error, logs(tmp_path))
    run.refresh_from_db()
    assert (run.attempts, run.step) == (2, 2)

    assert list(GrpoIteration.objects.filter(job=job).values_list("number", "status")) == [
        (1, "complete"),
        (2, "complete"),
    ]
    assert job_episodes(job).count() == 8
    assert set(job_episodes(job).values_list("status", flat=True)) == {"finished"}
    removed = LocalRunEvent.objects.get(run=run, type="iterations_removed")
    assert removed.data["removed"] == [2]
    # The loss curve holds each iteration once.
    points = LocalRunEvent.objects.filter(run=run, kind="metric", name="train")
    assert sorted(points.values_list("step", flat=True)) == [1, 2]

    # The same episodes as the uninterrupted run: rewards and actions, turn by turn.
    assert played(job) == played(whole)
