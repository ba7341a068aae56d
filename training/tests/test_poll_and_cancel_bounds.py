"""A provider that never stops paging, polls that race for one job, and cancels asked for
again and again while the provider is down: what one poll or one cancel may cost.

Real local provider servers (`servers.py`), the real poll and cancel services, the real
broker: the requests each server saw and the messages the broker holds are counted.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time

import pytest
from django.db import connections
from django.utils import timezone

from studio.testing import queue_drained, queue_purge, wait_for_row, wait_until
from training import services
from training.models import TrainingEvent, TrainingJob
from training.services.polling import poll_lease
from training.tests.servers import Tick
from training.tests.test_provider_hostile import poll, submitted

pytestmark = pytest.mark.django_db(transaction=True)


class EndlessEvents:
    """OpenAI's event list answering every page with one new event and `has_more: true`,
    each page after `delay` seconds; it notes how many pages were asked for at once."""

    def __init__(self, *, delay: float = 0.0) -> None:
        self.delay = delay
        self.pages = 0
        self.asking = 0
        self.most_at_once = 0
        self.lock = threading.Lock()

    def __call__(self, handler, method: str, path: str) -> bool:
        if method != "GET" or not path.endswith("/events"):
            return False
        with self.lock:
            self.pages += 1
            page = self.pages
            self.asking += 1
            self.most_at_once = max(self.most_at_once, self.asking)
        try:
            time.sleep(self.delay)
            event = {
                "id": f"ftevent-endless-{page}",
                "object": "fine_tuning.job.event",
                "created_at": 1_700_000_000,
                "level": "info",
                "message": f"page {page}",
                "type": "message",
                "data": {},
            }
            data = json.dumps({"object": "list", "data": [event], "has_more": True}).encode()
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data)
        finally:
            with self.lock:
                self.asking -= 1
        return True


def running_openai_job(openai_server, train_version) -> TrainingJob:
    openai_server.script = [Tick("running")]
    return submitted(openai_server, train_version, provider="openai")


def test_a_poll_of_endless_event_pages_makes_a_bounded_number_of_requests_and_resumes(
    openai_server, train_version
):
    job = running_openai_job(openai_server, train_version)
    openai_server.override = EndlessEvents()
    before = len(openai_server.requests)
    assert poll(job) == "running"
    # The status, then five pages of events (not the 500 pages the event cap would allow).
    first = openai_server.requests[before:]
    assert len(first) == 6
    assert [r["path"].rsplit("/", 1)[-1] for r in first] == [job.remote_job_id] + ["events"] * 5
    assert sorted(job.events.filter(type="message").values_list("message", flat=True)) == [
        "page 1",
        "page 2",
        "page 3",
        "page 4",
        "page 5",
    ]
    assert (job.status, job.poll_failures) == ("running", 0)
    # The next poll goes on below the last event read, again six requests.
    before = len(openai_server.requests)
    assert poll(job) == "running"
    second = openai_server.requests[before:]
    assert len(second) == 6
    assert second[1]["query"]["after"] == ["ftevent-endless-5"]
    assert job.events.filter(type="message").count() == 10


def test_polls_of_one_job_at_the_same_moment_never_overlap(openai_server, train_version, settings):
    settings.STUDIO_TRAINING_CALL_SECONDS = 2
    # Held for the most requests a poll makes (status, five event pages, metrics), 2 s
    # each, and 30 s more.
    assert poll_lease() == dt.timedelta(seconds=7 * 2 + 30)
    job = running_openai_job(openai_server, train_version)
    endless = EndlessEvents(delay=0.2)
    openai_server.override = endless
    start = threading.Barrier(4)
    outcomes: list[str] = []

    def poll_now() -> None:
        try:
            start.wait(timeout=10)
            outcomes.append(services.training_job_poll(job_id=job.id))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=poll_now) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(outcomes) == ["busy", "busy", "busy", "running"]
    assert endless.most_at_once == 1
    assert endless.pages == 5
    job.refresh_from_db()
    # The poll that ran dated its end: the job is free for the next one.
    assert job.polled_at is not None and job.polled_at <= timezone.now()
    assert services.training_job_poll(job_id=job.id) == "running"


def _queued_messages() -> int:
    from studio.celery import app

    with app.connection_for_write() as conn:
        channel = conn.default_channel
        return sum(channel.queue_declare(name).message_count for name in app.amqp.queues)


def _a_few_minutes_pass(job: TrainingJob) -> None:
    TrainingEvent.objects.filter(job=job, type="studio.cancel_requested").update(
        time=timezone.now() - dt.timedelta(minutes=3)
    )


def test_cancel_asked_again_and_again_queues_one_cancel(synth_server, train_version):
    job = submitted(synth_server, train_version)
    queue_purge()
    try:
        for _ in range(5):
            services.training_job_cancel(job=TrainingJob.objects.get(id=job.id))  # a click
            _a_few_minutes_pass(job)
            services.training_cancels_resend()  # a beat tick
        assert _queued_messages() == 1
    finally:
        queue_purge()


def test_a_cancel_while_the_provider_is_down_is_tried_once_then_backs_off(
    celery_worker, synth_server, train_version
):
    def cancel_down(handler, method: str, path: str) -> bool:
        if method != "POST" or not path.endswith("/cancel"):
            return False
        handler.send_response(503)
        handler.send_header("Content-Length", "0")
        handler.end_headers()
        return True

    job = submitted(synth_server, train_version)
    synth_server.override = cancel_down
    for _ in range(3):
        services.training_job_cancel(job=TrainingJob.objects.get(id=job.id))
    wait_until(lambda: synth_server.calls("POST", "/cancel"), timeout=30, what="a cancel")
    queue_drained()
    # One request: neither a task per click nor the client's own retries.
    assert len(synth_server.calls("POST", "/cancel")) == 1
    job.refresh_from_db()
    assert job.status == "submitted" and job.cancel_tries == 1
    # The first back-off is 15 s: the beat task sends nothing meanwhile.
    assert 10 < (job.cancel_held_until - timezone.now()).total_seconds() <= 15
    _a_few_minutes_pass(job)
    assert services.training_cancels_resend() == 0
    # The back-off passed, the provider is back: the next tick sends the cancel, once.
    TrainingJob.objects.filter(id=job.id).update(cancel_held_until=timezone.now())
    synth_server.override = None
    assert services.training_cancels_resend() == 1
    job = wait_for_row(job, statuses=("canceled",), timeout=30)
    assert len(synth_server.calls("POST", "/cancel")) == 2
    assert services.training_cancels_resend() == 0
