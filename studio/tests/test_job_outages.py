"""Job kinds and outages: a claim kept alive through a silent phase, a job never
failed for a lost database connection, and the broker's lost messages sent again at once."""

from __future__ import annotations

import time

import psycopg
import pytest
import redis
from django.db import OperationalError

from curation.jobs import EXPORT
from curation.models import Dataset, DatasetVersion
from rollouts.jobs import BULK_FLAG
from rollouts.models import TurnBulkFlag
from rollouts.tests.helpers import REDIS_URL, needs_redis
from studio import jobs, queue
from studio.testing import backdate, queue_purge

pytestmark = pytest.mark.django_db(transaction=True)


def _version() -> DatasetVersion:
    return DatasetVersion.objects.create(dataset=Dataset.objects.create(name="d"), number=1)


def test_a_kept_claim_stays_fresh_through_a_silent_phase_and_goes_stale_after(settings):
    settings.STUDIO_EXPORT_STALE_SECONDS = 1
    version = _version()
    token = EXPORT.claim(version.id)
    assert token is not None
    with EXPORT.kept(version.id, token):
        time.sleep(2.5)  # two and a half stale windows without a word from the job
        assert EXPORT.claim(version.id) is None  # still its own: renewed meanwhile
        assert EXPORT.unclaimed(version.id) == "busy"
    time.sleep(1.5)  # no longer kept: it goes stale, another worker may take it
    assert EXPORT.claim(version.id) is not None


def test_a_lost_connection_fails_no_job_it_gives_the_claim_back_and_raises_again():
    flag = TurnBulkFlag.objects.create(filters={}, flagged=True)
    token = BULK_FLAG.claim(flag.id)
    lost = OperationalError("terminating connection due to administrator command")
    with pytest.raises(OperationalError):
        try:
            raise lost
        except Exception:  # a service's catch-all around the job's work
            BULK_FLAG.fail(flag.id, token, "terminating connection")
    flag.refresh_from_db()
    assert (flag.status, flag.claim_token, flag.error) == ("pending", "", "")
    # A poison job still fails.
    token = BULK_FLAG.claim(flag.id)
    try:
        raise ValueError("a filter that cannot be read")
    except Exception:
        assert BULK_FLAG.fail(flag.id, token, "a filter that cannot be read")
    flag.refresh_from_db()
    assert (flag.status, flag.error) == ("failed", "a filter that cannot be read")


def test_outages_are_told_from_poison_through_the_exceptions_they_caused():
    try:
        try:
            raise redis.exceptions.ConnectionError("Connection closed by server.")
        except redis.exceptions.ConnectionError as exc:
            raise RuntimeError("the limiter could not take a slot") from exc
    except RuntimeError as exc:
        assert jobs.is_outage(exc)
    assert not jobs.is_outage(ValueError("bad"))
    # The server answering with an error of its own is no outage; the server going away is.
    for error, outage in (
        (psycopg.errors.QueryCanceled("canceling statement due to statement timeout"), False),
        (psycopg.errors.DiskFull("could not extend file"), False),
        (psycopg.errors.AdminShutdown("terminating connection"), True),
        (psycopg.OperationalError("server closed the connection unexpectedly"), True),
    ):
        try:
            raise OperationalError(str(error)) from error  # as Django wraps it
        except OperationalError as exc:
            assert jobs.is_outage(exc) is outage, error
    # 1, 2, 4, ... seconds, at most OUTAGE_COUNTDOWN_MAX, shortened by up to a quarter.
    for retries, full in ((0, 1), (1, 2), (3, 8), (5, 20), (40, 20)):
        assert 0.75 * full <= jobs.outage_countdown(retries) <= full


@needs_redis
def test_every_job_sent_is_sent_again_once_the_broker_has_lost_its_messages(settings):
    settings.STUDIO_REQUEUE_GRACE_SECONDS = 30
    flag = TurnBulkFlag.objects.create(filters={}, flagged=True)
    queue_purge()
    assert BULK_FLAG.enqueue(flag.id)
    client = redis.Redis.from_url(REDIS_URL)
    client.set(queue.BROKER_MARK, "1")
    try:
        # Sent a moment ago, and held: nothing to send again.
        assert jobs.jobs_requeue()["bulk_flag"] == 0
        backdate(flag, field="enqueued_at", seconds=120)
        assert jobs.jobs_requeue()["bulk_flag"] == 0  # long queues are not lost ones
        # Redis restarted without persistence: its messages and the mark are gone. A row
        # sent a second ago is sent again too (its message may have gone with the others).
        queue_purge()
        client.delete(queue.BROKER_MARK)
        backdate(flag, field="enqueued_at", seconds=1)
        assert jobs.jobs_requeue()["bulk_flag"] == 1
        assert client.get(queue.BROKER_MARK) == b"1"
        assert jobs.jobs_requeue()["bulk_flag"] == 0  # once
    finally:
        queue_purge()


@needs_redis
def test_the_requeue_does_not_wait_behind_a_batchs_messages(settings):
    """A worker busy with a batch takes the requeue at its next free thread: it has a queue of
    its own, which every worker consumes (here the test worker, one thread)."""
    from rollouts.jobs import EPISODE
    from rollouts.recording import services as recording
    from rollouts.rollout_settings import RolloutSettings
    from studio.celery import app
    from studio.testing import celery_worker_running

    assert app.amqp.router.route({}, "studio.tasks.jobs_requeue")["queue"].name == (
        settings.STUDIO_CONTROL_QUEUE
    )
    batch = recording.batch_create(
        settings=RolloutSettings(policy="scripted", seeds=tuple(range(40)), steps=30),
        enqueue=False,
    )
    client = redis.Redis.from_url(REDIS_URL)
    with celery_worker_running(concurrency=1):
        EPISODE.enqueue_many(list(batch.episodes.values_list("id", flat=True)))
        app.send_task("studio.tasks.jobs_requeue")
        deadline = time.monotonic() + 60
        while client.llen(settings.STUDIO_CONTROL_QUEUE):
            assert time.monotonic() < deadline, "the requeue was never taken"
            time.sleep(0.05)
        waiting = client.llen("celery")
    # Taken after at most the episode in hand and the next one, not after the 40.
    assert waiting >= 35, waiting
