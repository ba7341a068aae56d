"""Celery tasks: thin, take an id, call a service. Safe to deliver twice."""

from __future__ import annotations

from celery import shared_task

from rollouts.jobs import BULK_FLAG, EPISODE
from rollouts.recording import services
from rollouts.review import services as services_review


@shared_task(
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=6 * 3600,
    time_limit=6 * 3600 + 120,
    max_retries=None,
)
def episode_run(self, episode_id: int) -> str:
    return EPISODE.run_in_task(self, lambda: services.episode_run(episode_id=episode_id))


@shared_task(acks_late=True, time_limit=300)
def episodes_requeue_stale() -> int:
    # Beat's old entry, kept for messages queued under its name: `studio.tasks.jobs_requeue`.
    return len(EPISODE.requeue())


@shared_task(
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=3 * 3600,
    time_limit=3 * 3600 + 120,
    max_retries=None,
)
def turn_bulk_flag_run(self, job_id: int) -> str:
    return BULK_FLAG.run_in_task(self, lambda: services_review.turn_bulk_flag_run(job_id=job_id))


@shared_task(acks_late=True, time_limit=300)
def turn_bulk_flags_requeue() -> int:
    # Beat's old entry, kept for messages queued under its name: `studio.tasks.jobs_requeue`.
    return len(BULK_FLAG.requeue())
