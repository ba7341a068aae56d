"""A worker starting under the name of one that held running jobs takes them over at once
(`studio.jobs.take_over_all`, run when a worker is ready), and claims record the
worker's name; the rest stay with their own workers."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from rollouts.models import Episode
from rollouts.recording import services
from rollouts.rollout_settings import RolloutSettings
from studio import claim_keeper, jobs
from studio.testing import queue_purge


@pytest.mark.django_db(transaction=True)
def test_a_restarted_worker_takes_over_what_its_predecessor_held_and_nothing_else(settings):
    batch = services.batch_create(
        settings=RolloutSettings(policy="scripted", seeds=(0, 1, 2), steps=5), enqueue=False
    )
    gone, other, pending = batch.episodes.order_by("seed")
    for episode in (gone, other):
        assert services.episode_claim(episode_id=episode.id)
    # A claim records the name of the process that made it (here, this one's host and pid).
    assert Episode.objects.get(id=gone.id).worker == claim_keeper.worker_name()
    Episode.objects.filter(id=gone.id).update(worker="celery@restarted")
    Episode.objects.filter(id=other.id).update(worker="celery@alive")

    try:
        taken = jobs.take_over_all("celery@restarted")
        # Every kind with a keeper looked (probe chunks too); one episode was that worker's.
        assert taken["episode"] == 1 and taken["probe_chunk"] == 0
        now = timezone.now()
        gone, other, pending = Episode.objects.filter(batch=batch).order_by("seed")
        stale = now - timedelta(seconds=settings.STUDIO_EPISODE_STALE_SECONDS)
        assert gone.heartbeat_at < stale and gone.lost_worker_at is not None
        assert gone.enqueued_at is not None  # sent again at once
        # What another worker holds, or nobody yet, is left alone.
        assert other.heartbeat_at > stale and other.lost_worker_at is None
        assert (pending.status, pending.lost_worker_at) == ("pending", None)
    finally:
        queue_purge()
