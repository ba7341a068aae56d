"""Idempotent submission: a worker SIGKILLed after the remote job exists, the task delivered
again, and still exactly one upload and one remote job on the provider."""

from __future__ import annotations

import os

import pytest

from studio.testing import backdate, celery_worker_running, subprocess_env
from training import services
from training.jobs import SUBMISSION
from training.models import TrainingJob
from training.tests.conftest import REFERENCE, SYNTH_KEY
from training.tests.test_submit import _submission, submit, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_creates_one_remote_job_when_the_worker_dies_after_creating_it(
    settings, synth_server, train_version
):
    env = subprocess_env(
        CELERY_BROKER_URL=os.environ["CELERY_BROKER_URL"],
        STUDIO_MEDIA_ROOT=str(settings.MEDIA_ROOT),
        SYNTH_API_KEY=SYNTH_KEY,
    )
    synth_server.honour_idempotency = False  # the row alone must prevent a second job
    synth_server.hold_start.clear()  # the start request hangs: the worker is mid-task
    with celery_worker_running(process=True, env=env) as first:
        outcome = submit(
            "--dataset-version", str(train_version.id), "--base-url", synth_server.base_url
        )
        assert outcome.code == 0, outcome.stderr
        job = TrainingJob.objects.get()
        assert synth_server.start_waiting.wait(120), "the worker never reached the start call"
        job.refresh_from_db()
        # The remote job exists and its id was stored before the worker went on.
        assert job.remote_job_id == "sft-2" and job.remote_training_file_id == "file-1"
        assert job.status == "uploading" and job.submitted_at is None
        first.kill_all()
    synth_server.hold_start.set()

    # The message comes back (the beat task re-sends a submission whose worker stopped
    # beating, as Redis redelivers an unacknowledged message); a new worker takes over the
    # dead worker's claim once it is stale.
    backdate(job, field="heartbeat_at", seconds=settings.STUDIO_TRAINING_STALE_SECONDS + 1)
    with celery_worker_running(process=True, env=env):
        assert SUBMISSION.requeue() == [job.id]
        job = wait_for(job, "submitted", "running", "succeeded", timeout=120)
    job = wait_for(job, "succeeded")
    assert len(synth_server.calls("POST", "/learning/files")) == 1
    assert len(synth_server.calls("POST", "/learning/jobs")) == 1
    assert list(synth_server.jobs) == ["sft-2"]
    assert job.attempts == 2
    assert job.fine_tuned_model == "ft:gpt-4o-mini:studio:crafter:abc123"


def test_it_adopts_the_openai_job_a_dead_worker_created_but_never_saved(
    openai_server, train_version
):
    job = services.training_job_create(
        submission=_submission(train_version, "openai", openai_server.base_url), enqueue=False
    )
    # A first attempt uploaded, asked for the job, and died before saving the job's id.
    assert services.training_job_submit(job_id=job.id) == "submitted"
    first_remote = TrainingJob.objects.get(id=job.id).remote_job_id
    TrainingJob.objects.filter(id=job.id).update(
        remote_job_id="", submitted_at=None, status="pending", create_attempts=1
    )
    assert services.training_job_submit(job_id=job.id) == "submitted"
    job.refresh_from_db()
    assert job.remote_job_id == first_remote
    assert len(openai_server.calls("POST", "/fine_tuning/jobs")) == 1
    assert len(openai_server.calls("GET", "/fine_tuning/jobs")) == 1  # the look-up
    assert len(openai_server.uploads) == 1
    assert REFERENCE.exists()
