"""What the poll reads of a `trl` run, and the job page it makes, on PostgreSQL and on `make
demo`'s settings (SQLite, DEBUG=1: `test_the_page_on_the_demos_sqlite` runs this module's
first test again in a child process). No training: a run's rows are written through the
worker's own sink, as a train worker writes them, under a claim taken as a worker takes it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from django.db import connection

from studio.testing import pytest_on_demo_settings
from training import services
from training.jobs import LOCAL_RUN
from training.local_run_worker import MAX_RUN_EVENTS, RunSink
from training.models import LocalRun, LocalRunEvent, TrainingEvent
from training.submission import submission_build

TRL_TOML = Path(__file__).resolve().parents[1] / "configs" / "crafter_vlm_trl.toml"

pytestmark = pytest.mark.django_db


def submitted_trl_job(version):
    submission = submission_build(
        config_text=TRL_TOML.read_text(), provider="trl", version_id=version.id
    )
    job = services.training_job_create(submission=submission, enqueue=False)
    assert services.training_job_submit(job_id=job.id) == "submitted"
    job.refresh_from_db()
    return job


def test_the_page_follows_a_run_from_waiting_to_its_loss(client, viewer, train_version):
    job = submitted_trl_job(train_version)
    client.force_login(viewer)
    services.training_job_poll(job_id=job.id)
    page = client.get(f"/training/{job.id}/").content.decode()
    assert "Waiting for a train worker" in page
    assert "waiting_for_a_train_worker" in page

    run = LocalRun.objects.get(job=job)
    token = LOCAL_RUN.claim(run.id)
    sink = RunSink(run, LOCAL_RUN.held(run.id, token))
    sink.event("started", "training 10 steps", data={"steps": 10})
    for step, loss in ((1, 2.5), (2, 2.0), (3, 1.5)):
        sink.metrics(step, train_loss=loss, validation_loss=None)
    sink.metrics(2, train_loss=None, validation_loss=2.25)
    # A step logged again (a resumed run) keeps its first point.
    sink.metrics(3, train_loss=9.0, validation_loss=None)
    assert not sink.should_stop()

    assert services.training_job_poll(job_id=job.id) == "running"
    train = TrainingEvent.objects.filter(job=job, train_loss__isnull=False).order_by("step")
    assert list(train.values_list("step", "train_loss")) == [(1, 2.5), (2, 2.0), (3, 1.5)]
    validation = TrainingEvent.objects.filter(job=job, validation_loss__isnull=False)
    assert list(validation.values_list("step", "validation_loss")) == [(2, 2.25)]

    page = client.get(f"/training/{job.id}/").content.decode()
    assert "Waiting for a train worker" not in page
    assert "Step 3 of 10" in page
    assert "train loss (3)" in page and "validation loss (1)" in page
    assert "training 10 steps" in page


def test_cancel_is_read_after_the_next_step_and_events_are_bounded(train_version):
    job = submitted_trl_job(train_version)
    run = LocalRun.objects.get(job=job)
    token = LOCAL_RUN.claim(run.id)
    sink = RunSink(run, LOCAL_RUN.held(run.id, token))
    for n in range(MAX_RUN_EVENTS + 5):
        sink.event("note", f"note {n}")
    sink.event("broken", "an error is kept past the cap", level="error")
    events = LocalRunEvent.objects.filter(run=run, kind="event")
    assert events.count() == MAX_RUN_EVENTS + 1
    assert events.filter(level="error").count() == 1

    assert not sink.should_stop()
    services.training_job_cancel_remote(job_id=job.id)
    assert sink.should_stop()


def test_a_run_nobody_took_is_canceled_at_once(train_version):
    job = submitted_trl_job(train_version)
    services.training_job_cancel_remote(job_id=job.id)
    job.refresh_from_db()
    assert job.status == "canceled"
    run = LocalRun.objects.get(job=job)
    assert run.status == "canceled"
    # Never taken afterwards, whatever message comes.
    assert LOCAL_RUN.claim(run.id) is None


def test_the_page_on_the_demos_sqlite(tmp_path):
    """The first test again in a child pytest on `make demo`'s settings: an SQLite database,
    the filesystem broker, DEBUG=1."""
    if connection.vendor == "sqlite":
        pytest.skip("this is the run it starts")
    test = f"{Path(__file__)}::test_the_page_follows_a_run_from_waiting_to_its_loss"
    result = pytest_on_demo_settings(tmp_path, test)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert "1 passed" in result.stdout, result.stdout[-2000:]
