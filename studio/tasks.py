"""Celery tasks of the studio itself: thin, and safe to run twice."""

from __future__ import annotations

from celery import shared_task

from studio import jobs


@shared_task(name="studio.tasks.jobs_requeue", acks_late=True, time_limit=300)
def jobs_requeue() -> dict[str, int]:
    # The one beat entry for every job kind: sends again what a dead worker left or what
    # never reached the broker (each kind's `requeue`).
    with jobs.outage_said_in_one_line("studio.tasks.jobs_requeue"):
        return jobs.jobs_requeue()
    return {}
