"""Live progress: a model episode's turns, calls and tokens are written as
they happen, so the batch page, the episode's row and its viewer show them within seconds,
not every 64 turns."""

from __future__ import annotations

import time

from django.urls import reverse

from rollouts import selectors
from rollouts.models import Episode, RolloutBatch, Turn
from rollouts.recording import services
from rollouts.rollout_settings import RolloutSettings
from studio.testing import wait_until

CALL_SECONDS = 0.25


def batch_shown(batch_id: int) -> RolloutBatch:
    """The batch as its pages show it: with the calls of its episodes still playing."""
    batch = RolloutBatch.objects.get(id=batch_id)
    selectors.batches_count_playing([batch])
    return batch


def test_a_model_episodes_turns_and_counters_show_within_two_seconds_of_each_call(
    celery_worker, chat_server, chat_endpoint, editor_client
):
    chat_server.delay = CALL_SECONDS
    batch = services.batch_create(
        settings=RolloutSettings(
            policy="openai",
            model="test-vlm",
            endpoint=chat_endpoint.name,
            base_url=chat_endpoint.base_url,
            seeds=(1,),
            steps=200,
        )
    )
    samples = []
    for _ in range(12):  # ~3 s of play, sampled every 0.25 s
        time.sleep(CALL_SECONDS)
        answered = [r.at for r in chat_server.requests]
        episode = Episode.objects.filter(batch=batch).first()
        samples.append(
            (
                time.monotonic(),
                answered,
                Turn.objects.filter(episode__batch=batch).count(),
                episode.model_calls,
                batch_shown(batch.id).model_calls,
            )
        )
    # Each sample: every call answered more than 2 s before it has its turn on disk, and
    # the episode's and the batch's counters have it too (64-turn chunks would show 0).
    for at, answered, turns, episode_calls, batch_calls in samples:
        settled = sum(1 for sent in answered if sent + CALL_SECONDS < at - 2.0)
        assert turns >= settled and episode_calls >= settled and batch_calls >= settled
    assert samples[-1][2] >= 6  # it did play: ~12 calls in 3 s
    episode = Episode.objects.get(batch=batch)
    assert episode.status == Episode.Status.RUNNING and episode.steps >= 6

    # The viewer of the playing episode shows where it stands and asks again every 2 s.
    page = editor_client.get(reverse("rollouts:episode_detail", args=[episode.id])).content.decode()
    assert 'id="episode-live"' in page and 'hx-trigger="every 2s"' in page
    live = editor_client.get(reverse("rollouts:episode_live", args=[episode.id]))
    assert live.status_code == 200
    turns = int(live.content.decode().split('data-turns="')[1].split('"')[0])
    assert turns >= samples[-1][2]

    services.batch_cancel(batch=RolloutBatch.objects.get(id=batch.id))
    wait_until(lambda: not services.batch_episodes_still_playing(batch=batch), timeout=10)
    ended = editor_client.get(reverse("rollouts:episode_live", args=[episode.id])).content.decode()
    assert "hx-trigger" not in ended and "Ended</strong> (canceled)" in ended
