"""Celery tasks: thin, take an id, call a service. Safe to deliver twice."""

from __future__ import annotations

from celery import shared_task

from datasets import services


@shared_task(
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=4 * 3600,
    time_limit=4 * 3600 + 120,
    max_retries=None,
)
def dataset_version_export(self, version_id: int) -> str:
    outcome = services.dataset_version_export(version_id=version_id)
    if outcome == "busy":
        # Another worker holds a fresh claim; look again once it would count as stale.
        raise self.retry(countdown=int(services.STALE_AFTER.total_seconds()))
    return outcome
