"""Job kinds (`studio.jobs`) on real PostgreSQL, Redis and a real Celery worker: a claim's
token decides every write, errors are cut to one cap, a job saved while the broker is down
is sent by the one beat task once it is back, and that task re-sends every kind.

Expected values are worked out by hand from the rows as written.
"""

from __future__ import annotations

import base64
import json
import logging
import uuid

import pytest
from django.conf import settings as django_settings
from django.db import transaction
from django.db.models import F

from curation.jobs import EXPORT, IMPORT
from curation.models import Dataset, DatasetImport, DatasetVersion
from probes.jobs import PROBE_CHUNK
from probes.models import ProbeRun, ProbeRunChunk, ProbeSet
from rollouts.jobs import BULK_FLAG, EPISODE
from rollouts.models import RolloutBatch, TurnBulkFlag
from rollouts.recording import services as recording
from rollouts.rollout_settings import RolloutSettings
from rollouts.tests.helpers import REDIS_URL, needs_redis
from studio import jobs
from studio.celery import app
from studio.jobs import ERROR_CAP, ClaimLost, JobKind
from studio.tasks import jobs_requeue
from studio.testing import JOB_ENDS, backdate, queue_purge, wait_for_row
from training import services as training_services
from training.jobs import CANCEL_TASK, LOCAL_RUN, SUBMISSION
from training.models import LocalRun, TrainingJob


def _bulk_flag() -> TurnBulkFlag:
    return TurnBulkFlag.objects.create(filters={}, flagged=True)


def _version() -> DatasetVersion:
    dataset = Dataset.objects.create(name=f"d-{uuid.uuid4().hex[:6]}")
    return DatasetVersion.objects.create(dataset=dataset, number=1)


def _training_job(version: DatasetVersion | None = None, **fields) -> TrainingJob:
    return TrainingJob.objects.create(
        dataset_version=version or _version(),
        base_url="http://127.0.0.1:9",
        model="m",
        config_toml="",
        idempotency_key=uuid.uuid4().hex,
        **fields,
    )


# -- the declaration -------------------------------------------------------------------------


def test_every_app_registers_its_kinds_and_each_names_a_registered_task():
    app.loader.import_default_modules()
    kinds = {kind.name: kind for kind in jobs.job_kinds()}
    assert kinds == {
        "episode": EPISODE,
        "bulk_flag": BULK_FLAG,
        "export": EXPORT,
        "import": IMPORT,
        "training_submission": SUBMISSION,
        "training_local_run": LOCAL_RUN,
        "probe_chunk": PROBE_CHUNK,
    }
    for kind in kinds.values():
        assert kind.task in app.tasks, kind.name
        assert isinstance(getattr(django_settings, kind.stale_setting), int), kind.name
    assert CANCEL_TASK in app.tasks


def test_one_beat_entry_requeues_every_kind_and_no_other_requeue_task_is_left():
    app.loader.import_default_modules()
    beat = {entry["task"] for entry in django_settings.CELERY_BEAT_SCHEDULE.values()}
    assert beat == {"studio.tasks.jobs_requeue", "training.tasks.training_jobs_poll"}
    requeues = {name for name in app.tasks if "requeue" in name}
    assert requeues == {"studio.tasks.jobs_requeue"}


def test_a_kind_declared_twice_differently_is_refused():
    other = JobKind(
        name="bulk_flag", model=TurnBulkFlag, task="elsewhere", stale_setting="X_SECONDS"
    )
    with pytest.raises(ValueError, match="declared twice"):
        jobs.register(other)
    assert jobs.register(BULK_FLAG) is BULK_FLAG


def test_the_stale_window_is_the_setting_read_at_each_call(settings):
    settings.STUDIO_EXPORT_STALE_SECONDS = 7
    assert EXPORT.stale_after().total_seconds() == 7
    settings.STUDIO_EXPORT_STALE_SECONDS = 9
    assert EXPORT.stale_after().total_seconds() == 9


# -- a worker's claim ----------------------------------------------------------------------


@pytest.mark.django_db
def test_every_write_goes_through_the_claims_token():
    job = _bulk_flag()
    token = BULK_FLAG.claim(job.id)
    assert token is not None
    assert BULK_FLAG.claim(job.id) is None
    assert BULK_FLAG.unclaimed(job.id) == "busy"
    assert not BULK_FLAG.renew(job.id, "another", changed=5)
    with pytest.raises(ClaimLost):
        BULK_FLAG.renew(job.id, "another", raise_lost=True, changed=5)
    assert BULK_FLAG.renew(job.id, token, raise_lost=True, changed=F("changed") + 3)
    assert not BULK_FLAG.finish(job.id, "another")
    assert not BULK_FLAG.fail(job.id, "another", "no")
    job.refresh_from_db()
    assert (job.status, job.changed, job.finished_at) == ("running", 3, None)
    assert job.started_at is not None

    assert BULK_FLAG.finish(job.id, token, last_turn_id=42)
    job.refresh_from_db()
    assert (job.status, job.last_turn_id, job.error) == ("done", 42, "")
    assert job.finished_at is not None
    # Ended: no second end, no claim, no renewal.
    assert not BULK_FLAG.finish(job.id, token)
    assert not BULK_FLAG.fail(job.id, token, "late")
    assert not BULK_FLAG.renew(job.id, token)
    assert BULK_FLAG.claim(job.id) is None
    assert BULK_FLAG.unclaimed(job.id) == "done_already"
    assert BULK_FLAG.unclaimed(10**12) == "done_already"


@pytest.mark.django_db
def test_a_stale_claim_is_taken_over_and_its_old_holder_writes_nothing(settings):
    settings.STUDIO_BULK_FLAG_STALE_SECONDS = 60
    job = _bulk_flag()
    first = BULK_FLAG.claim(job.id)
    backdate(job, field="heartbeat_at", seconds=59)
    assert BULK_FLAG.claim(job.id) is None  # still fresh
    backdate(job, field="heartbeat_at", seconds=61)
    second = BULK_FLAG.claim(job.id)
    assert second not in (None, first)
    assert not BULK_FLAG.renew(job.id, first, changed=1)
    assert not BULK_FLAG.fail(job.id, first, "presumed dead")
    assert BULK_FLAG.fail(job.id, second, "poison")
    job.refresh_from_db()
    assert (job.status, job.error, job.changed) == ("failed", "poison", 0)


@pytest.mark.django_db
def test_a_failure_keeps_at_most_the_one_error_cap_storable():
    job = _bulk_flag()
    token = BULK_FLAG.claim(job.id)
    error = "é" * (ERROR_CAP - 2) + "\x00" + "xyz" + "z" * 100
    assert BULK_FLAG.fail(job.id, token, error)
    job.refresh_from_db()
    # Cut to ERROR_CAP characters first (é... then NUL then "x"), then the NUL dropped.
    assert job.error == "é" * (ERROR_CAP - 2) + "x"
    assert ERROR_CAP == 20_000


@pytest.mark.django_db
def test_a_training_submission_keeps_its_own_statuses_dates_and_cancel():
    job = _training_job()
    token = SUBMISSION.claim(job.id, attempts=F("attempts") + 1)
    job.refresh_from_db()
    # Claimed as uploading; `started_at` waits for the provider to report the job running.
    assert (job.status, job.attempts, job.started_at) == ("uploading", 1, None)
    assert SUBMISSION.unclaimed(job.id) == "busy"
    assert SUBMISSION.release(job.id, token, error="provider down")
    job.refresh_from_db()
    assert (job.status, job.claim_token, job.error) == ("pending", "", "provider down")
    assert not SUBMISSION.renew(job.id, token)

    token = SUBMISSION.claim(job.id, attempts=F("attempts") + 1)
    assert SUBMISSION.finish(job.id, token, remote_job_id="r-1", claim_token="")
    job.refresh_from_db()
    # Submitted is not ended: the job runs on at its provider.
    assert (job.status, job.attempts, job.finished_at) == ("submitted", 2, None)
    assert SUBMISSION.unclaimed(job.id) == "done_already"

    asked = _training_job(cancel_requested=True)
    assert SUBMISSION.claim(asked.id) is None
    backdate(asked, field="created_at", seconds=3600)
    assert asked.id not in SUBMISSION.to_resend()


# -- sending, and the one beat task ---------------------------------------------------------


@needs_redis
def test_a_job_saved_while_the_broker_is_down_runs_once_the_requeue_sends_it(
    broker_switch, settings
):
    settings.STUDIO_REQUEUE_GRACE_SECONDS = 0
    job = _bulk_flag()
    broker_switch.down()
    assert BULK_FLAG.enqueue(job.id) is False
    job.refresh_from_db()
    assert (job.status, job.enqueued_at) == ("pending", None)
    # The beat task itself cannot leave either, and nothing is lost.
    assert jobs.jobs_requeue()["bulk_flag"] == 0
    broker_switch.up()
    jobs_requeue.delay()  # what beat sends every minute
    wait_for_row(job, statuses=JOB_ENDS)
    assert job.status == "done" and job.enqueued_at is not None
    assert BULK_FLAG.requeue() == []  # sent, and ended: nothing waits


@needs_redis
def test_a_cancel_with_the_broker_down_is_logged_not_raised_after_the_commit(broker_switch, caplog):
    caplog.set_level(logging.INFO, logger="studio.queue")
    job = _training_job(status="submitted", remote_job_id="r-1")
    broker_switch.down()
    with transaction.atomic():
        training_services.training_job_cancel(job=job)
    job.refresh_from_db()
    assert job.cancel_requested and job.status == "submitted"
    assert f"{CANCEL_TASK} not sent" in caplog.text


def _probe_chunk() -> ProbeRunChunk:
    run = ProbeRun.objects.create(
        probe_set=ProbeSet.objects.create(name="probes"), endpoint_name="e", model="m"
    )
    return ProbeRunChunk.objects.create(run=run, index=0, first=0, last=1)


@needs_redis
@pytest.mark.django_db
def test_the_one_beat_task_sends_again_each_kind_that_waits(settings):
    import redis

    settings.STUDIO_REQUEUE_GRACE_SECONDS = 0
    batch = recording.batch_create(
        settings=RolloutSettings(policy="scripted", seeds=(0,), steps=3), enqueue=False
    )
    episode = batch.episodes.get()
    episode.enqueued_at = None
    episode.save(update_fields=["enqueued_at"])
    # A person's game is never sent to a worker.
    human = RolloutBatch.objects.create(policy="human", seeds=[1], step_limit=3, image_size=64)
    human.episodes.create(seed=1)
    version = _version()
    waiting = {
        "episode": episode.id,
        "bulk_flag": _bulk_flag().id,
        "export": version.id,
        "import": DatasetImport.objects.create(upload="imports/x.jsonl").id,
        "training_submission": _training_job(version).id,
        # A trl job's run (its job submitted, so not waiting itself).
        "training_local_run": LocalRun.objects.create(
            job=_training_job(version, status="submitted")
        ).id,
        "probe_chunk": _probe_chunk().id,
    }
    queue_purge()
    client = redis.Redis.from_url(REDIS_URL)
    try:
        assert jobs_requeue() == dict.fromkeys(waiting, 1)  # the task, in this process
        raw = {queue: client.lrange(queue, 0, -1) for queue in ("celery", "studio-model", "train")}
    finally:
        queue_purge()
    sent = {}
    for queue, messages in raw.items():
        for message in map(json.loads, messages):
            args = json.loads(base64.b64decode(message["body"]))[0]
            sent[message["headers"]["task"]] = (queue, args)
    kinds = {kind.name: kind for kind in jobs.job_kinds()}
    # A probe question waits on a model: its chunk goes to the model queue; a trl run to the
    # train queue; a scripted episode and the rest to the default one.
    queues = {"probe_chunk": "studio-model", "training_local_run": "train"}
    assert sent == {
        kinds[name].task: (queues.get(name, "celery"), [pk]) for name, pk in waiting.items()
    }
    for name, pk in waiting.items():
        row = kinds[name].model.objects.get(pk=pk)
        assert row.enqueued_at is not None, name
    assert jobs.jobs_requeue() == dict.fromkeys(waiting, 0)  # sent: nothing waits
