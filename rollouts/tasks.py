"""Celery tasks: thin, take an id, call a service. Safe to deliver twice."""

from __future__ import annotations

from rollouts.jobs import BULK_FLAG, EPISODE
from rollouts.recording import services
from rollouts.review import services as services_review
from studio.jobs import JobOutcome, job_task


@job_task(EPISODE)
def episode_run(episode_id: int) -> JobOutcome:
    return services.episode_run(episode_id=episode_id)


@job_task(BULK_FLAG)
def turn_bulk_flag_run(job_id: int) -> JobOutcome:
    return services_review.turn_bulk_flag_run(job_id=job_id)
