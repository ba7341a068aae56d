"""Celery tasks: thin, take an id, call a service. Safe to deliver twice."""

from __future__ import annotations

from celery import shared_task

from rollouts.jobs import BULK_FLAG, EPISODE
from rollouts.recording import services
from rollouts.review import services as services_review
from studio.jobs import is_outage, retry_after_outage


@shared_task(
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=6 * 3600,
    time_limit=6 * 3600 + 120,
    max_retries=None,
)
def episode_run(self, episode_id: int) -> str:
    try:
        outcome = services.episode_run(episode_id=episode_id)
    except Exception as exc:
        if not is_outage(exc):
            raise
        # The database or the broker is down (the claim could not be made): try again soon.
        raise retry_after_outage(self, exc) from exc
    if outcome == "retry":
        # The episode lost the database or the broker mid-game: it resumes from its last
        # recorded turn once they answer.
        raise retry_after_outage(self)
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
    try:
        outcome = services_review.turn_bulk_flag_run(job_id=job_id)
    except Exception as exc:
        if not is_outage(exc):
            raise
        # The database or the broker is down: go on from the last chunk once it is back.
        raise retry_after_outage(self, exc) from exc
    if outcome == "busy":
        # Another worker holds a fresh claim; look again once it would count as stale.
        raise self.retry(countdown=int(BULK_FLAG.stale_after().total_seconds()))
    return outcome


@shared_task(acks_late=True, time_limit=300)
def turn_bulk_flags_requeue() -> int:
    # Beat's old entry, kept for messages queued under its name: `studio.tasks.jobs_requeue`.
    return len(BULK_FLAG.requeue())
