"""A dead broker: work is saved, the user reads one line, and it completes once it is back."""

from __future__ import annotations

import time

import pytest
from django.urls import reverse

from curation.tests.conftest import run
from rollouts.jobs import EPISODE
from rollouts.models import Episode, RolloutBatch, Turn
from rollouts.tasks import episode_run
from rollouts.tests.helpers import BATCH_ENDS
from studio.tasks import jobs_requeue
from studio.testing import queue_drained, wait_for_row

UNREACHABLE = "the task queue is unreachable; the batch will start when it is back"


def _comes_back_and_completes(broker_switch, batch_id: int, *, episodes: int, steps: int):
    batch = RolloutBatch.objects.get(id=batch_id)
    assert batch.status == "pending"
    assert list(batch.episodes.order_by().values_list("status", "enqueued_at").distinct()) == [
        ("pending", None)
    ]
    time.sleep(0.5)  # the worker is up, but no message reached it
    assert batch.episodes.filter(status="pending").count() == episodes
    broker_switch.up()
    jobs_requeue.delay()  # what beat sends every minute
    batch = wait_for_row(RolloutBatch, batch_id, statuses=BATCH_ENDS, timeout=120)
    assert batch.status == "finished"
    assert (batch.episodes_finished, batch.episodes_failed) == (episodes, 0)
    # The original messages arriving late (or twice) play nothing again.
    for episode_id in batch.episodes.values_list("id", flat=True):
        episode_run.delay(episode_id)
    jobs_requeue.delay()
    queue_drained()
    batch.refresh_from_db()
    assert (batch.episodes_finished, batch.episodes_failed) == (episodes, 0)
    assert set(batch.episodes.values_list("attempts", "steps")) == {(1, steps)}
    assert Turn.objects.filter(episode__batch=batch).count() == episodes * steps


@pytest.fixture
def requeue_at_once(settings):
    settings.STUDIO_REQUEUE_GRACE_SECONDS = 0


def test_it_saves_a_rollout_says_one_line_and_runs_it_when_the_broker_is_back(
    broker_switch, requeue_at_once
):
    broker_switch.down()
    started = time.monotonic()
    result = run("rollout", "--policy", "scripted", "--seeds", "0-2", "--steps", "6")
    assert time.monotonic() - started < 10
    assert result.code == 0
    assert result.stderr == UNREACHABLE + "\n"
    summary = result.summary
    assert summary["episodes"] == 3 and summary["finished"] == 0
    _comes_back_and_completes(broker_switch, summary["batch_id"], episodes=3, steps=6)


def test_it_saves_a_batch_from_the_form_and_runs_it_when_the_broker_is_back(
    broker_switch, requeue_at_once, editor_client
):
    broker_switch.down()
    response = editor_client.post(
        reverse("rollouts:batch_create"),
        {
            "policy": "scripted",
            "seeds": "4-5",
            "steps": 5,
            "image_size": 64,
            "concurrency": 1,
            "history_frames": 0,
            "actions": "move_right do",
        },
        follow=True,
    )
    assert response.status_code == 200
    batch = RolloutBatch.objects.get()
    assert response.redirect_chain[-1][0] == reverse("rollouts:batch_detail", args=[batch.id])
    assert f"Batch {batch.id} saved, but {UNREACHABLE}." in response.content.decode()
    _comes_back_and_completes(broker_switch, batch.id, episodes=2, steps=5)


def test_it_requeues_only_what_waits(broker_switch, requeue_at_once):
    """Sent and pending within the hour: not sent again (a long queue is not a lost one)."""
    result = run("rollout", "--policy", "scripted", "--seeds", "0", "--steps", "3", "--wait")
    assert result.code == 0 and result.stderr == ""
    episode = Episode.objects.get()
    assert episode.enqueued_at is not None and episode.attempts == 1
    assert EPISODE.requeue() == []


def test_it_never_sends_an_inline_batch_to_workers(broker_switch, requeue_at_once):
    """`--inline` plays in its own process: the requeue must not hand its episodes out."""
    from rollouts.recording import services
    from rollouts.rollout_settings import RolloutSettings

    batch = services.batch_create(
        settings=RolloutSettings(policy="scripted", seeds=(0, 1), steps=3), enqueue=False
    )
    assert EPISODE.requeue() == []
    assert set(batch.episodes.values_list("status", flat=True)) == {"pending"}
