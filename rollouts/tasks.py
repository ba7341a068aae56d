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
    outcome = services.episode_run(episode_id=episode_id)
    if outcome == "busy":
        # Another worker holds a fresh claim; come back once it would count as stale.
        raise self.retry(countdown=int(EPISODE.stale_after().total_seconds()))
    return outcome


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
    outcome = services_review.turn_bulk_flag_run(job_id=job_id)
    if outcome == "busy":
        # Another worker holds a fresh claim; look again once it would count as stale.
        raise self.retry(countdown=int(BULK_FLAG.stale_after().total_seconds()))
    return outcome


@shared_task(acks_late=True, time_limit=300)
def turn_bulk_flags_requeue() -> int:
    # Beat's old entry, kept for messages queued under its name: `studio.tasks.jobs_requeue`.
    return len(BULK_FLAG.requeue())
