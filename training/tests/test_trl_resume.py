"""A train worker SIGKILLed mid-training: its claim goes stale, the periodic requeue sends
the run again, and the next train worker resumes from the last checkpoint in storage (not
from step 0); the finished run has as many steps as an uninterrupted one, and the loss curve
holds each step once."""

from __future__ import annotations

from collections import Counter

import pytest

from studio.jobs import jobs_requeue
from studio.testing import backdate, wait_until
from training.models import LocalRun, LocalRunEvent, TrainingEvent
from training.tests.test_submit import wait_for
from training.tests.test_trl_train import (
    logs,
    start_worker,
    submit_trl,
    trl_config,
    worker_env,
    workers,
)

pytestmark = pytest.mark.django_db(transaction=True)


STEPS, SAVE = 24, 8


def test_a_killed_worker_is_resumed_from_its_checkpoint_by_the_next(
    settings,
    fast_training,
    tmp_path,
    tiny_model,
    train_version,
):
    config = trl_config(tmp_path, tiny_model, max_steps=STEPS, save_steps=SAVE)
    env = worker_env(settings, tmp_path)
    with workers(env, tmp_path) as started:
        job = submit_trl(config, train_version)
        # Past the first checkpoint in storage, before the second.
        run = wait_until(
            lambda: LocalRun.objects.filter(
                job=job, checkpoint_step=SAVE, step__gte=SAVE + 2
            ).first(),
            timeout=150,
            every=0.05,
            what=lambda: f"a checkpoint and two steps more; logs:\n{logs(tmp_path)}",
        )
        started["train"].kill_all()
        killed_at = LocalRun.objects.get(id=run.id).step
        assert SAVE < killed_at < STEPS

        # Nothing renews the claim any more: once stale, the beat's requeue sends it again.
        backdate(run, field="heartbeat_at", seconds=settings.STUDIO_TRAINING_RUN_STALE_SECONDS + 1)
        assert jobs_requeue()["training_local_run"] == 1
        started["again"] = start_worker(
            env, queues="train", name="train-again", log=tmp_path / "t2.log"
        )
        job = wait_for(job, "succeeded", "failed", "canceled", timeout=150)
    assert job.status == "succeeded", (job.error, logs(tmp_path))
    run.refresh_from_db()
    assert run.attempts == 2 and run.step == STEPS

    resumed = list(
        TrainingEvent.objects.filter(job=job, type="resumed").values_list("message", flat=True)
    )
    assert f"resumed from step {SAVE}" in resumed, resumed
    train_steps = list(
        TrainingEvent.objects.filter(job=job, train_loss__isnull=False).values_list(
            "step", flat=True
        )
    )
    assert sorted(train_steps) == list(range(1, STEPS + 1))
    points = LocalRunEvent.objects.filter(run=run, kind="metric", name="train")
    assert max(Counter(points.values_list("step", flat=True)).values()) == 1
